// Random-weight model files for tests and benchmarks: the tensor list and scale rules shared by
// every synthetic model, filled either from a sequential generator (make_synthetic_model_file) or
// from the counter-based hash that the CUDA runner also uses (make_hashed_synthetic_model_file).
#include <cmath>
#include <random>

#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/synthetic_model.h"
#include "synthetic_fill.h"

namespace pagedattn {

namespace {

// Checks the sizes and resolves head_dim 0 (hidden_size / num_q_heads).
ModelConfig resolved(const ModelConfig& config, const char* op) {
  ModelConfig c = config;
  PA_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 &&
               c.num_q_heads > 0 && c.num_kv_heads > 0,
           op, ": config needs positive sizes, layer and head counts");
  if (c.head_dim == 0) {
    PA_CHECK(c.hidden_size % c.num_q_heads == 0, op, ": hidden_size (", c.hidden_size,
             ") is not a multiple of num_q_heads (", c.num_q_heads, ")");
    c.head_dim = c.hidden_size / c.num_q_heads;
  }
  return c;
}

}  // namespace

std::vector<SyntheticTensor> synthetic_tensors(const ModelConfig& c) {
  PA_CHECK(c.head_dim > 0, "synthetic_tensors: config.head_dim must be set, got ", c.head_dim);
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, d = c.head_dim;
  const int64_t q_dim = int64_t(c.num_q_heads) * d, kv_dim = int64_t(c.num_kv_heads) * d;
  std::vector<SyntheticTensor> out;
  auto uniform = [&](std::string name, std::vector<int64_t> shape, float center, float half,
                     uint32_t id) {
    out.push_back({std::move(name), std::move(shape), center, half, id});
  };
  auto linear = [&](std::string name, int64_t rows, int64_t cols, uint32_t id) {
    uniform(std::move(name), {rows, cols}, 0.f, float(std::sqrt(3.0 / double(cols))), id);
  };
  // NOTE: the order is make_synthetic_model_file's draw order (tests depend on those weights).
  uniform("model.embed_tokens.weight", {c.vocab_size, hidden}, 0.f, 1.f, 1);
  uniform("model.norm.weight", {hidden}, 1.f, 0.2f, 2);
  if (!c.tie_word_embeddings) linear("lm_head.weight", c.vocab_size, hidden, 3);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    const uint32_t id = 16 * uint32_t(i + 1);  // 16 ids per layer
    uniform(p + "input_layernorm.weight", {hidden}, 1.f, 0.2f, id + 0);
    linear(p + "self_attn.q_proj.weight", q_dim, hidden, id + 1);
    linear(p + "self_attn.k_proj.weight", kv_dim, hidden, id + 2);
    linear(p + "self_attn.v_proj.weight", kv_dim, hidden, id + 3);
    if (c.attention_bias) {
      uniform(p + "self_attn.q_proj.bias", {q_dim}, 0.f, 0.5f, id + 4);
      uniform(p + "self_attn.k_proj.bias", {kv_dim}, 0.f, 0.5f, id + 5);
      uniform(p + "self_attn.v_proj.bias", {kv_dim}, 0.f, 0.5f, id + 6);
    }
    if (c.qk_norm) {
      uniform(p + "self_attn.q_norm.weight", {d}, 1.f, 0.2f, id + 7);
      uniform(p + "self_attn.k_norm.weight", {d}, 1.f, 0.2f, id + 8);
    }
    linear(p + "self_attn.o_proj.weight", hidden, q_dim, id + 9);
    uniform(p + "post_attention_layernorm.weight", {hidden}, 1.f, 0.2f, id + 10);
    linear(p + "mlp.gate_proj.weight", inter, hidden, id + 11);
    linear(p + "mlp.up_proj.weight", inter, hidden, id + 12);
    linear(p + "mlp.down_proj.weight", hidden, inter, id + 13);
  }
  return out;
}

ModelFile make_synthetic_model_file(const ModelConfig& config, uint64_t seed) {
  ModelFile f;
  f.path = "synthetic:" + std::to_string(seed);
  f.config = resolved(config, "make_synthetic_model_file");
  std::mt19937_64 gen(seed);
  for (const SyntheticTensor& s : synthetic_tensors(f.config)) {
    Tensor t = Tensor::empty(s.shape, DType::f32);
    float* p = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double u = double(gen() >> 11) * 0x1.0p-53;  // [0, 1)
      p[i] = s.center + s.half_width * float(2.0 * u - 1.0);
    }
    f.tensors[s.name] = std::move(t);
  }
  return f;
}

ModelFile make_hashed_synthetic_model_file(const ModelConfig& config, uint64_t seed) {
  ModelFile f;
  f.path = "synthetic-hashed:" + std::to_string(seed);
  f.config = resolved(config, "make_hashed_synthetic_model_file");
  for (const SyntheticTensor& s : synthetic_tensors(f.config)) {
    Tensor t = Tensor::empty(s.shape, DType::f32);
    float* p = t.data_as<float>();
    const uint64_t key = synthetic::tensor_key(seed, s.id);
    for (int64_t i = 0; i < t.numel(); ++i) {
      p[i] = synthetic::value(key, uint64_t(i), s.center, s.half_width);
    }
    f.tensors[s.name] = std::move(t);
  }
  return f;
}

}  // namespace pagedattn
