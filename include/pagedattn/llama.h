// LlamaModel: the Llama-family forward pass (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) on the CPU
// in fp32, reading and writing K/V through the paged cache.
//
// Per layer, over the batch's packed tokens x [num_tokens, hidden]:
//   h = rms_norm(x) * input_layernorm
//   q, k, v = h Wq^T (+bq), h Wk^T (+bk), h Wv^T (+bv)        (bias: Qwen2)
//   q, k = rms_norm per head * q_norm / k_norm                 (Qwen3)
//   q, k = rope(q, k) at each token's absolute position        (rotate_half, theta, Llama-3
//   scaling) write k, v at the batch's slots; o = paged_attention(q, cache layer) Wo^T; x += o h =
//   rms_norm(x) * post_attention_layernorm; x += (silu(h Wg^T) * h Wu^T) Wd^T
// then the final norm and lm_head (embed_tokens when tied) for the requested rows only.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "pagedattn/model.h"

namespace pagedattn {

class LlamaModel : public Model {
 public:
  // Shares the file's tensors (no copy). Throws Error naming the config key or tensor at fault:
  // an unsupported architecture, a head count that does not divide, a missing tensor, a tensor
  // whose shape, dtype or device is wrong.
  explicit LlamaModel(const ModelFile& file);

  const ModelConfig& config() const override { return config_; }
  Device device() const override { return Device::cpu; }
  Tensor forward(const ForwardBatch& batch, KvCache& cache) override;
  KvAbsMax kv_absmax(const std::vector<int32_t>& tokens) override;

  // Checks a batch against the cache and this model without touching either (forward calls it
  // first, so a rejected batch changes nothing).
  void validate(const ForwardBatch& batch, const KvCache& cache) const;

 private:
  struct Layer {
    const float* attn_norm;  // [hidden]
    const float* wq;         // [num_q_heads * head_dim, hidden]
    const float* wk;         // [num_kv_heads * head_dim, hidden]
    const float* wv;         // [num_kv_heads * head_dim, hidden]
    const float* bq;         // [num_q_heads * head_dim] or null
    const float* bk;         // [num_kv_heads * head_dim] or null
    const float* bv;         // [num_kv_heads * head_dim] or null
    const float* q_norm;     // [head_dim] or null
    const float* k_norm;     // [head_dim] or null
    const float* wo;         // [hidden, num_q_heads * head_dim]
    const float* mlp_norm;   // [hidden]
    const float* w_gate;     // [intermediate, hidden]
    const float* w_up;       // [intermediate, hidden]
    const float* w_down;     // [hidden, intermediate]
  };
  // Per-step scratch, grown on demand and reused across steps.
  struct Workspace {
    std::vector<float> x, h, q, k, v, attn, gate, up;
    std::vector<float> rope_cos, rope_sin;  // [num_tokens, head_dim / 2]
    std::vector<int32_t> kv_len, block_table;
  };

  void run_layer(const Layer& w, int32_t layer, int32_t num_tokens, const BatchLayout& layout,
                 const int32_t* slots, KvCache& cache);
  // Folds this layer's k, v (ws_.k, ws_.v) into *absmax_ (the calibration pass).
  void observe_kv(int32_t layer, int32_t num_tokens);

  ModelConfig config_;
  std::map<std::string, Tensor> tensors_;  // keeps the weights alive
  std::vector<Layer> layers_;
  const float* embed_ = nullptr;       // [vocab, hidden]
  const float* final_norm_ = nullptr;  // [hidden]
  const float* lm_head_ = nullptr;     // [vocab, hidden] (embed_ when tied)
  std::vector<double> inv_freq_;       // [head_dim / 2], RoPE frequencies after scaling
  Workspace ws_;
  KvAbsMax* absmax_ = nullptr;  // set during kv_absmax only
};

// Checks a Llama-family config (architecture, positive sizes, head counts that divide, eps,
// window) and sets head_dim 0 to hidden_size / num_q_heads. Errors start with `op`.
void check_llama_config(ModelConfig& config, const char* op);

// A model file of random weights for `config` (deterministic in seed), with every tensor the
// config calls for (biases with attention_bias, q/k norms with qk_norm, no lm_head when tied).
// head_dim 0 becomes hidden_size / num_q_heads. Weights are scaled so activations stay O(1).
ModelFile make_synthetic_model_file(const ModelConfig& config, uint64_t seed);

}  // namespace pagedattn
