// LlamaModel: the Llama-family forward pass (Llama 2/3, SmolLM2, Mistral, Qwen2, Qwen3) on the CPU
// in fp32, reading and writing K/V through the paged cache.
//
// Matrices are read in the file's format (ModelFile::weights, or f32 tensors): products quantise
// the activations per block to int8 for the block formats, or, with set_exact_matmul(true), use
// f32 activations against the dequantised weights. Either way every output element is reduced in
// an order fixed by the shapes alone, so a sequence's logits do not depend on its batch.
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
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/model.h"
#include "pagedattn/weight_view.h"

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
  void set_exact_matmul(bool exact) override { exact_matmul_ = exact; }
  bool exact_matmul() const { return exact_matmul_; }

  // Checks a batch against the cache and this model without touching either (forward calls it
  // first, so a rejected batch changes nothing).
  void validate(const ForwardBatch& batch, const KvCache& cache) const;

 private:
  using W = cpu::WeightView;
  struct Layer {
    const float* attn_norm;  // [hidden]
    W wq;                    // [num_q_heads * head_dim, hidden]
    W wk;                    // [num_kv_heads * head_dim, hidden]
    W wv;                    // [num_kv_heads * head_dim, hidden]
    const float* bq;         // [num_q_heads * head_dim] or null
    const float* bk;         // [num_kv_heads * head_dim] or null
    const float* bv;         // [num_kv_heads * head_dim] or null
    const float* q_norm;     // [head_dim] or null
    const float* k_norm;     // [head_dim] or null
    W wo;                    // [hidden, num_q_heads * head_dim]
    const float* mlp_norm;   // [hidden]
    W w_gate;                // [intermediate, hidden]
    W w_up;                  // [intermediate, hidden]
    W w_down;                // [hidden, intermediate]
  };
  // Per-step scratch, grown on demand and reused across steps.
  struct Workspace {
    std::vector<float> x, h, q, k, v, attn, gate, up;
    cpu::MatmulInput in;  // the activations of the current products
    std::vector<float> rope_cos, rope_sin;  // [num_tokens, head_dim / 2]
    CpuAttentionPlan attention;             // planned once per forward, run by every layer
  };

  void run_layer(const Layer& w, int32_t layer, int32_t num_tokens, const int32_t* slots,
                 KvCache& cache);
  // The Q4_0/Q4_1/Q8_0 matrices into the x16 layout (the constructor's last step).
  void pack_matrices();
  // Folds this layer's k, v (ws_.k, ws_.v) into *absmax_ (the calibration pass).
  void observe_kv(int32_t layer, int32_t num_tokens);

  ModelConfig config_;
  std::map<std::string, Tensor> tensors_;      // keeps the f32 tensors alive
  std::map<std::string, FileWeight> weights_;  // keeps the file-format matrices read in place alive
  std::vector<std::shared_ptr<const uint8_t>> packed_;  // the x16 copies (cpu/quant_pack.h)
  std::vector<Layer> layers_;
  W embed_;                            // [vocab, hidden]
  const float* final_norm_ = nullptr;  // [hidden]
  W lm_head_;                          // [vocab, hidden] (embed_ when tied)
  bool exact_matmul_ = false;
  std::vector<double> inv_freq_;       // [head_dim / 2], RoPE frequencies after scaling
  double rope_scale_ = 1.0;            // the cos/sin tables' factor (YaRN's attention factor)
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
