// GGUF files as models: metadata to ModelConfig, tensor names to Hugging Face names, llama.cpp's
// q/k row permutation undone, tied embeddings; and the real default model.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <utility>
#include <vector>

#include "default_model.h"
#include "model/rope.h"
#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "pagedattn/model_file.h"
#include "test_gguf_writer.h"

namespace pagedattn {
namespace {

namespace fs = std::filesystem;
using testing::GGUFWriter;

struct Dims {
  int64_t hidden = 8, heads = 2, kv_heads = 1, head_dim = 4, inter = 16, vocab = 6, layers = 2;
};

// Deterministic distinct values for an HF tensor [rows, cols].
std::vector<float> values(int64_t rows, int64_t cols, float seed) {
  std::vector<float> v(size_t(rows * cols));
  for (size_t i = 0; i < v.size(); ++i) v[i] = seed + 0.001f * float(i);
  return v;
}

// llama.cpp's converter: w.reshape(n_head, 2, rows / n_head / 2, cols).swapaxes(1, 2).
std::vector<float> llama_cpp_permute(const std::vector<float>& w, int64_t rows, int64_t cols,
                                     int64_t n_head) {
  const int64_t half = rows / n_head / 2;
  std::vector<float> out(w.size());
  int64_t dst_row = 0;
  for (int64_t h = 0; h < n_head; ++h)       // axis 0
    for (int64_t b = 0; b < half; ++b)       // axis 1 after the swap (was axis 2)
      for (int64_t a = 0; a < 2; ++a, ++dst_row) {  // axis 2 after the swap (was axis 1)
        const int64_t src_row = (h * 2 + a) * half + b;
        std::copy_n(w.begin() + src_row * cols, cols, out.begin() + dst_row * cols);
      }
  return out;
}

// Writes a tiny model of the architecture; hf collects what each tensor must load as.
std::string write_model(const std::string& arch, bool tied, std::map<std::string, std::vector<float>>& hf,
                        const std::string& file) {
  const Dims d;
  GGUFWriter w;
  const std::string p = arch + ".";
  w.kv_str("general.architecture", arch);
  w.kv_u32(p + "context_length", 4096);
  w.kv_u32(p + "embedding_length", uint32_t(d.hidden));
  w.kv_u32(p + "block_count", uint32_t(d.layers));
  w.kv_u32(p + "feed_forward_length", uint32_t(d.inter));
  w.kv_u32(p + "attention.head_count", uint32_t(d.heads));
  w.kv_u32(p + "attention.head_count_kv", uint32_t(d.kv_heads));
  w.kv_f32(p + "attention.layer_norm_rms_epsilon", 1e-6f);
  w.kv_f32(p + "rope.freq_base", 500000.f);
  w.kv_u32("tokenizer.ggml.bos_token_id", 1);
  w.kv_u32("tokenizer.ggml.eos_token_id", 2);
  w.kv_u32("tokenizer.ggml.eot_token_id", 3);
  const bool permuted = arch == "llama" || arch == "mistral";
  float seed = 0.f;
  auto add = [&](const std::string& gguf, const std::string& name, int64_t rows, int64_t cols,
                 int64_t perm_heads = 0) {
    seed += 1.f;
    const auto v = values(rows, cols, seed);
    hf[name] = v;
    const auto stored = (permuted && perm_heads) ? llama_cpp_permute(v, rows, cols, perm_heads) : v;
    if (cols == 1) w.tensor_f32(gguf, {rows}, stored);
    else w.tensor_f32(gguf, {cols, rows}, stored);  // ne = {in, out}
  };
  add("token_embd.weight", "model.embed_tokens.weight", d.vocab, d.hidden);
  add("output_norm.weight", "model.norm.weight", d.hidden, 1);
  if (!tied) add("output.weight", "lm_head.weight", d.vocab, d.hidden);
  for (int l = 0; l < d.layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".", h = "model.layers." + std::to_string(l) + ".";
    add(b + "attn_norm.weight", h + "input_layernorm.weight", d.hidden, 1);
    add(b + "ffn_norm.weight", h + "post_attention_layernorm.weight", d.hidden, 1);
    add(b + "attn_q.weight", h + "self_attn.q_proj.weight", d.heads * d.head_dim, d.hidden, d.heads);
    add(b + "attn_k.weight", h + "self_attn.k_proj.weight", d.kv_heads * d.head_dim, d.hidden, d.kv_heads);
    add(b + "attn_v.weight", h + "self_attn.v_proj.weight", d.kv_heads * d.head_dim, d.hidden);
    add(b + "attn_output.weight", h + "self_attn.o_proj.weight", d.hidden, d.heads * d.head_dim);
    add(b + "ffn_gate.weight", h + "mlp.gate_proj.weight", d.inter, d.hidden);
    add(b + "ffn_up.weight", h + "mlp.up_proj.weight", d.inter, d.hidden);
    add(b + "ffn_down.weight", h + "mlp.down_proj.weight", d.hidden, d.inter);
    if (arch == "qwen2") {
      add(b + "attn_q.bias", h + "self_attn.q_proj.bias", d.heads * d.head_dim, 1);
      add(b + "attn_k.bias", h + "self_attn.k_proj.bias", d.kv_heads * d.head_dim, 1);
      add(b + "attn_v.bias", h + "self_attn.v_proj.bias", d.kv_heads * d.head_dim, 1);
    }
    if (arch == "qwen3") {
      add(b + "attn_q_norm.weight", h + "self_attn.q_norm.weight", d.head_dim, 1);
      add(b + "attn_k_norm.weight", h + "self_attn.k_norm.weight", d.head_dim, 1);
    }
  }
  const std::string path = (fs::temp_directory_path() / file).string();
  w.write(path);
  return path;
}

TEST(GGUFModel, ConfigNamesAndUnpermutedQK) {
  for (const std::string arch : {"llama", "qwen2", "qwen3"}) {
    for (bool tied : {true, false}) {
      std::map<std::string, std::vector<float>> hf;
      const std::string path = write_model(arch, tied, hf, "pa_test_" + arch + ".gguf");
      const ModelFile mf = load_model_file(path);
      const ModelConfig& c = mf.config;
      EXPECT_EQ(c.architecture, arch);
      EXPECT_EQ(c.hidden_size, 8);
      EXPECT_EQ(c.num_layers, 2);
      EXPECT_EQ(c.num_q_heads, 2);
      EXPECT_EQ(c.num_kv_heads, 1);
      EXPECT_EQ(c.head_dim, 4);
      EXPECT_EQ(c.intermediate_size, 16);
      EXPECT_EQ(c.vocab_size, 6);
      EXPECT_EQ(c.max_position_embeddings, 4096);
      EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
      EXPECT_FLOAT_EQ(c.rope_theta, 500000.f);
      EXPECT_EQ(c.tie_word_embeddings, tied);
      EXPECT_EQ(c.attention_bias, arch == "qwen2");
      EXPECT_EQ(c.qk_norm, arch == "qwen3");
      EXPECT_EQ(c.bos_token_id, 1);
      EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2, 3}));
      EXPECT_EQ(mf.tensors.size(), hf.size());
      for (const auto& [name, want] : hf) {
        auto it = mf.tensors.find(name);
        ASSERT_NE(it, mf.tensors.end()) << name;
        const Tensor& t = it->second;
        ASSERT_EQ(size_t(t.numel()), want.size()) << name;
        EXPECT_TRUE(std::equal(want.begin(), want.end(), t.data_as<float>())) << arch << " " << name;
      }
      EXPECT_EQ(mf.tensors.at("model.layers.1.self_attn.q_proj.weight").shape(),
                (std::vector<int64_t>{8, 8}));
      EXPECT_EQ(mf.tensors.at("model.layers.0.mlp.down_proj.weight").shape(),
                (std::vector<int64_t>{8, 16}));
      fs::remove(path);
    }
  }
}

TEST(GGUFModel, BadModelsNameTheKeyOrTensor) {
  auto expect_error = [](const std::string& path, const std::string& needle) {
    try {
      load_model_file(path);
      ADD_FAILURE() << "no error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  const std::string dir = fs::temp_directory_path().string();
  {
    GGUFWriter w;
    w.kv_str("general.architecture", "gpt-neox");
    w.write(dir + "/pa_arch.gguf");
    expect_error(dir + "/pa_arch.gguf", "gpt-neox");
  }
  {
    GGUFWriter w;
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.embedding_length", 8);
    w.write(dir + "/pa_key.gguf");
    expect_error(dir + "/pa_key.gguf", "llama.block_count");
  }
  {  // a config that disagrees with the tensors: one layer's k_proj missing
    std::map<std::string, std::vector<float>> hf;
    const std::string path = write_model("qwen2", true, hf, "pa_ok.gguf");
    GGUFFile g = GGUFFile::open(path);
    GGUFWriter w;
    for (const auto& [k, v] : g.metadata())
      if (v.type == GGUFType::string) w.kv_str(k, v.s);
      else if (v.is_integer()) w.kv_u32(k, uint32_t(v.i));
      else if (v.is_float()) w.kv_f32(k, float(v.f));
    for (const auto& t : g.tensors()) {
      if (t.name == "blk.1.attn_k.bias") continue;
      const uint8_t* p = g.tensor_data(t);
      w.tensor(t.name, t.ne, t.type, std::vector<uint8_t>(p, p + t.nbytes));
    }
    w.write(dir + "/pa_missing.gguf");
    expect_error(dir + "/pa_missing.gguf", "model.layers.1.self_attn.k_proj.bias");
    fs::remove(path);
  }
  expect_error(dir + "/pa_does_not_exist.gguf", "pa_does_not_exist.gguf");
}

TEST(GGUFModel, Llama3RopeFreqsBecomeRopeScaling) {
  // llama.cpp stores Llama 3 rope scaling as per-frequency factors (rope_freqs.weight). Compute
  // them with Hugging Face's llama3 rule (factor 8, low 1, high 4, original 8192) for head_dim 128
  // and check that the loader recovers those parameters.
  GGUFWriter w;
  w.kv_str("general.architecture", "llama");
  for (auto [k, v] : {std::pair{"embedding_length", 256}, {"block_count", 1}, {"feed_forward_length", 32},
                      {"attention.head_count", 2}, {"attention.head_count_kv", 2}})
    w.kv_u32(std::string("llama.") + k, uint32_t(v));
  w.kv_f32("llama.rope.freq_base", 500000.f);
  std::vector<float> freqs;
  for (int i = 0; i < 64; ++i) {
    const double inv = std::pow(500000.0, -2.0 * i / 128), wavelen = 2 * M_PI / inv;
    double scaled;  // HF: the new inverse frequency
    if (wavelen < 8192.0 / 4) scaled = inv;
    else if (wavelen > 8192.0 / 1) scaled = inv / 8;
    else {
      const double smooth = (8192.0 / wavelen - 1) / (4 - 1);
      scaled = (1 - smooth) * inv / 8 + smooth * inv;
    }
    freqs.push_back(float(inv / scaled));
  }
  w.tensor_f32("rope_freqs.weight", {64}, freqs);
  w.tensor_f32("token_embd.weight", {256, 2}, std::vector<float>(512, 1.f));
  w.tensor_f32("output_norm.weight", {256}, std::vector<float>(256, 1.f));
  const std::string path = (fs::temp_directory_path() / "pa_rope.gguf").string();
  w.write(path);
  const ModelFile mf = load_gguf_model(path);  // the mapping alone: the file has no layer tensors
  EXPECT_EQ(mf.config.rope_scaling.type, "llama3");
  EXPECT_FLOAT_EQ(mf.config.rope_scaling.factor, 8.f);
  EXPECT_FLOAT_EQ(mf.config.rope_scaling.low_freq_factor, 1.f);
  EXPECT_FLOAT_EQ(mf.config.rope_scaling.high_freq_factor, 4.f);
  EXPECT_EQ(mf.config.rope_scaling.original_max_position, 8192);
  EXPECT_EQ(mf.tensors.count("rope_freqs.weight"), 0u);
  fs::remove(path);
}

// llama.cpp's rope scaling keys (linear; YaRN with the pretraining context and betas) become the
// scaling that config.json gives: the frequencies and cos/sin factor transformers computes for the
// same parameters (tests/model/rope_scaling_golden.json, cases 0 and 3); YaRN's variants with an
// attention factor of their own are refused by key.
TEST(GGUFModel, LinearAndYarnKeysBecomeRopeScaling) {
  std::ifstream in(fs::path(__FILE__).parent_path() / "rope_scaling_golden.json");
  std::stringstream text;
  text << in.rdbuf();
  const nlohmann::json cases = nlohmann::json::parse(text.str())["cases"];
  auto write = [](const std::string& path, uint32_t context, const std::string& type, float factor,
                  uint32_t original, bool extra_key) {
    GGUFWriter w;
    w.kv_str("general.architecture", "llama");
    for (auto [k, v] : {std::pair{"embedding_length", 256}, {"block_count", 1},
                        {"feed_forward_length", 32}, {"attention.head_count", 4},
                        {"attention.head_count_kv", 4}})
      w.kv_u32(std::string("llama.") + k, uint32_t(v));
    w.kv_u32("llama.context_length", context);
    w.kv_f32("llama.rope.freq_base", 10000.f);
    w.kv_str("llama.rope.scaling.type", type);
    w.kv_f32("llama.rope.scaling.factor", factor);
    if (original) w.kv_u32("llama.rope.scaling.original_context_length", original);
    if (extra_key) w.kv_f32("llama.rope.scaling.yarn_log_multiplier", 0.1f);
    w.tensor_f32("token_embd.weight", {256, 2}, std::vector<float>(512, 1.f));
    w.tensor_f32("output_norm.weight", {256}, std::vector<float>(256, 1.f));
    w.write(path);
  };
  const std::string path = (fs::temp_directory_path() / "pa_rope_scaling.gguf").string();
  for (const auto& [index, type, factor, context, original] :
       {std::tuple{0, "linear", 2.f, 2048u, 0u}, std::tuple{3, "yarn", 8.f, 32768u, 4096u}}) {
    const nlohmann::json& c = cases[size_t(index)];
    ASSERT_EQ(c["rope_scaling"]["rope_type"].get<std::string>(), type);
    write(path, context, type, factor, original, false);
    const ModelConfig cfg = load_gguf_model(path).config;
    EXPECT_EQ(cfg.rope_scaling.type, type);
    const std::vector<double> inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling);
    const std::vector<double> want = c["inv_freq"].get<std::vector<double>>();
    ASSERT_EQ(inv.size(), want.size()) << type;
    for (size_t i = 0; i < inv.size(); ++i)
      EXPECT_NEAR(inv[i], want[i], 2e-6 * want[i]) << type << " frequency " << i;
    EXPECT_NEAR(rope_attention_factor(cfg.rope_scaling), c["attention_factor"].get<double>(), 1e-6);
  }
  write(path, 32768, "yarn", 8.f, 4096, true);
  try {
    load_gguf_model(path);
    ADD_FAILURE() << "a YaRN log multiplier was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("yarn_log_multiplier"), std::string::npos) << e.what();
  }
  write(path, 4096, "longrope", 2.f, 0, false);
  EXPECT_THROW(load_gguf_model(path), Error);
  fs::remove(path);
}

// PAGEDATTN_MODEL or the default model.
std::string default_model_path() { return testing::model_path_from_env(); }

TEST(GGUFModel, DefaultModelLoads) {
  const std::string path = default_model_path();
  if (!fs::exists(path)) GTEST_SKIP() << "default model missing: run scripts/fetch-default-model.sh";
  const GGUFFile g = GGUFFile::open(path);
  EXPECT_EQ(g.version(), 3u);
  EXPECT_EQ(g.tensors().size(), 272u);
  EXPECT_EQ(ggml_type_name(g.find_tensor("blk.0.attn_q.weight")->type), "Q4_1");
  EXPECT_EQ(ggml_type_name(g.find_tensor("token_embd.weight")->type), "Q8_0");

  const ModelFile mf = load_model_file(path);
  const ModelConfig& c = mf.config;
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_q_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_FALSE(c.attention_bias);
  EXPECT_FALSE(c.qk_norm);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.f);
  EXPECT_NEAR(c.rms_norm_eps, 1e-5f, 1e-9f);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(c.bos_token_id, 1);
  EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2}));
  EXPECT_EQ(mf.tensors.size(), 2u + 30u * 9u);
  EXPECT_EQ(mf.tensors.count("lm_head.weight"), 0u);
  EXPECT_EQ(mf.tensors.at("model.embed_tokens.weight").shape(), (std::vector<int64_t>{49152, 576}));
  EXPECT_EQ(mf.tensors.at("model.layers.29.self_attn.k_proj.weight").shape(),
            (std::vector<int64_t>{192, 576}));
  // q_proj is the GGUF tensor with each head's rows un-interleaved: HF row h*64 + i*32 + j is GGUF
  // row h*64 + 2j + i.
  const Tensor raw = g.load_f32(*g.find_tensor("blk.3.attn_q.weight"));
  const Tensor& q = mf.tensors.at("model.layers.3.self_attn.q_proj.weight");
  for (int64_t h : {0, 8})
    for (int64_t i = 0; i < 2; ++i)
      for (int64_t j : {0, 5, 31})
        for (int64_t col : {0, 100, 575})
          EXPECT_EQ(q.data_as<float>()[(h * 64 + i * 32 + j) * 576 + col],
                    raw.data_as<float>()[(h * 64 + 2 * j + i) * 576 + col]);
  for (const auto& [name, t] : mf.tensors) {
    const float* p = t.data_as<float>();
    double sum = 0;
    for (int64_t i = 0; i < t.numel(); ++i) {
      ASSERT_TRUE(std::isfinite(p[i])) << name;
      sum += std::fabs(p[i]);
    }
    EXPECT_GT(sum, 0) << name;
  }
}

// A file whose config asks for shapes too large to hold (a hostile vocab_size or hidden_size)
// gets an Error naming both shapes, not an allocation of the config's shape (a fuzzer found the
// check allocating 8 GB to print the shape it expected).
TEST(GGUFModel, HugeConfigShapesAreRefusedWithoutAllocating) {
  ModelFile mf;
  mf.path = "hostile.gguf";
  mf.config.vocab_size = 1 << 30;
  mf.config.hidden_size = 1 << 30;
  mf.config.num_layers = 1;
  mf.config.num_q_heads = mf.config.num_kv_heads = 1;
  mf.config.head_dim = 1 << 30;
  mf.config.intermediate_size = 1;
  mf.tensors.emplace("model.embed_tokens.weight", Tensor::empty({4, 8}, DType::f32));
  try {
    check_model_tensors(mf);
    FAIL() << "a shape the file does not have was accepted";
  } catch (const Error& e) {
    const std::string what = e.what();
    EXPECT_NE(what.find("[4, 8]"), std::string::npos) << what;
    EXPECT_NE(what.find("[1073741824, 1073741824]"), std::string::npos) << what;
  }
  FileWeight w;
  w.shape = {4, 32};
  mf.tensors.clear();
  mf.weights.emplace("model.embed_tokens.weight", w);
  EXPECT_THROW(check_model_tensors(mf), Error);
}

// WeightFormat::stored (the CUDA runner's): a GGUF file's matrices stay in its blocks, and
// dequantize_block gives any block of rows and columns of one (a tensor-parallel rank's slice)
// with the same values as dequantising the whole tensor, reading only those rows.
TEST(GGUFModel, StoredMatricesDequantiseByBlock) {
  const std::string path = default_model_path();
  if (!fs::exists(path)) GTEST_SKIP() << "default model missing: run scripts/fetch-default-model.sh";
  const ModelFile stored = load_model_file(path, WeightFormat::stored);
  const ModelFile whole = load_model_file(path);  // every tensor dequantised to f32
  EXPECT_EQ(stored.weights.size(), 1u + 30u * 7u);  // the embeddings and 7 matrices a layer
  EXPECT_EQ(stored.tensors.size() + stored.weights.size(), whole.tensors.size());
  for (const auto& [name, w] : stored.weights) EXPECT_EQ(stored.tensors.count(name), 0u) << name;
  struct Case {
    const char* name;
    int64_t row0, rows, col0, cols;
  };
  // Q8_0 embeddings and Q4_1 projections (blocks of 32); q_proj's rows as unpermuted; column
  // ranges on block edges (only those blocks read) and off them (whole rows read).
  const Case cases[] = {{"model.embed_tokens.weight", 0, 3, 0, 576},
                        {"model.embed_tokens.weight", 49149, 3, 288, 288},
                        {"model.layers.3.self_attn.q_proj.weight", 64, 64, 0, 576},
                        {"model.layers.3.self_attn.q_proj.weight", 5, 70, 32, 64},
                        {"model.layers.11.self_attn.k_proj.weight", 60, 70, 0, 576},
                        {"model.layers.0.self_attn.o_proj.weight", 0, 576, 192, 192},
                        {"model.layers.29.mlp.down_proj.weight", 100, 9, 7, 1000},
                        {"model.layers.29.mlp.down_proj.weight", 575, 1, 1535, 1},
                        {"model.layers.7.mlp.gate_proj.weight", 0, 0, 0, 576}};
  for (const Case& c : cases) {
    SCOPED_TRACE(::testing::Message() << c.name << " rows " << c.row0 << "+" << c.rows
                                      << " cols " << c.col0 << "+" << c.cols);
    const FileWeight& w = stored.weights.at(c.name);
    const Tensor& f = whole.tensors.at(c.name);
    ASSERT_EQ(w.shape, f.shape());
    std::vector<float> got(size_t(c.rows * c.cols), NAN);
    dequantize_block(w, c.row0, c.rows, c.col0, c.cols, got.data());
    int wrong = 0;
    for (int64_t r = 0; r < c.rows; ++r)
      for (int64_t k = 0; k < c.cols; ++k)
        wrong += got[size_t(r * c.cols + k)] != f.data_as<float>()[(c.row0 + r) * f.dim(1) + c.col0 + k];
    EXPECT_EQ(wrong, 0);
  }
  // q and k stay in llama.cpp's row order in the file (a rank reads only its heads' rows), mapped
  // through file_row; WeightFormat::file reorders them into a copy instead.
  EXPECT_EQ(stored.weights.at("model.layers.3.self_attn.q_proj.weight").head_rows, 64);
  EXPECT_EQ(stored.weights.at("model.layers.3.self_attn.k_proj.weight").head_rows, 64);
  EXPECT_EQ(stored.weights.at("model.layers.3.self_attn.v_proj.weight").head_rows, 0);
  const ModelFile file_format = load_model_file(path, WeightFormat::file);
  EXPECT_EQ(file_format.weights.at("model.layers.3.self_attn.q_proj.weight").head_rows, 0);
  ModelFile few;
  few.weights.emplace("k", stored.weights.at("model.layers.11.self_attn.k_proj.weight"));
  few.weights.emplace("q", file_format.weights.at("model.layers.11.self_attn.q_proj.weight"));
  const ModelFile f32 = with_f32_weights(few);
  for (const auto& [key, name] : {std::pair{"k", "model.layers.11.self_attn.k_proj.weight"},
                                  {"q", "model.layers.11.self_attn.q_proj.weight"}}) {
    const Tensor& a = f32.tensors.at(key);
    const Tensor& b = whole.tensors.at(name);
    ASSERT_EQ(a.shape(), b.shape());
    EXPECT_EQ(std::memcmp(a.data(), b.data(), a.nbytes()), 0) << name;
  }
  const FileWeight& o = stored.weights.at("model.layers.0.self_attn.o_proj.weight");
  float out[4];
  EXPECT_THROW(dequantize_block(o, 575, 2, 0, 1, out), Error);
  EXPECT_THROW(dequantize_block(o, 0, 1, 570, 7, out), Error);
  EXPECT_THROW(dequantize_block(o, -1, 1, 0, 1, out), Error);
}

}  // namespace
}  // namespace pagedattn
