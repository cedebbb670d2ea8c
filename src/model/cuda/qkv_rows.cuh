// What happens to a token's q, k and v head rows after the qkv product, shared by the kernel
// that does it after the product (llama_kernels.cu's qkv_post) and the product's own epilogue
// (wgmma_gemm.cu's wgmma_gemm_qkv), so that both give the same bits: the bias added, the RoPE
// rotation, and where the row goes (q, k, v or a slot of the page pools, bf16 or fp8).
// Device code, compiled by nvcc.
#pragma once

#include <cstdint>

#include "block_math.cuh"    // pack_bf16x2
#include "llama_kernels.h"   // QkvParams
#include "pagedattn/dtype.h"

namespace pagedattn::cuda {

// x + bias, never fused with the multiplication before it (the product's epilogue scales its sums
// first; qkv_post adds to what the product stored).
__device__ __forceinline__ float add_bias(float x, float b) { return __fadd_rn(x, b); }

// HF rotate_half on one pair (a = x[i], b = x[i + D / 2]) with cos and sin of i, the roundings
// fixed (no contraction left to the compiler).
__device__ __forceinline__ void rope_rotate(float& a, float& b, float c, float s) {
  const float ra = __fmaf_rn(a, c, -__fmul_rn(b, s));
  const float rb = __fmaf_rn(b, c, __fmul_rn(a, s));
  a = ra;
  b = rb;
}

// Where head `head` (q heads first, then k, then v) of token t goes: the bf16 row *dst, or for an
// fp8 pool the byte row *dst8 with 1 / its head's scale. false: the token's slot is outside the
// pools (nothing is stored, as write_kv skips it). k, v: the outputs without pools (p.k_pool null).
__device__ __forceinline__ bool qkv_destination(const QkvParams& p, uint16_t* q, uint16_t* k,
                                                uint16_t* v, int t, int head, uint16_t*& dst,
                                                uint8_t*& dst8, float& inv_scale) {
  const int Hq = p.num_q_heads, Hkv = p.num_kv_heads, D = p.head_dim;
  const bool is_q = head < Hq, is_k = !is_q && head < Hq + Hkv;
  dst8 = nullptr;
  inv_scale = 1.f;
  if (is_q) {
    dst = q + (int64_t(t) * Hq + head) * D;
  } else if (p.k_pool) {  // into the token's slot of the pool (PagedKVView::offset)
    const int32_t slot = p.slots[t];
    if (slot < 0 || slot >= int64_t(p.num_pages) * p.page_size) return false;
    const int h = is_k ? head - Hq : head - Hq - Hkv;
    const int64_t at = (int64_t(slot / p.page_size) * Hkv + h) * p.page_size * D +
                       int64_t(slot % p.page_size) * D;
    void* pool = is_k ? p.k_pool : p.v_pool;
    if (p.fp8) {
      dst8 = static_cast<uint8_t*>(pool) + at;
      inv_scale = 1.f / (is_k ? p.k_scale : p.v_scale)[h];  // (set once, before any step)
    }
    dst = static_cast<uint16_t*>(pool) + at;
  } else if (is_k) {
    dst = k + (int64_t(t) * Hkv + (head - Hq)) * D;
  } else {
    dst = v + (int64_t(t) * Hkv + (head - Hq - Hkv)) * D;
  }
  return true;
}

// V floats as bf16 to p (aligned to V / 2 words; V = 1: one 2-byte store).
template <int V>
__device__ __forceinline__ void store_bf16s(uint16_t* p, const float (&r)[V]) {
  if constexpr (V == 1) {
    p[0] = f32_to_bf16(r[0]);
  } else if constexpr (V == 2) {
    *reinterpret_cast<uint32_t*>(p) = pack_bf16x2(r[0], r[1]);
  } else {
#pragma unroll
    for (int j = 0; j < V; j += 4)
      *reinterpret_cast<uint2*>(p + j) =
          make_uint2(pack_bf16x2(r[j], r[j + 1]), pack_bf16x2(r[j + 2], r[j + 3]));
  }
}

// V floats to p as e4m3(bf16(r) * inv) (write_kv's arithmetic on the bf16 value store_bf16s
// writes); p aligned to V bytes.
template <int V>
__device__ __forceinline__ void store_fp8s(uint8_t* p, const float (&r)[V], float inv) {
  uint8_t b[V];
#pragma unroll
  for (int j = 0; j < V; ++j) b[j] = f32_to_fp8e4m3(bf16_to_f32(f32_to_bf16(r[j])) * inv);
  if constexpr (V == 1) {
    p[0] = b[0];
  } else if constexpr (V == 2) {
    *reinterpret_cast<uint16_t*>(p) = uint16_t(b[0] | (b[1] << 8));
  } else {
#pragma unroll
    for (int j = 0; j < V; j += 4)
      *reinterpret_cast<uint32_t*>(p + j) =
          uint32_t(b[j]) | (uint32_t(b[j + 1]) << 8) | (uint32_t(b[j + 2]) << 16) |
          (uint32_t(b[j + 3]) << 24);
  }
}

// The row's values a = x[i .. i + V), b = x[i + D/2 .. i + D/2 + V) to their destination.
template <int V>
__device__ __forceinline__ void store_pairs(uint16_t* dst, uint8_t* dst8, float inv_scale, int i,
                                            int half, const float (&a)[V], const float (&b)[V]) {
  if (dst8) {
    store_fp8s<V>(dst8 + i, a, inv_scale);
    store_fp8s<V>(dst8 + half + i, b, inv_scale);
    return;
  }
  store_bf16s<V>(dst + i, a);
  store_bf16s<V>(dst + half + i, b);
}

}  // namespace pagedattn::cuda
