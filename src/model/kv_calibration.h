// The private cache of an fp8 calibration pass (Model::kv_absmax): room for one sequence of the
// calibration tokens in 16-token pages, no prefix cache.
#pragma once

#include <cstddef>

#include "pagedattn/kv_cache.h"
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

}  // namespace pagedattn
