// load_model_file: a .gguf file or a Hugging Face folder (config.json + *.safetensors), checked
// against the tensors its configuration needs.
#include "pagedattn/model_file.h"

#include <algorithm>
#include <cfloat>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>

#include "pagedattn/error.h"
#include "pagedattn/gguf.h"

namespace pagedattn {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

std::string read_text(const fs::path& p) {
  std::ifstream in(p, std::ios::binary);
  PA_CHECK(in, "load_model_file: cannot open ", p.string());
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// An integer field of config.json (default when absent or null).
int32_t get_int(const json& j, const char* key, int64_t dflt, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return int32_t(dflt);
  PA_CHECK(j[key].is_number_integer() && j[key].get<int64_t>() >= 0 &&
               j[key].get<int64_t>() < (int64_t(1) << 31),
           "load_model_file: ", file, ": key '", key, "' must be a non-negative integer, got ",
           j[key].dump());
  return int32_t(j[key].get<int64_t>());
}
// NOTE: a float field must fit in a float: 1e39 would become inf (and inf RoPE or norm constants
// turn every output into NaN).
float get_float(const json& j, const char* key, double dflt, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return float(dflt);
  PA_CHECK(j[key].is_number() && std::abs(j[key].get<double>()) <= FLT_MAX, "load_model_file: ",
           file, ": key '", key, "' must be a finite number, got ", j[key].dump());
  return j[key].get<float>();
}
std::string get_string(const json& j, const char* key, const std::string& dflt,
                       const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  PA_CHECK(j[key].is_string(), "load_model_file: ", file, ": key '", key,
           "' must be a string, got ", j[key].dump());
  return j[key].get<std::string>();
}
bool get_bool(const json& j, const char* key, bool dflt, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) return dflt;
  PA_CHECK(j[key].is_boolean(), "load_model_file: ", file, ": key '", key,
           "' must be true or false, got ", j[key].dump());
  return j[key].get<bool>();
}

std::string architecture_of(const json& j, const std::string& file) {
  static const std::pair<const char*, const char*> kArch[] = {
      {"LlamaForCausalLM", "llama"}, {"MistralForCausalLM", "mistral"},
      {"Qwen2ForCausalLM", "qwen2"}, {"Qwen3ForCausalLM", "qwen3"}};
  std::string named;
  if (j.contains("architectures") && j["architectures"].is_array() && !j["architectures"].empty() &&
      j["architectures"][0].is_string()) {
    named = j["architectures"][0].get<std::string>();
    for (const auto& [hf, ours] : kArch)
      if (named == hf) return ours;
  }
  if (j.contains("model_type") && j["model_type"].is_string()) {
    const std::string mt = j["model_type"].get<std::string>();
    for (const auto& [hf, ours] : kArch)
      if (mt == ours) return ours;
    if (named.empty()) named = mt;
  }
  fail("load_model_file: ", file, ": key 'architectures': unsupported architecture '", named,
       "' (supported: LlamaForCausalLM, MistralForCausalLM, Qwen2ForCausalLM, Qwen3ForCausalLM)");
}

// "[a, b]" without a tensor of that shape (a hostile config's shape may not fit in memory).
std::string shape_text(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? ", " : "") + std::to_string(shape[i]);
  return s + "]";
}

void expect_shape(const ModelFile& mf, const std::string& name, std::vector<int64_t> shape) {
  if (auto w = mf.weights.find(name); w != mf.weights.end()) {
    PA_CHECK(w->second.shape == shape, "load_model_file: ", mf.path, ": tensor '", name,
             "' has shape ", shape_text(w->second.shape), ", the config needs ",
             shape_text(shape));
    return;
  }
  auto it = mf.tensors.find(name);
  PA_CHECK(it != mf.tensors.end(), "load_model_file: ", mf.path, ": missing tensor '", name, "'");
  PA_CHECK(it->second.shape() == shape, "load_model_file: ", mf.path, ": tensor '", name,
           "' has shape ", it->second.shape_str(), ", the config needs ", shape_text(shape));
}

}  // namespace

ModelConfig parse_hf_config(const std::string& text, const std::string& file) {
  json j;
  try {
    j = json::parse(text);
  } catch (const json::exception& e) {
    fail("load_model_file: ", file, ": not valid JSON: ", e.what());
  }
  PA_CHECK(j.is_object(), "load_model_file: ", file, ": not a JSON object");
  ModelConfig c;
  c.architecture = architecture_of(j, file);
  c.vocab_size = get_int(j, "vocab_size", 0, file);
  c.hidden_size = get_int(j, "hidden_size", 0, file);
  c.intermediate_size = get_int(j, "intermediate_size", 0, file);
  c.num_layers = get_int(j, "num_hidden_layers", 0, file);
  c.num_q_heads = get_int(j, "num_attention_heads", 0, file);
  for (auto [v, key] : {std::pair{c.vocab_size, "vocab_size"}, {c.hidden_size, "hidden_size"},
                        {c.intermediate_size, "intermediate_size"},
                        {c.num_layers, "num_hidden_layers"}, {c.num_q_heads, "num_attention_heads"}})
    PA_CHECK(v > 0, "load_model_file: ", file, ": key '", key, "' is missing or zero");
  c.num_kv_heads = get_int(j, "num_key_value_heads", c.num_q_heads, file);
  c.head_dim = get_int(j, "head_dim", c.hidden_size / c.num_q_heads, file);
  PA_CHECK(c.num_kv_heads > 0 && c.num_q_heads % c.num_kv_heads == 0 && c.head_dim > 0,
           "load_model_file: ", file, ": key 'num_key_value_heads' = ", c.num_kv_heads,
           " does not divide num_attention_heads = ", c.num_q_heads);
  c.rms_norm_eps = get_float(j, "rms_norm_eps", 1e-6, file);
  PA_CHECK(c.rms_norm_eps >= 0, "load_model_file: ", file, ": key 'rms_norm_eps' must be >= 0, got ",
           c.rms_norm_eps);
  c.rope_theta = get_float(j, "rope_theta", 10000.0, file);
  // transformers >= 5 writes rope_theta and the scaling under 'rope_parameters'.
  const bool rope_params = !j.contains("rope_scaling") && j.contains("rope_parameters") &&
                           j["rope_parameters"].is_object();
  if (rope_params) c.rope_theta = get_float(j["rope_parameters"], "rope_theta", c.rope_theta, file);
  PA_CHECK(c.rope_theta > 0, "load_model_file: ", file, ": key 'rope_theta' must be > 0, got ",
           c.rope_theta);
  const char* rope_key = rope_params ? "rope_parameters" : "rope_scaling";
  c.max_position_embeddings = get_int(j, "max_position_embeddings", 2048, file);
  PA_CHECK(c.max_position_embeddings > 0, "load_model_file: ", file,
           ": key 'max_position_embeddings' must be > 0");
  c.tie_word_embeddings = get_bool(j, "tie_word_embeddings", false, file);
  c.attention_bias = c.architecture == "qwen2" || get_bool(j, "attention_bias", false, file);
  c.qk_norm = c.architecture == "qwen3";
  const bool use_sw = get_bool(j, "use_sliding_window", c.architecture == "mistral", file);
  c.sliding_window = use_sw ? get_int(j, "sliding_window", 0, file) : 0;
  if (j.contains(rope_key) && !j[rope_key].is_null()) {
    const json& rs = j[rope_key];
    PA_CHECK(rs.is_object(), "load_model_file: ", file, ": key 'rope_scaling' must be an object");
    const std::string type =
        get_string(rs, "rope_type", get_string(rs, "type", "default", file), file);
    if (type == "llama3") {
      c.rope_scaling.type = "llama3";
      c.rope_scaling.factor = get_float(rs, "factor", 8.0, file);
      c.rope_scaling.low_freq_factor = get_float(rs, "low_freq_factor", 1.0, file);
      c.rope_scaling.high_freq_factor = get_float(rs, "high_freq_factor", 4.0, file);
      c.rope_scaling.original_max_position =
          get_int(rs, "original_max_position_embeddings", 8192, file);
      PA_CHECK(c.rope_scaling.factor > 0 &&
                   c.rope_scaling.high_freq_factor > c.rope_scaling.low_freq_factor,
               "load_model_file: ", file, ": key 'rope_scaling': inconsistent llama3 factors");
    } else if (type == "linear") {
      c.rope_scaling.type = "linear";
      c.rope_scaling.factor = get_float(rs, "factor", 1.0, file);
      PA_CHECK(c.rope_scaling.factor > 0, "load_model_file: ", file,
               ": key 'rope_scaling': linear factor must be > 0, got ", c.rope_scaling.factor);
    } else if (type == "yarn") {
      // transformers' defaults: the pretraining context is the config's original_max_position_
      // embeddings (Phi-3 keeps it outside the scaling), else the scaling's, else
      // max_position_embeddings; without a factor, max_position_embeddings over it.
      RopeScaling& y = c.rope_scaling;
      y.type = "yarn";
      y.original_max_position = get_int(
          j, "original_max_position_embeddings",
          get_int(rs, "original_max_position_embeddings", c.max_position_embeddings, file), file);
      const bool has_factor = rs.contains("factor") && !rs["factor"].is_null();
      y.factor = has_factor ? float(get_float(rs, "factor", 1.0, file))
                            : float(c.max_position_embeddings) / float(y.original_max_position);
      auto optional = [&](const char* key, float dflt) {
        return rs.contains(key) && !rs[key].is_null() ? float(get_float(rs, key, dflt, file))
                                                      : dflt;
      };
      y.beta_fast = optional("beta_fast", 32.f);
      y.beta_slow = optional("beta_slow", 1.f);
      y.attention_factor = optional("attention_factor", 0.f);
      y.mscale = optional("mscale", 0.f);
      y.mscale_all_dim = optional("mscale_all_dim", 0.f);
      y.truncate = get_bool(rs, "truncate", true, file);
      PA_CHECK(y.factor > 0 && y.original_max_position > 0 && y.beta_fast > 0 &&
                   y.beta_slow > 0 && y.attention_factor >= 0,
               "load_model_file: ", file, ": key 'rope_scaling': yarn needs factor, beta_fast, "
               "beta_slow and original_max_position_embeddings > 0 and attention_factor >= 0");
    } else {
      PA_CHECK(type == "default", "load_model_file: ", file,
               ": key 'rope_scaling': unsupported rope_type '", type,
               "' (supported: linear, llama3, yarn)");
    }
  }
  c.bos_token_id = get_int(j, "bos_token_id", -1, file);
  if (j.contains("eos_token_id") && j["eos_token_id"].is_array()) {
    for (const auto& e : j["eos_token_id"]) {
      PA_CHECK(e.is_number_integer() && e.get<int64_t>() >= 0 &&
                   e.get<int64_t>() < (int64_t(1) << 31),
               "load_model_file: ", file, ": key 'eos_token_id' holds ", e.dump(),
               " (token ids are non-negative 32-bit integers)");
      c.eos_token_ids.push_back(e.get<int32_t>());
    }
  } else if (int32_t eos = get_int(j, "eos_token_id", -1, file); eos >= 0) {
    c.eos_token_ids.push_back(eos);
  }
  return c;
}

void check_model_tensors(ModelFile& mf) {
  const ModelConfig& c = mf.config;
  const int64_t h = c.hidden_size, q = int64_t(c.num_q_heads) * c.head_dim,
                kv = int64_t(c.num_kv_heads) * c.head_dim;
  std::set<std::string> used;
  auto need = [&](const std::string& name, std::vector<int64_t> shape) {
    expect_shape(mf, name, std::move(shape));
    used.insert(name);
  };
  need("model.embed_tokens.weight", {c.vocab_size, h});
  need("model.norm.weight", {h});
  if (!c.tie_word_embeddings) need("lm_head.weight", {c.vocab_size, h});
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    need(p + "input_layernorm.weight", {h});
    need(p + "post_attention_layernorm.weight", {h});
    need(p + "self_attn.q_proj.weight", {q, h});
    need(p + "self_attn.k_proj.weight", {kv, h});
    need(p + "self_attn.v_proj.weight", {kv, h});
    need(p + "self_attn.o_proj.weight", {h, q});
    if (c.attention_bias) {
      need(p + "self_attn.q_proj.bias", {q});
      need(p + "self_attn.k_proj.bias", {kv});
      need(p + "self_attn.v_proj.bias", {kv});
    }
    if (c.qk_norm) {
      need(p + "self_attn.q_norm.weight", {c.head_dim});
      need(p + "self_attn.k_norm.weight", {c.head_dim});
    }
    need(p + "mlp.gate_proj.weight", {c.intermediate_size, h});
    need(p + "mlp.up_proj.weight", {c.intermediate_size, h});
    need(p + "mlp.down_proj.weight", {h, c.intermediate_size});
  }
  for (auto it = mf.tensors.begin(); it != mf.tensors.end();)
    it = used.count(it->first) ? std::next(it) : mf.tensors.erase(it);
  for (auto it = mf.weights.begin(); it != mf.weights.end();)
    it = used.count(it->first) ? std::next(it) : mf.weights.erase(it);
}

namespace {

ModelFile load_hf_folder(const fs::path& dir, WeightFormat format) {
  ModelFile mf;
  mf.path = dir.string();
  const fs::path cfg = dir / "config.json";
  PA_CHECK(fs::exists(cfg), "load_model_file: ", mf.path, ": no config.json in the folder");
  mf.config = parse_hf_config(read_text(cfg), cfg.string());

  std::vector<fs::path> files;
  const fs::path index = dir / "model.safetensors.index.json";
  if (fs::exists(index)) {
    json j;
    try {
      j = json::parse(read_text(index));
    } catch (const json::exception& e) {
      fail("load_model_file: ", index.string(), ": not valid JSON: ", e.what());
    }
    PA_CHECK(j.contains("weight_map") && j["weight_map"].is_object(), "load_model_file: ",
             index.string(), ": key 'weight_map' missing");
    std::set<std::string> names;
    for (const auto& v : j["weight_map"]) {
      PA_CHECK(v.is_string() && v.get<std::string>().find('/') == std::string::npos,
               "load_model_file: ", index.string(), ": bad file name ", v.dump(), " in 'weight_map'");
      names.insert(v.get<std::string>());
    }
    for (const auto& n : names) files.push_back(dir / n);
  } else {
    for (const auto& e : fs::directory_iterator(dir))
      if (e.path().extension() == ".safetensors") files.push_back(e.path());
    std::sort(files.begin(), files.end());
  }
  PA_CHECK(!files.empty(), "load_model_file: ", mf.path, ": no .safetensors files in the folder");
  for (const auto& f : files) {
    for (auto& [name, t] : load_safetensors(f.string(), format == WeightFormat::stored)) {
      PA_CHECK(!mf.tensors.count(name), "load_model_file: ", f.string(), ": tensor '", name,
               "' appears in more than one file");
      mf.tensors.emplace(name, std::move(t));
    }
  }
  if (mf.config.tie_word_embeddings) mf.tensors.erase("lm_head.weight");
  else if (!mf.tensors.count("lm_head.weight")) mf.config.tie_word_embeddings = true;
  return mf;
}

}  // namespace

ModelFile load_model_file(const std::string& path, WeightFormat format) {
  PA_CHECK(fs::exists(path), "load_model_file: ", path, " does not exist");
  ModelFile mf = fs::is_directory(path) ? load_hf_folder(path, format) : load_gguf_model(path, format);
  check_model_tensors(mf);
  return mf;
}

void dequantize_block(const FileWeight& w, int64_t row0, int64_t rows, int64_t col0, int64_t cols,
                      float* out) {
  PA_CHECK(w.shape.size() == 2, "dequantize_block: the weight is not a matrix");
  const int64_t whole_rows = w.shape[0], whole_cols = w.shape[1];
  PA_CHECK(row0 >= 0 && rows >= 0 && row0 + rows <= whole_rows && col0 >= 0 && cols >= 0 &&
               col0 + cols <= whole_cols,
           "dequantize_block: rows [", row0, ", ", row0 + rows, ") and columns [", col0, ", ",
           col0 + cols, ") are outside the weight's [", whole_rows, ", ", whole_cols, "]");
  const GGMLType type = GGMLType(w.ggml_type);
  const int64_t bs = ggml_block_size(type), bb = ggml_block_bytes(type);
  const bool edges = col0 % bs == 0 && cols % bs == 0;
  std::vector<float> row(edges ? 0 : size_t(whole_cols));
  for (int64_t r = 0; r < rows; ++r) {
    const uint8_t* src = w.data.get() + w.file_row(row0 + r) * w.row_bytes;
    float* dst = out + r * cols;
    if (edges) {
      dequantize_row(type, src + col0 / bs * bb, dst, cols);
    } else {
      dequantize_row(type, src, row.data(), whole_cols);
      std::copy(row.begin() + col0, row.begin() + col0 + cols, dst);
    }
  }
}

ModelFile with_f32_weights(const ModelFile& file) {
  ModelFile out;
  out.path = file.path;
  out.config = file.config;
  out.tensors = file.tensors;
  for (const auto& [name, w] : file.weights) {
    Tensor t = Tensor::empty(w.shape, DType::f32);
    const int64_t rows = w.shape[0], cols = w.shape[1];
    for (int64_t r = 0; r < rows; ++r)
      dequantize_row(GGMLType(w.ggml_type), w.data.get() + w.file_row(r) * w.row_bytes,
                     t.data_as<float>() + r * cols, cols);
    out.tensors.emplace(name, std::move(t));
  }
  return out;
}

}  // namespace pagedattn
