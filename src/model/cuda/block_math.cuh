// Small device helpers shared by the model's kernels (llama_kernels.cu, peer_all_reduce.cu,
// wgmma_gemm.cu).
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn::cuda {

// Sum over the block (blockDim.x a multiple of 32, at most 1024); every thread gets the result.
__device__ __forceinline__ float block_sum(float v) {
  __shared__ float partial[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32, warps = blockDim.x / 32;
  __syncthreads();  // partial may still be read by a previous call
  if (lane == 0) partial[warp] = v;
  __syncthreads();
  float s = lane < warps ? partial[lane] : 0.f;
  for (int o = 16; o > 0; o >>= 1) s += __shfl_xor_sync(0xffffffffu, s, o);
  return s;
}

// A row of nv float4 groups (of a [*, 4 nv] f32 row) in registers, thread t of THREADS holding
// groups t, t + THREADS, ...; zeros past the row or for a null p.
template <int VECS, int THREADS>
__device__ __forceinline__ void load_row_groups(const float* p, int nv, float4 (&v)[VECS]) {
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int i = threadIdx.x + k * THREADS;
    v[k] = p && i < nv ? reinterpret_cast<const float4*>(p)[i] : make_float4(0.f, 0.f, 0.f, 0.f);
  }
}

// Two floats -> two bf16 (round to nearest even), the first in the low half.
__device__ __forceinline__ uint32_t pack_bf16x2(float lo, float hi) {
  return uint32_t(f32_to_bf16(lo)) | (uint32_t(f32_to_bf16(hi)) << 16);
}

// A normalised row held as load_row_groups holds it: out[i] = bf16(v * inv * w) for the groups
// below nv.
template <int VECS, int THREADS>
__device__ __forceinline__ void store_normed_row(uint2* out, const float4 (&v)[VECS],
                                                 const float4 (&w)[VECS], float inv, int nv) {
#pragma unroll
  for (int k = 0; k < VECS; ++k) {
    const int i = threadIdx.x + k * THREADS;
    if (i >= nv) continue;
    out[i] = make_uint2(pack_bf16x2(v[k].x * inv * w[k].x, v[k].y * inv * w[k].y),
                        pack_bf16x2(v[k].z * inv * w[k].z, v[k].w * inv * w[k].w));
  }
}

// The argmax fold: (v, i) replaces (best, idx) when v is larger, or equal at a lower index. A NaN v
// compares false both ways and never replaces anything; the order of the folds cannot change the
// result (the lowest index of the largest value), so any reduction tree gives the same answer.
__device__ __forceinline__ void argmax_take(float v, int32_t i, float& best, int32_t& idx) {
  if (v > best || (v == best && i < idx)) {
    best = v;
    idx = i;
  }
}

}  // namespace pagedattn::cuda
