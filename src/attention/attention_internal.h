// Helpers shared by the host backends of the attention operator (not part of the public API).
#pragma once

#include <cmath>

#include "pagedattn/attention.h"

namespace pagedattn::detail {

// The effective softmax scale: opt.scale, or 1/sqrt(head_dim) when it is 0.
inline float attention_scale(const AttentionOptions& opt, int32_t head_dim) {
  return opt.scale != 0.f ? opt.scale : 1.f / std::sqrt(float(head_dim));
}

// fp8 pools on the host: every per-head scale must be finite and > 0 (throws Error naming it).
void check_host_fp8_scales(const PagedKVView& kv);

}  // namespace pagedattn::detail
