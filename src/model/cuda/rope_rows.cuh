// The step's RoPE rows gathered by the kernels that start a step (llama_kernels.h's
// RopeRowsGather). Device code, compiled by nvcc.
#pragma once

#include "llama_kernels.h"  // RopeRowsGather

namespace pagedattn::cuda {

// The token's RoPE rows (RopeRowsGather), by the block of token t.
__device__ __forceinline__ void gather_rope_rows(const RopeRowsGather& g, int t) {
  if (!g.cos) return;
  const int64_t from = int64_t(g.positions[t]) * g.half, to = int64_t(t) * g.half;
  for (int i = threadIdx.x; i < g.half; i += blockDim.x) {
    g.cos[to + i] = g.cos_table[from + i];
    g.sin[to + i] = g.sin_table[from + i];
  }
}

}  // namespace pagedattn::cuda
