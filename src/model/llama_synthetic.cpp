// Random-weight model files for tests and benchmarks.
#include <cmath>
#include <random>

#include "pagedattn/error.h"
#include "pagedattn/llama.h"

namespace pagedattn {

namespace {

class Filler {
 public:
  explicit Filler(uint64_t seed) : gen_(seed) {}
  // Uniform in [center - half_width, center + half_width).
  Tensor uniform(std::vector<int64_t> shape, float center, float half_width) {
    Tensor t = Tensor::empty(std::move(shape), DType::f32);
    float* p = t.data_as<float>();
    for (int64_t i = 0; i < t.numel(); ++i) {
      const double u = double(gen_() >> 11) * 0x1.0p-53;  // [0, 1)
      p[i] = center + half_width * float(2.0 * u - 1.0);
    }
    return t;
  }
  // A Linear weight [out, in] whose outputs have about unit variance for unit-variance inputs.
  Tensor linear(int64_t out, int64_t in) {
    return uniform({out, in}, 0.f, float(std::sqrt(3.0 / double(in))));
  }

 private:
  std::mt19937_64 gen_;
};

}  // namespace

ModelFile make_synthetic_model_file(const ModelConfig& config, uint64_t seed) {
  ModelFile f;
  f.path = "synthetic:" + std::to_string(seed);
  f.config = config;
  ModelConfig& c = f.config;
  PA_CHECK(c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 &&
               c.num_q_heads > 0 && c.num_kv_heads > 0,
           "make_synthetic_model_file: config needs positive sizes, layer and head counts");
  if (c.head_dim == 0) {
    PA_CHECK(c.hidden_size % c.num_q_heads == 0, "make_synthetic_model_file: hidden_size (",
             c.hidden_size, ") is not a multiple of num_q_heads (", c.num_q_heads, ")");
    c.head_dim = c.hidden_size / c.num_q_heads;
  }
  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, d = c.head_dim;
  const int64_t q_dim = c.num_q_heads * d, kv_dim = c.num_kv_heads * d;
  Filler fill(seed);
  auto& t = f.tensors;
  t["model.embed_tokens.weight"] = fill.uniform({c.vocab_size, hidden}, 0.f, 1.f);
  t["model.norm.weight"] = fill.uniform({hidden}, 1.f, 0.2f);
  if (!c.tie_word_embeddings) t["lm_head.weight"] = fill.linear(c.vocab_size, hidden);
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    t[p + "input_layernorm.weight"] = fill.uniform({hidden}, 1.f, 0.2f);
    t[p + "self_attn.q_proj.weight"] = fill.linear(q_dim, hidden);
    t[p + "self_attn.k_proj.weight"] = fill.linear(kv_dim, hidden);
    t[p + "self_attn.v_proj.weight"] = fill.linear(kv_dim, hidden);
    if (c.attention_bias) {
      t[p + "self_attn.q_proj.bias"] = fill.uniform({q_dim}, 0.f, 0.5f);
      t[p + "self_attn.k_proj.bias"] = fill.uniform({kv_dim}, 0.f, 0.5f);
      t[p + "self_attn.v_proj.bias"] = fill.uniform({kv_dim}, 0.f, 0.5f);
    }
    if (c.qk_norm) {
      t[p + "self_attn.q_norm.weight"] = fill.uniform({d}, 1.f, 0.2f);
      t[p + "self_attn.k_norm.weight"] = fill.uniform({d}, 1.f, 0.2f);
    }
    t[p + "self_attn.o_proj.weight"] = fill.linear(hidden, q_dim);
    t[p + "post_attention_layernorm.weight"] = fill.uniform({hidden}, 1.f, 0.2f);
    t[p + "mlp.gate_proj.weight"] = fill.linear(inter, hidden);
    t[p + "mlp.up_proj.weight"] = fill.linear(inter, hidden);
    t[p + "mlp.down_proj.weight"] = fill.linear(hidden, inter);
  }
  return f;
}

}  // namespace pagedattn
