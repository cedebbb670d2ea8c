// Tensor-core helpers shared by the prefill and decode kernels: the swizzled tile layout,
// ldmatrix loads and the m16n8k16 mma.sync (bf16 or f16 operands, fp32 accumulation).
#pragma once

#include "cuda_common.cuh"

namespace pagedattn::cuda {

// Element offset of 16-byte chunk c of row r in a swizzled [rows][HEAD_DIM] tile: the chunk index
// is XORed with r % 8 so that the 8 rows an ldmatrix reads hit 8 different bank groups.
template <int HEAD_DIM>
__device__ __forceinline__ int swz(int r, int c) {
  return r * HEAD_DIM + ((c ^ (r & 7)) << 3);
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t* r, const void* smem) {
  const unsigned a = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t* r, const void* smem) {
  const unsigned a = unsigned(__cvta_generic_to_shared(smem));
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(a));
}

// c += a (16x16, row) * b (16x8, col); fp32 accumulate.
template <class Q>
__device__ __forceinline__ void mma16816(float* c, const uint32_t* a, uint32_t b0, uint32_t b1) {
  if constexpr (Q::kDType == DType::bf16) {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, "
        "{%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  } else {
    asm volatile(
        "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
        "{%0,%1,%2,%3};\n"
        : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
        : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
  }
}

// Two floats -> one register of two Q elements (lo in the low half), round to nearest even.
template <class Q>
__device__ __forceinline__ uint32_t pack2(float lo, float hi) {
  return uint32_t(Q::from_float(lo)) | (uint32_t(Q::from_float(hi)) << 16);
}

}  // namespace pagedattn::cuda
