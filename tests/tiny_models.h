// The small models and caches the tests build again and again: tiny Llama-family configs per
// architecture variant, KV cache configs sized for them (or for the scheduler's bookkeeping
// alone), and seeded random prompts.
#pragma once

#include <cstdint>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"

namespace pagedattn::testing {

// cpu: hidden 64, vocab 97 (head dim 16: the CPU model's tests, fast against the oracle);
// gpu: hidden 256, vocab 300 (head dim 64, which the CUDA attention kernels have).
enum class TinySize { cpu, gpu };

// Two layers, 4 query heads and 2 KV heads, with the variant's features: "llama" (plain),
// "qwen2" (q/k/v biases, tied embeddings, theta 1e6), "qwen3" (q/k norms, a head dim twice
// hidden / heads, 1 KV head), "llama3" (Llama-3 RoPE scaling that changes the positions the tests
// use), "mistral" (a sliding window of 8, no GQA).
inline ModelConfig tiny_config(const std::string& variant, TinySize size = TinySize::cpu) {
  const bool gpu = size == TinySize::gpu;
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = gpu ? 300 : 97;
  c.hidden_size = gpu ? 256 : 64;
  c.intermediate_size = gpu ? 512 : 160;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.rms_norm_eps = 1e-5f;
  c.rope_theta = 10000.f;
  if (variant == "qwen2") {
    c.architecture = "qwen2";
    c.attention_bias = true;
    c.rope_theta = 1000000.f;
    c.rms_norm_eps = 1e-6f;
    c.tie_word_embeddings = true;
  } else if (variant == "qwen3") {
    c.architecture = "qwen3";
    c.qk_norm = true;
    c.head_dim = 2 * c.hidden_size / c.num_q_heads;  // q_dim != hidden, as in Qwen3
    c.num_kv_heads = 1;
  } else if (variant == "llama3") {
    c.rope_theta = 500000.f;
    c.rope_scaling.type = "llama3";
    c.rope_scaling.factor = 8.f;
    c.rope_scaling.low_freq_factor = 1.f;
    c.rope_scaling.high_freq_factor = 4.f;
    c.rope_scaling.original_max_position = gpu ? 32 : 64;
  } else if (variant == "mistral") {
    c.architecture = "mistral";
    c.sliding_window = 8;
    c.num_kv_heads = 4;
  }
  return c;
}

// A cache for model c: f32 on the CPU, bf16 on CUDA (the runners' compute dtypes).
inline KvCacheConfig model_kv_config(const ModelConfig& c, int32_t num_pages, int32_t page_size,
                                     Device device = Device::cpu, bool prefix_cache = false) {
  KvCacheConfig k;
  k.num_layers = c.num_layers;
  k.num_kv_heads = c.num_kv_heads;
  k.head_dim = c.head_dim ? c.head_dim : c.hidden_size / c.num_q_heads;
  k.page_size = page_size;
  k.num_pages = num_pages;
  k.dtype = device == Device::cuda ? DType::bf16 : DType::f32;
  k.device = device;
  k.enable_prefix_cache = prefix_cache;
  return k;
}

// A cache for the scheduler's bookkeeping only (one layer, one head of 4): pages and page size.
inline KvCacheConfig scheduler_kv_config(int32_t num_pages, int32_t page_size) {
  KvCacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 4;
  c.page_size = page_size;
  c.num_pages = num_pages;
  return c;
}

// n token ids in [0, vocab), the same for the same seed.
inline std::vector<int32_t> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::vector<int32_t> t(static_cast<size_t>(n));
  for (int32_t& x : t) x = int32_t(g() % uint64_t(vocab));
  return t;
}

}  // namespace pagedattn::testing
