// Hugging Face folders: safetensors files written here (F32/F16/BF16, sharded with an index),
// config.json of each supported architecture, and malformed headers raising Error.
#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <functional>
#include <fstream>
#include <nlohmann/json.hpp>

#include "pagedattn/error.h"
#include "pagedattn/model_file.h"

namespace pagedattn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

struct StTensor {
  std::string name;
  std::string dtype;  // F32, F16, BF16 (or anything, for the error tests)
  std::vector<int64_t> shape;
  std::vector<float> values;
};

// Encodes tensors as a safetensors file: u64 header length, JSON header, data.
std::string encode(const std::vector<StTensor>& ts) {
  json h = json::object();
  std::string data;
  h["__metadata__"] = {{"format", "pt"}};
  for (const auto& t : ts) {
    const size_t begin = data.size();
    for (float v : t.values) {
      if (t.dtype == "F32") data.append(reinterpret_cast<const char*>(&v), 4);
      else {
        const uint16_t x = t.dtype == "F16" ? f32_to_f16(v) : f32_to_bf16(v);
        data.append(reinterpret_cast<const char*>(&x), 2);
      }
    }
    h[t.name] = {{"dtype", t.dtype}, {"shape", t.shape}, {"data_offsets", {begin, data.size()}}};
  }
  const std::string hs = h.dump();
  const uint64_t n = hs.size();
  return std::string(reinterpret_cast<const char*>(&n), 8) + hs + data;
}

void write(const fs::path& p, const std::string& bytes) {
  std::ofstream(p, std::ios::binary) << bytes;
}

std::vector<float> seq(size_t n, float start) {
  std::vector<float> v(n);
  for (size_t i = 0; i < n; ++i) v[i] = start + 0.25f * float(i % 64) - 0.5f * float(i / 64);
  return v;
}

// A tiny model folder: hidden 8, 2 layers, 4 heads of head_dim (2 KV heads), vocab 10.
fs::path make_folder(const std::string& name, const json& config, const std::string& dtype,
                     bool sharded, int64_t head_dim = 2) {
  const fs::path dir = fs::temp_directory_path() / ("pa_st_" + name);
  fs::remove_all(dir);
  fs::create_directories(dir);
  std::ofstream(dir / "config.json") << config.dump(2);
  const int64_t h = 8, q = 4 * head_dim, kv = 2 * head_dim, inter = 12, vocab = 10;
  std::vector<StTensor> ts;
  float s = 0;
  auto add = [&](const std::string& n, std::vector<int64_t> shape) {
    size_t numel = 1;
    for (auto d : shape) numel *= size_t(d);
    ts.push_back({n, dtype, shape, seq(numel, s += 1)});
  };
  add("model.embed_tokens.weight", {vocab, h});
  add("model.norm.weight", {h});
  if (!config.value("tie_word_embeddings", false)) add("lm_head.weight", {vocab, h});
  const std::string arch = config["architectures"][0];
  for (int l = 0; l < 2; ++l) {
    const std::string p = "model.layers." + std::to_string(l) + ".";
    add(p + "input_layernorm.weight", {h});
    add(p + "post_attention_layernorm.weight", {h});
    add(p + "self_attn.q_proj.weight", {q, h});
    add(p + "self_attn.k_proj.weight", {kv, h});
    add(p + "self_attn.v_proj.weight", {kv, h});
    add(p + "self_attn.o_proj.weight", {h, q});
    add(p + "mlp.gate_proj.weight", {inter, h});
    add(p + "mlp.up_proj.weight", {inter, h});
    add(p + "mlp.down_proj.weight", {h, inter});
    if (arch == "Qwen2ForCausalLM") {
      add(p + "self_attn.q_proj.bias", {q});
      add(p + "self_attn.k_proj.bias", {kv});
      add(p + "self_attn.v_proj.bias", {kv});
    }
    if (arch == "Qwen3ForCausalLM") {
      add(p + "self_attn.q_norm.weight", {head_dim});
      add(p + "self_attn.k_norm.weight", {head_dim});
    }
  }
  if (!sharded) {
    write(dir / "model.safetensors", encode(ts));
  } else {
    const size_t half = ts.size() / 2;
    const std::vector<StTensor> a(ts.begin(), ts.begin() + std::ptrdiff_t(half)), b(ts.begin() + std::ptrdiff_t(half), ts.end());
    write(dir / "model-00001-of-00002.safetensors", encode(a));
    write(dir / "model-00002-of-00002.safetensors", encode(b));
    json map = json::object();
    for (const auto& t : a) map[t.name] = "model-00001-of-00002.safetensors";
    for (const auto& t : b) map[t.name] = "model-00002-of-00002.safetensors";
    std::ofstream(dir / "model.safetensors.index.json") << json({{"weight_map", map}}).dump();
  }
  return dir;
}

json base_config(const std::string& arch) {
  return {{"architectures", {arch}}, {"hidden_size", 8},        {"intermediate_size", 12},
          {"num_hidden_layers", 2},  {"num_attention_heads", 4}, {"num_key_value_heads", 2},
          {"vocab_size", 10},        {"rms_norm_eps", 1e-6},     {"rope_theta", 1000000.0},
          {"max_position_embeddings", 512}, {"bos_token_id", 1}, {"eos_token_id", {2, 3}},
          {"tie_word_embeddings", false}};
}

TEST(Safetensors, LlamaFolderInEveryDtype) {
  for (const std::string dtype : {"F32", "F16", "BF16"}) {
    json cfg = base_config("LlamaForCausalLM");
    cfg["rope_scaling"] = {{"rope_type", "llama3"}, {"factor", 32.0}, {"low_freq_factor", 1.0},
                           {"high_freq_factor", 4.0}, {"original_max_position_embeddings", 8192}};
    const fs::path dir = make_folder("llama_" + dtype, cfg, dtype, false);
    const ModelFile mf = load_model_file(dir.string());
    const ModelConfig& c = mf.config;
    EXPECT_EQ(c.architecture, "llama");
    EXPECT_EQ(c.hidden_size, 8);
    EXPECT_EQ(c.num_q_heads, 4);
    EXPECT_EQ(c.num_kv_heads, 2);
    EXPECT_EQ(c.head_dim, 2);
    EXPECT_EQ(c.num_layers, 2);
    EXPECT_EQ(c.intermediate_size, 12);
    EXPECT_EQ(c.vocab_size, 10);
    EXPECT_FLOAT_EQ(c.rope_theta, 1e6f);
    EXPECT_FLOAT_EQ(c.rms_norm_eps, 1e-6f);
    EXPECT_EQ(c.max_position_embeddings, 512);
    EXPECT_EQ(c.eos_token_ids, (std::vector<int32_t>{2, 3}));
    EXPECT_EQ(c.rope_scaling.type, "llama3");
    EXPECT_FLOAT_EQ(c.rope_scaling.factor, 32.f);
    EXPECT_FLOAT_EQ(c.rope_scaling.high_freq_factor, 4.f);
    EXPECT_EQ(c.rope_scaling.original_max_position, 8192);
    EXPECT_FALSE(c.tie_word_embeddings);
    EXPECT_FALSE(c.attention_bias);
    EXPECT_EQ(mf.tensors.size(), 3u + 2u * 9u);
    // Values survive the dtype round trip (all chosen exactly representable in bf16 and f16).
    const Tensor& t = mf.tensors.at("model.layers.1.mlp.down_proj.weight");
    EXPECT_EQ(t.shape(), (std::vector<int64_t>{8, 12}));
    const auto want = seq(96, 0);
    const float start = t.data_as<float>()[0];
    for (size_t i = 0; i < 96; ++i) EXPECT_EQ(t.data_as<float>()[i] - start, want[i] - want[0]) << dtype << i;
    fs::remove_all(dir);
  }
}

// WeightFormat::stored (what the CUDA runner loads): the tensors keep the file's dtype and are the
// same values as the f32 load's; sharded folders too.
TEST(Safetensors, StoredDtypeKeepsTheFilesValues) {
  for (const std::string dtype : {"F32", "F16", "BF16"}) {
    for (bool sharded : {false, true}) {
      const fs::path dir =
          make_folder("stored_" + dtype, base_config("LlamaForCausalLM"), dtype, sharded);
      const ModelFile f32 = load_model_file(dir.string());
      const ModelFile stored = load_model_file(dir.string(), WeightFormat::stored);
      const DType want = dtype == "F32" ? DType::f32 : dtype == "F16" ? DType::f16 : DType::bf16;
      ASSERT_EQ(stored.tensors.size(), f32.tensors.size());
      for (const auto& [name, t] : stored.tensors) {
        const Tensor& ref = f32.tensors.at(name);
        EXPECT_EQ(t.dtype(), want) << name;
        ASSERT_EQ(t.shape(), ref.shape()) << name;
        for (int64_t i = 0; i < t.numel(); ++i)
          ASSERT_EQ(load_as_f32(t.data(), t.dtype(), i), ref.data_as<float>()[i]) << name << i;
      }
      fs::remove_all(dir);  // the mapping outlives the file's name
      EXPECT_EQ(load_as_f32(stored.tensors.at("model.norm.weight").data(), want, 3),
                f32.tensors.at("model.norm.weight").data_as<float>()[3]);
    }
  }
}

TEST(Safetensors, Qwen2AndQwen3ShardedWithIndex) {
  json q2 = base_config("Qwen2ForCausalLM");
  q2["tie_word_embeddings"] = true;
  fs::path dir = make_folder("qwen2", q2, "BF16", true);
  ModelFile mf = load_model_file(dir.string());
  EXPECT_EQ(mf.config.architecture, "qwen2");
  EXPECT_TRUE(mf.config.attention_bias);
  EXPECT_TRUE(mf.config.tie_word_embeddings);
  EXPECT_EQ(mf.tensors.count("model.layers.1.self_attn.v_proj.bias"), 1u);
  EXPECT_EQ(mf.tensors.count("lm_head.weight"), 0u);
  fs::remove_all(dir);

  json q3 = base_config("Qwen3ForCausalLM");
  q3["head_dim"] = 4;  // not hidden / heads
  dir = make_folder("qwen3", q3, "F16", true, 4);
  mf = load_model_file(dir.string());
  EXPECT_EQ(mf.config.architecture, "qwen3");
  EXPECT_TRUE(mf.config.qk_norm);
  EXPECT_EQ(mf.config.head_dim, 4);
  EXPECT_EQ(mf.tensors.at("model.layers.0.self_attn.q_proj.weight").shape(), (std::vector<int64_t>{16, 8}));
  EXPECT_EQ(mf.tensors.at("model.layers.0.self_attn.k_norm.weight").shape(), (std::vector<int64_t>{4}));
  fs::remove_all(dir);
}

void expect_error(const std::function<void()>& f, const std::string& needle) {
  try {
    f();
    ADD_FAILURE() << "no error, wanted one mentioning " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
  }
}

TEST(Safetensors, BadConfigsNameTheKey) {
  json cfg = base_config("GPTNeoXForCausalLM");
  expect_error([&] { parse_hf_config(cfg.dump(), "config.json"); }, "GPTNeoXForCausalLM");
  cfg = base_config("MistralForCausalLM");
  EXPECT_EQ(parse_hf_config(cfg.dump(), "config.json").architecture, "mistral");
  cfg.erase("hidden_size");
  expect_error([&] { parse_hf_config(cfg.dump(), "config.json"); }, "hidden_size");
  cfg = base_config("LlamaForCausalLM");
  cfg["num_key_value_heads"] = 3;
  expect_error([&] { parse_hf_config(cfg.dump(), "config.json"); }, "num_key_value_heads");
  cfg = base_config("LlamaForCausalLM");
  cfg["rope_scaling"] = {{"type", "dynamic"}, {"factor", 4.0}};
  expect_error([&] { parse_hf_config(cfg.dump(), "config.json"); }, "rope_scaling");
  cfg = base_config("LlamaForCausalLM");
  cfg["vocab_size"] = "big";
  expect_error([&] { parse_hf_config(cfg.dump(), "config.json"); }, "vocab_size");
  expect_error([&] { parse_hf_config("{oops", "config.json"); }, "config.json");
  // A config that disagrees with the tensors.
  cfg = base_config("LlamaForCausalLM");
  const fs::path dir = make_folder("mismatch", cfg, "F32", false);
  cfg["intermediate_size"] = 16;
  std::ofstream(dir / "config.json") << cfg.dump();
  expect_error([&] { load_model_file(dir.string()); }, "mlp.gate_proj.weight");
  fs::remove(dir / "model.safetensors");
  expect_error([&] { load_model_file(dir.string()); }, "no .safetensors");
  fs::remove_all(dir);
}

TEST(Safetensors, MalformedFilesRaiseErrors) {
  const fs::path p = fs::temp_directory_path() / "pa_st_bad.safetensors";
  const std::string good = encode({{"a", "F32", {2, 3}, seq(6, 0)}, {"b", "F16", {4}, seq(4, 1)}});
  write(p, good);
  const auto ok = load_safetensors(p.string());
  ASSERT_EQ(ok.size(), 2u);
  EXPECT_EQ(ok.at("a").shape(), (std::vector<int64_t>{2, 3}));
  EXPECT_EQ(ok.at("b").data_as<float>()[3], seq(4, 1)[3]);

  // Every truncation fails cleanly.
  for (size_t n = 0; n < good.size(); ++n) {
    write(p, good.substr(0, n));
    EXPECT_THROW(load_safetensors(p.string()), Error) << "truncated at " << n;
  }
  auto header_file = [&](const std::string& h, size_t data_bytes) {
    const uint64_t n = h.size();
    write(p, std::string(reinterpret_cast<const char*>(&n), 8) + h + std::string(data_bytes, '\0'));
  };
  header_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]}})", 4);
  expect_error([&] { load_safetensors(p.string()); }, "'a'");
  header_file(R"({"a": {"dtype": "F32", "shape": [3], "data_offsets": [0, 8]}})", 8);
  expect_error([&] { load_safetensors(p.string()); }, "needs 12");
  header_file(R"({"a": {"dtype": "I32", "shape": [2], "data_offsets": [0, 8]}})", 8);
  expect_error([&] { load_safetensors(p.string()); }, "I32");
  header_file(R"({"a": {"dtype": "F32", "shape": [-2], "data_offsets": [0, 8]}})", 8);
  expect_error([&] { load_safetensors(p.string()); }, "shape");
  header_file(R"({"a": {"dtype": "F32", "shape": [2]}})", 8);
  expect_error([&] { load_safetensors(p.string()); }, "data_offsets");
  header_file(R"({"a": {"dtype": "F32", "shape": [2], "data_offsets": [0, 8]},
                  "b": {"dtype": "F32", "shape": [2], "data_offsets": [4, 12]}})", 12);
  expect_error([&] { load_safetensors(p.string()); }, "overlaps");
  header_file("[1, 2]", 0);
  expect_error([&] { load_safetensors(p.string()); }, "not a JSON object");
  header_file("{\"a\": ", 0);
  expect_error([&] { load_safetensors(p.string()); }, "JSON");
  {
    const uint64_t n = uint64_t(1) << 62;
    write(p, std::string(reinterpret_cast<const char*>(&n), 8) + "{}");
    expect_error([&] { load_safetensors(p.string()); }, "header length");
  }
  fs::remove(p);
}

}  // namespace
}  // namespace pagedattn
