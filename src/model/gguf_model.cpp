// A GGUF file as a ModelFile: llama.cpp's metadata keys to ModelConfig, its tensor names to Hugging
// Face names, and its q/k row permutation undone for llama-arch files.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstring>

#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "pagedattn/model_file.h"

namespace pagedattn {

namespace {

// GGUF tensor name (after "blk.N.") -> Hugging Face name (after "model.layers.N.").
struct LayerName {
  const char* gguf;
  const char* hf;
};
constexpr LayerName kLayerNames[] = {
    {"attn_norm.weight", "input_layernorm.weight"},
    {"ffn_norm.weight", "post_attention_layernorm.weight"},
    {"attn_q.weight", "self_attn.q_proj.weight"},
    {"attn_k.weight", "self_attn.k_proj.weight"},
    {"attn_v.weight", "self_attn.v_proj.weight"},
    {"attn_output.weight", "self_attn.o_proj.weight"},
    {"attn_q.bias", "self_attn.q_proj.bias"},
    {"attn_k.bias", "self_attn.k_proj.bias"},
    {"attn_v.bias", "self_attn.v_proj.bias"},
    {"attn_q_norm.weight", "self_attn.q_norm.weight"},
    {"attn_k_norm.weight", "self_attn.k_norm.weight"},
    {"ffn_gate.weight", "mlp.gate_proj.weight"},
    {"ffn_up.weight", "mlp.up_proj.weight"},
    {"ffn_down.weight", "mlp.down_proj.weight"},
};

// The Hugging Face name of a GGUF tensor, or "" for tensors the runtime does not use.
std::string hf_name(const std::string& name) {
  if (name == "token_embd.weight") return "model.embed_tokens.weight";
  if (name == "output_norm.weight") return "model.norm.weight";
  if (name == "output.weight") return "lm_head.weight";
  if (name.rfind("blk.", 0) != 0) return "";
  const size_t dot = name.find('.', 4);
  if (dot == std::string::npos || dot == 4) return "";
  const std::string layer = name.substr(4, dot - 4);
  for (char ch : layer)
    if (ch < '0' || ch > '9') return "";
  const std::string rest = name.substr(dot + 1);
  for (const auto& ln : kLayerNames)
    if (rest == ln.gguf) return "model.layers." + layer + "." + ln.hf;
  return "";
}

// llama.cpp's converter reorders each head's rows of q_proj/k_proj from rotate_half layout
// (first half, second half) to interleaved pairs: GGUF row 2j + i of a head is HF row i * half + j.
// t: [n_heads * head_dim, in] rows in GGUF order, rewritten in HF order.
void unpermute_rows(Tensor& t, int32_t n_heads, const std::string& file, const std::string& name) {
  PA_CHECK(t.ndim() == 2 && n_heads > 0 && t.dim(0) % (2 * int64_t(n_heads)) == 0, "load_model_file: ",
           file, ": tensor '", name, "' of shape ", t.shape_str(), " does not split into ", n_heads,
           " heads of even size");
  const int64_t head_dim = t.dim(0) / n_heads, half = head_dim / 2, cols = t.dim(1);
  Tensor out = Tensor::empty(t.shape(), DType::f32);
  const float* src = t.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < half; ++j) {
        const float* s = src + (h * head_dim + 2 * j + i) * cols;
        std::copy(s, s + cols, dst + (h * head_dim + i * half + j) * cols);
      }
  t = std::move(out);
}

// Llama-3 rope scaling is stored in GGUF as per-frequency factors (rope_freqs.weight). Recover the
// parameters by matching the factors against the llama3 formula for the common settings.
RopeScaling fit_llama3_scaling(const Tensor& freqs, const ModelConfig& c, const std::string& file) {
  const float* f = freqs.data_as<float>();
  const int64_t n = freqs.numel();
  PA_CHECK(n * 2 == c.head_dim, "load_model_file: ", file, ": tensor 'rope_freqs.weight' has ", n,
           " entries, expected head_dim / 2 = ", c.head_dim / 2);
  float factor = 1.f;
  for (int64_t i = 0; i < n; ++i) factor = std::max(factor, f[i]);
  for (int orig : {8192, 4096, 2048, 16384, 32768}) {
    for (float low : {1.f, 2.f}) {
      for (float high : {4.f, 2.f, 8.f}) {
        bool ok = true;
        for (int64_t i = 0; i < n && ok; ++i) {
          const double inv = std::pow(double(c.rope_theta), -2.0 * double(i) / c.head_dim);
          const double wavelen = 2 * M_PI / inv;
          double want;
          if (wavelen < orig / high) want = 1;
          else if (wavelen > orig / low) want = factor;
          else {
            const double s = (orig / wavelen - low) / (high - low);
            want = 1.0 / ((1 - s) / factor + s);
          }
          ok = std::abs(want - f[i]) <= 1e-3 * want;
        }
        if (ok) return RopeScaling{"llama3", factor, low, high, orig};
      }
    }
  }
  fail("load_model_file: ", file, ": tensor 'rope_freqs.weight' does not match llama3 rope scaling");
}

}  // namespace

// The rows of a matrix kept in its file's blocks, q/k heads reordered like unpermute_rows (a row
// is a whole number of blocks, so rows move as bytes), into a copy.
FileWeight unpermute_file_rows(const FileWeight& w, int32_t n_heads, const std::string& file,
                               const std::string& name) {
  PA_CHECK(n_heads > 0 && w.shape[0] % (2 * int64_t(n_heads)) == 0, "load_model_file: ", file,
           ": tensor '", name, "' does not split into ", n_heads, " heads of even size");
  const int64_t head_dim = w.shape[0] / n_heads, half = head_dim / 2, rb = w.row_bytes;
  std::shared_ptr<uint8_t[]> out(new uint8_t[size_t(w.shape[0] * rb)]);
  for (int64_t h = 0; h < n_heads; ++h)
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j = 0; j < half; ++j)
        std::memcpy(out.get() + (h * head_dim + i * half + j) * rb,
                    w.data.get() + (h * head_dim + 2 * j + i) * rb, size_t(rb));
  FileWeight r = w;
  r.data = std::shared_ptr<const uint8_t>(out, out.get());
  r.mapped = false;
  return r;
}

ModelFile load_gguf_model(const std::string& path, WeightFormat format) {
  const GGUFFile g = GGUFFile::open(path);
  ModelFile mf;
  mf.path = path;
  ModelConfig& c = mf.config;
  const std::string arch = g.get_string("general.architecture");
  PA_CHECK(arch == "llama" || arch == "mistral" || arch == "qwen2" || arch == "qwen3",
           "load_model_file: ", path, ": key 'general.architecture': unsupported architecture '",
           arch, "' (supported: llama, mistral, qwen2, qwen3)");
  c.architecture = arch;
  const std::string p = arch + ".";
  auto positive = [&](const std::string& key, int64_t v) {
    PA_CHECK(v > 0 && v < (int64_t(1) << 31), "load_model_file: ", path, ": key '", key,
             "' = ", v, " is out of range");
    return int32_t(v);
  };
  c.hidden_size = positive(p + "embedding_length", g.get_int(p + "embedding_length"));
  c.num_layers = positive(p + "block_count", g.get_int(p + "block_count"));
  c.intermediate_size = positive(p + "feed_forward_length", g.get_int(p + "feed_forward_length"));
  c.num_q_heads = positive(p + "attention.head_count", g.get_int(p + "attention.head_count"));
  c.num_kv_heads = positive(p + "attention.head_count_kv",
                            g.get_int(p + "attention.head_count_kv", c.num_q_heads));
  c.head_dim = positive(p + "attention.key_length",
                        g.get_int(p + "attention.key_length", c.hidden_size / c.num_q_heads));
  PA_CHECK(c.num_q_heads % c.num_kv_heads == 0, "load_model_file: ", path, ": key '", p,
           "attention.head_count_kv' = ", c.num_kv_heads, " does not divide ", p,
           "attention.head_count = ", c.num_q_heads);
  c.max_position_embeddings = positive(p + "context_length", g.get_int(p + "context_length", 2048));
  // NOTE: finite and in range as floats: an inf or NaN constant turns every output into NaN.
  auto finite = [&](const std::string& key, double dflt, bool zero_ok) {
    const double v = g.get_float(key, dflt);
    PA_CHECK(std::isfinite(v) && v <= FLT_MAX && (v > 0 || (zero_ok && v == 0)), "load_model_file: ", path,
             ": key '", key, "' = ", v, " must be a finite ", zero_ok ? "non-negative" : "positive",
             " float");
    return float(v);
  };
  c.rms_norm_eps = finite(p + "attention.layer_norm_rms_epsilon", 1e-5, true);
  c.rope_theta = finite(p + "rope.freq_base", 10000.0, false);
  const int64_t window = g.get_int(p + "attention.sliding_window", 0);
  c.sliding_window = window == 0 ? 0 : positive(p + "attention.sliding_window", window);
  c.attention_bias = arch == "qwen2";
  c.qk_norm = arch == "qwen3";
  // llama.cpp's rope scaling keys: linear, and YaRN as Hugging Face's (the ramp between the
  // beta rotations, cos/sin times 0.1 ln(factor) + 1); its variants with a log multiplier or an
  // attention factor of their own are refused.
  const std::string scaling = g.get_string(p + "rope.scaling.type", "none");
  const double scale_factor = g.get_float(p + "rope.scaling.factor", 1.0);
  if (scaling == "linear" && scale_factor != 1.0) {
    c.rope_scaling.type = "linear";
    c.rope_scaling.factor = finite(p + "rope.scaling.factor", 1.0, false);
  } else if (scaling == "yarn") {
    for (const char* k : {"rope.scaling.yarn_log_multiplier", "rope.scaling.attn_factor"})
      PA_CHECK(!g.has(p + k), "load_model_file: ", path, ": key '", p, k,
               "': YaRN with its own attention factor is not supported");
    RopeScaling& y = c.rope_scaling;
    y.type = "yarn";
    y.factor = finite(p + "rope.scaling.factor", 1.0, false);
    y.original_max_position = int32_t(positive(
        p + "rope.scaling.original_context_length",
        g.get_int(p + "rope.scaling.original_context_length", c.max_position_embeddings)));
    y.beta_fast = finite(p + "rope.scaling.yarn_beta_fast", 32.0, false);
    y.beta_slow = finite(p + "rope.scaling.yarn_beta_slow", 1.0, false);
  } else {
    PA_CHECK(scaling == "none" || scale_factor == 1.0, "load_model_file: ", path, ": key '", p,
             "rope.scaling.type': unsupported rope scaling '", scaling,
             "' (supported: linear, yarn)");
  }

  // Tokenizer ids.
  auto token_id = [&](const std::string& key) {
    const int64_t id = g.get_int(key, -1);
    PA_CHECK(id >= -1 && id < (int64_t(1) << 31), "load_model_file: ", path, ": key '", key,
             "' = ", id, " is not a token id");
    return int32_t(id);
  };
  c.bos_token_id = token_id("tokenizer.ggml.bos_token_id");
  for (const char* key : {"tokenizer.ggml.eos_token_id", "tokenizer.ggml.eot_token_id",
                          "tokenizer.ggml.eom_token_id"}) {
    const int32_t id = token_id(key);
    if (id >= 0 && std::find(c.eos_token_ids.begin(), c.eos_token_ids.end(), id) == c.eos_token_ids.end())
      c.eos_token_ids.push_back(int32_t(id));
  }

  // Tensors.
  const bool permuted = arch == "llama" || arch == "mistral";
  for (const GGUFTensorInfo& ti : g.tensors()) {
    const std::string name = hf_name(ti.name);
    if (name.empty()) continue;
    if ((format == WeightFormat::file || format == WeightFormat::stored) && ti.ne.size() == 2) {
      PA_CHECK(ggml_type_supported(ti.type), "load_model_file: ", path, ": tensor '", ti.name,
               "': unsupported type ", ggml_type_name(ti.type));
      FileWeight w;
      w.ggml_type = ti.type;
      w.shape = ti.shape();
      w.row_bytes = ti.ne[0] / ggml_block_size(GGMLType(ti.type)) * ggml_block_bytes(GGMLType(ti.type));
      w.data = g.tensor_bytes(ti);
      w.mapped = g.mapped();
      // The CPU runner reads rows in place: they are reordered into a copy. The CUDA runner
      // (stored) dequantises rows through file_row: a rank reads only its heads' rows.
      const bool q = ti.name.ends_with(".attn_q.weight"), k = ti.name.ends_with(".attn_k.weight");
      if (permuted && (q || k)) {
        const int32_t heads = q ? c.num_q_heads : c.num_kv_heads;
        if (format == WeightFormat::file) {
          w = unpermute_file_rows(w, heads, path, ti.name);
        } else {
          PA_CHECK(heads > 0 && w.shape[0] % (2 * int64_t(heads)) == 0, "load_model_file: ",
                   path, ": tensor '", ti.name, "' does not split into ", heads,
                   " heads of even size");
          w.head_rows = w.shape[0] / heads;
        }
      }
      mf.weights.emplace(name, std::move(w));
      continue;
    }
    Tensor t = g.load_f32(ti);
    if (permuted && ti.name.ends_with(".attn_q.weight")) unpermute_rows(t, c.num_q_heads, path, ti.name);
    if (permuted && ti.name.ends_with(".attn_k.weight")) unpermute_rows(t, c.num_kv_heads, path, ti.name);
    mf.tensors.emplace(name, std::move(t));
  }
  c.tie_word_embeddings = !mf.tensors.count("lm_head.weight") && !mf.weights.count("lm_head.weight");
  int64_t vocab = 0;
  if (auto e = mf.tensors.find("model.embed_tokens.weight"); e != mf.tensors.end())
    vocab = e->second.dim(0);
  else if (auto w = mf.weights.find("model.embed_tokens.weight"); w != mf.weights.end())
    vocab = w->second.shape[0];
  else
    fail("load_model_file: ", path, ": missing tensor 'token_embd.weight'");
  c.vocab_size = positive(p + "vocab_size", g.get_int(p + "vocab_size", vocab));
  if (const GGUFTensorInfo* rf = g.find_tensor("rope_freqs.weight"))
    c.rope_scaling = fit_llama3_scaling(g.load_f32(*rf), c, path);
  return mf;
}

}  // namespace pagedattn
