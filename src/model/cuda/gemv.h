// The decode steps' matrix products at a few tokens: y [T, N] = x [T, K] . W [N, K]^T with bf16
// operands and fp32 accumulation, for T <= kGemvMaxTokens, on the CUDA cores.
//
// At one or two tokens a product is a stream of W and little else; cuBLAS's kernels reach only
// 36-46% of the copy rate on one tensor-parallel rank's qkv and o and take 8-9 us on SmolLM2-135M's
// 576-wide projections, where this takes 6 (an H200, cold L2). Here W streams through 16-byte
// loads (evict-first), each thread holding the tokens' matching x values, and the partial sums
// are added in a fixed order: the same bits every call, on every GPU. From four tokens on cuBLAS's
// tensor cores win (gemv_pick). Launched as a programmatic dependent (pdl.h), a CTA loads its
// first 16 bytes of W per row and thread before waiting for the kernel ahead (W must not be
// that kernel's output); PAGEDATTN_GEMV_EARLY=0 loads them after (a comparison). On an H100
// (2026-11-26) that took SmolLM2-135M's step at batch 1 from 0.78 to 0.71-0.72 ms and
// Llama-3-8B's from 5.94-5.96 to 5.91-5.92 ms.
// Versions (kernels_dev/gemv.cu measures them against cuBLAS): 1 and 2, a warp per 2 or 4 rows;
// 3 and 4, a block per 4 or 8 rows with its threads splitting K.
// Compiled as C++17 (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagedattn::cuda {

constexpr int32_t kGemvMaxTokens = 8;
constexpr int kGemvVersions = 4, kGemvDefaultVersion = 3;
constexpr int32_t kGemvWideRows = 12288;  // gemv_pick: N from which version 1 streams faster

struct GemvArgs {
  const uint16_t* x = nullptr;  // [T, K] bf16, rows K apart
  const uint16_t* w = nullptr;  // [N, K] bf16
  void* y = nullptr;            // [T, ldy] f32, or bf16 when y_bf16
  int32_t T = 0, N = 0, K = 0, ldy = 0;
  bool y_bf16 = false;
  bool accumulate = false;  // y += x W^T (f32 y only)
};

// The arguments of y [T, ldy] = x [T, K] W [N, K]^T (f32 y, not accumulated; set y_bf16 or
// accumulate after).
inline GemvArgs product_args(const uint16_t* x, const uint16_t* w, void* y, int32_t T, int32_t N,
                             int32_t K, int32_t ldy) {
  return GemvArgs{x, w, y, T, N, K, ldy};  // (the members in order; y_bf16, accumulate false)
}

// The arguments both decode products (gemv, wgmma_gemm.h) take: 1 <= T <= max_tokens, N >= 1, K a
// positive multiple of 8, x, w and y given, x and w 16-byte aligned, ldy >= N, accumulate only
// into f32.
inline bool product_args_ok(const GemvArgs& a, int32_t max_tokens) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.T >= 1 && a.T <= max_tokens && a.N >= 1 && a.K >= 8 && a.K % 8 == 0 && a.ldy >= a.N &&
         a.x && a.w && a.y && aligned(a.x) && aligned(a.w) && !(a.y_bf16 && a.accumulate);
}
// Whether gemv takes these arguments: product_args_ok up to kGemvMaxTokens tokens.
bool gemv_supported(const GemvArgs& a);
// The version that beats cuBLAS at this shape, or 0 where cuBLAS is as fast or faster. From the
// lab (an H200, 2026-11-26, cold L2): at one token, version 3 on N < 12288 rows (SmolLM2's
// projections 6 us against cuBLAS's 8-9; one tensor-parallel rank's Llama-3-8B o 9.8 against
// 11.3, qkv 13.7 against 14.6) and version 1 on more rows (lm_head 236 against 244 us); at two
// tokens version 3 on N < 12288 only; from four tokens on, cuBLAS (its tensor cores reuse each W
// load across the tokens; these kernels' FMA work grows with them).
int gemv_pick(int32_t T, int32_t N, int32_t K);
// The gate/up product and SwiGLU in one launch, where gemv_pick takes version 3 for the gate/up
// product (one or two tokens, 2 * inter < kGemvWideRows rows): y [T, inter] bf16 =
// silu(g) * u with g, u = x . W[0:inter]^T, x . W[inter:2 inter]^T, each rounded to bf16 first
// (the same bits as the product into bf16 followed by llama_kernels.h's swiglu).
bool gemv_swiglu_takes(int32_t T, int32_t inter, int32_t K);
// a.N = inter, a.w [2 * inter, K], a.y bf16 [T, ldy]. Throws Error on what it does not take.
void gemv_swiglu(const GemvArgs& a, cudaStream_t stream);
// Enqueues the product with `version` (0: kGemvDefaultVersion). Throws Error on arguments
// gemv_supported refuses, an unknown version or a failed launch.
void gemv(const GemvArgs& a, cudaStream_t stream, int version = 0);

}  // namespace pagedattn::cuda
