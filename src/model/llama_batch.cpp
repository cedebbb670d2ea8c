// Step batches for simple drivers (CLI, tests, benchmarks), Model's default greedy step and the fp8
// KV calibration pass.
#include <algorithm>
#include <cmath>

#include "kv_calibration.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/sampling.h"

namespace pagedattn {

ForwardBatch make_forward_batch(KvCache& cache, const std::vector<SeqId>& seqs,
                                const std::vector<std::vector<int32_t>>& new_tokens,
                                bool all_logits) {
  PA_CHECK(seqs.size() == new_tokens.size(), "make_forward_batch: ", seqs.size(),
           " seqs but new_tokens for ", new_tokens.size());
  int64_t pages = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    PA_CHECK(cache.has_sequence(seqs[s]), "make_forward_batch: seqs[", s, "] = ", seqs[s],
             " is not in the cache");
    pages += cache.pages_needed(seqs[s], int32_t(new_tokens[s].size()));
  }
  const KvCacheStats st = cache.stats();
  PA_CHECK(pages <= int64_t(st.pages_free) + st.pages_cached,
           "make_forward_batch: new_tokens need ", pages, " pages but only ",
           st.pages_free + st.pages_cached, " are available");
  ForwardBatch b;
  b.seqs = seqs;
  b.q_indptr.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int32_t start = cache.kv_len(seqs[s]);
    const std::vector<int32_t> slots = cache.append_slots(seqs[s], new_tokens[s]);
    for (size_t j = 0; j < new_tokens[s].size(); ++j) {
      if (all_logits || j + 1 == new_tokens[s].size()) {
        b.logit_rows.push_back(int32_t(b.tokens.size()));
      }
      b.tokens.push_back(new_tokens[s][j]);
      b.positions.push_back(start + int32_t(j));
      b.slots.push_back(slots[j]);
    }
    b.q_indptr.push_back(int32_t(b.tokens.size()));
  }
  return b;
}

std::vector<int32_t> Model::forward_greedy(const ForwardBatch& batch, KvCache& cache) {
  const Tensor logits = forward(batch, cache);  // [R, vocab]
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    ids[size_t(r)] =
        argmax(std::span<const float>(logits.data_as<float>() + r * vocab, size_t(vocab)));
  }
  return ids;
}

Model::KvAbsMax Model::kv_absmax(const std::vector<int32_t>&) {
  fail("kv_absmax: this model runner has no calibration pass");
}

Model::KvAbsMax LlamaModel::kv_absmax(const std::vector<int32_t>& tokens) {
  PA_CHECK(!tokens.empty(), "kv_absmax: tokens are empty");
  KvCache cache(calibration_cache_config(config_, tokens.size(), Device::cpu, DType::f32));
  const SeqId seq = cache.create_sequence();
  ForwardBatch b = make_forward_batch(cache, {seq}, {tokens});
  b.logit_rows.clear();
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

void calibrate_kv_scales(Model& model, KvCache& cache, const std::vector<int32_t>& tokens,
                         float headroom) {
  PA_CHECK(headroom >= 1.f, "calibrate_kv_scales: headroom must be >= 1, got ", headroom);
  const KvCacheConfig& kc = cache.config();
  PA_CHECK(kc.dtype == DType::fp8_e4m3, "calibrate_kv_scales: the cache dtype is ",
           dtype_name(kc.dtype), ", scales apply to fp8_e4m3 only");
  const Model::KvAbsMax m = model.kv_absmax(tokens);
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
