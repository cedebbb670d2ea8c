// The fp8 KV calibration pass: the CPU runner's absolute maxima of K and V, the built-in text, its
// tokens, and the scales set from them.
#include "kv_calibration.h"

#include <algorithm>
#include <cmath>
#include <random>

#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn {

Model::KvAbsMax LlamaModel::kv_absmax(const std::vector<int32_t>& tokens) {
  PA_CHECK(!tokens.empty(), "kv_absmax: tokens are empty");
  KvCache cache(calibration_cache_config(config_, tokens.size(), Device::cpu, DType::f32));
  const ForwardBatch b = calibration_batch(cache, tokens);
  KvAbsMax m;
  const size_t n = size_t(config_.num_layers) * size_t(config_.num_kv_heads);
  m.k.assign(n, 0.f);
  m.v.assign(n, 0.f);
  absmax_ = &m;
  try {
    forward(b, cache);
  } catch (...) {
    absmax_ = nullptr;
    throw;
  }
  absmax_ = nullptr;
  return m;
}

void LlamaModel::observe_kv(int32_t layer, int32_t num_tokens) {
  const int32_t H = config_.num_kv_heads, D = config_.head_dim;
  for (int32_t t = 0; t < num_tokens; ++t) {
    for (int32_t h = 0; h < H; ++h) {
      const size_t i = size_t(layer) * size_t(H) + size_t(h);
      const float* k = ws_.k.data() + (int64_t(t) * H + h) * D;
      const float* v = ws_.v.data() + (int64_t(t) * H + h) * D;
      for (int32_t d = 0; d < D; ++d) {
        absmax_->k[i] = std::max(absmax_->k[i], std::abs(k[d]));
        absmax_->v[i] = std::max(absmax_->v[i], std::abs(v[d]));
      }
    }
  }
}

std::string_view kv_calibration_text() {
  return "The history of science is the study of how people came to understand the natural world. "
         "In 1687, Isaac Newton published the Principia, which described the laws of motion and "
         "universal gravitation. Two centuries later, Maxwell's equations united electricity, "
         "magnetism and light. Question: what is 17 multiplied by 23? Answer: 391.\n\n"
         "def fibonacci(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n"
         "    return a\n\nParis is the capital of France; Tokyo, of Japan; Brasília, of Brazil. "
         "The weather today is sunny with a light breeze, and the market opens at 9:30 AM.";
}

std::vector<int32_t> kv_calibration_tokens(const Tokenizer* tokenizer, int32_t vocab_size) {
  if (tokenizer) return tokenizer->encode(kv_calibration_text(), true, false);
  PA_CHECK(vocab_size > 0, "kv_calibration_tokens: vocab_size must be positive, got ", vocab_size);
  // NOTE: a model without a tokenizer (a synthetic one, a bare test folder) still needs scales
  // from real activations: a fixed pseudo-random stream gives repeatable ones.
  std::mt19937 g(1234);
  std::vector<int32_t> ids;
  for (int i = 0; i < 256; ++i) ids.push_back(int32_t(g() % uint32_t(vocab_size)));
  return ids;
}

void calibrate_kv_scales(Model& model, KvCache& cache, const std::vector<int32_t>& tokens,
                         float headroom) {
  PA_CHECK(headroom >= 1.f, "calibrate_kv_scales: headroom must be >= 1, got ", headroom);
  PA_CHECK(cache.config().dtype == DType::fp8_e4m3, "calibrate_kv_scales: the cache dtype is ",
           dtype_name(cache.config().dtype), ", scales apply to fp8_e4m3 only");
  set_kv_scales(cache, model.kv_absmax(tokens), headroom);
  model.kv_scales_calibrated(headroom);
}

void set_kv_scales(KvCache& cache, const Model::KvAbsMax& m, float headroom) {
  PA_CHECK(headroom >= 1.f, "calibrate_kv_scales: headroom must be >= 1, got ", headroom);
  const KvCacheConfig& kc = cache.config();
  PA_CHECK(kc.dtype == DType::fp8_e4m3, "calibrate_kv_scales: the cache dtype is ",
           dtype_name(kc.dtype), ", scales apply to fp8_e4m3 only");
  const size_t H = size_t(kc.num_kv_heads);
  PA_CHECK(m.k.size() == size_t(kc.num_layers) * H && m.v.size() == m.k.size(),
           "calibrate_kv_scales: the model's layers and KV heads do not match the cache");
  constexpr float kFp8Max = 448.f, kMinScale = 1e-6f;
  for (int32_t l = 0; l < kc.num_layers; ++l) {
    std::vector<float> ks(H), vs(H);
    for (size_t h = 0; h < H; ++h) {
      ks[h] = std::max(m.k[size_t(l) * H + h] * headroom / kFp8Max, kMinScale);
      vs[h] = std::max(m.v[size_t(l) * H + h] * headroom / kFp8Max, kMinScale);
    }
    cache.set_scales(l, ks, vs);
  }
}

}  // namespace pagedattn
