// The private cache of an fp8 calibration pass (Model::kv_absmax): room for one sequence of the
// calibration tokens in 16-token pages, no prefix cache; and the pass's one step.
#pragma once

#include <cstddef>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"
#include "pagedattn/model_file.h"

namespace pagedattn {

inline KvCacheConfig calibration_cache_config(const ModelConfig& c, size_t num_tokens,
                                              Device device, DType dtype) {
  KvCacheConfig kc;
  kc.num_layers = c.num_layers;
  kc.num_kv_heads = c.num_kv_heads;
  kc.head_dim = c.head_dim;
  kc.page_size = 16;
  kc.num_pages = int32_t((num_tokens + 15) / 16);
  kc.dtype = dtype;
  kc.device = device;
  kc.enable_prefix_cache = false;
  return kc;
}

// Every layer's scales of an fp8 `cache` from the maxima of its KV heads (kv_absmax): scale =
// absmax * headroom / 448 (calibrate_kv_scales' rule; tensor-parallel ranks set theirs with it).
void set_kv_scales(KvCache& cache, const Model::KvAbsMax& m, float headroom);

// The pass's step: the tokens as one fresh sequence of `cache` (sized by calibration_cache_config),
// no logit rows.
inline ForwardBatch calibration_batch(KvCache& cache, const std::vector<int32_t>& tokens) {
  ForwardBatch b;
  b.seqs = {cache.create_sequence()};
  b.tokens = tokens;
  b.slots = cache.append_slots(b.seqs[0], tokens);
  b.q_indptr = {0, int32_t(tokens.size())};
  for (size_t i = 0; i < tokens.size(); ++i) b.positions.push_back(int32_t(i));
  set_attention_layout(b, cache);
  return b;
}

}  // namespace pagedattn
