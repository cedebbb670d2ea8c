// The decode steps' matrix products at a few dozen tokens on Hopper:
// y [T, N] = x [T, K] . W [N, K]^T with bf16 operands and fp32 accumulation, for
// T <= kWgmmaGemmMaxTokens, on the tensor cores (wgmma), W and x brought into shared memory by
// bulk tensor copies (TMA).
//
// A decode step's product is a stream of W: at 32 tokens cuBLAS reaches 69-74% of the copy rate
// on Llama-3-8B's qkv and o and 36-41% on one tensor-parallel rank's (kernels_dev/gemv.cu and
// wgmma_gemm.cu measure them). Here a CTA owns 128 rows of W (two m64 wgmmas sharing each x tile)
// and a slice of K: one producer warp keeps several 16 KiB stages of W in flight, issuing the
// first before the kernel ahead of it has finished (programmatic dependent launch; x waits for
// it); the K slices of a row block form a thread-block cluster whose CTAs add their partial sums
// through distributed shared memory in slice order, so every call gives the same bits. The
// gate/up product can end in SwiGLU (wgmma_gemm_swiglu), one kernel fewer a layer.
// Compiled as C++17 (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemv.h"  // GemvArgs

namespace pagedattn::cuda {

constexpr int32_t kWgmmaGemmMaxTokens = 64;
// Versions (kernels_dev/wgmma_gemm.cu measures them): the depth of the copy ring, the CTAs per SM
// and the rows per CTA (wgmma_gemm.cu).
constexpr int kWgmmaGemmVersions = 4, kWgmmaGemmDefaultVersion = 1;

// Whether this process can run it: an sm_90 device, a kernel image built for sm_90a and the
// driver's tensor-map encoder (false without a device).
bool wgmma_gemm_available();
// Whether it takes these arguments: 1 <= T <= kWgmmaGemmMaxTokens, N >= 1, K a positive multiple
// of 8, x and w 16-byte aligned, ldy >= N, accumulate only into f32.
bool wgmma_gemm_supported(const GemvArgs& a);
// Whether the model takes it over cuBLAS, where wgmma_gemm_available(): up to
// kWgmmaGemmPickMaxTokens tokens; up to 32 on a W of fewer than kWgmmaGemmMediumElements; up to
// kWgmmaGemmMaxTokens on a W of at most kWgmmaGemmSmallElements or at least
// kWgmmaGemmLargeElements. PAGEDATTN_WGMMA_GEMM=N takes it up to N tokens on every W instead (0:
// never; a comparison). From the lab and the model (an H200 and an H100, 2026-11-26): from 3 to
// 16 tokens it is within 8% of cuBLAS on Llama-3-8B's products alone (gate/up and lm_head faster)
// and, as a programmatic dependent launch, streams its weights in while the kernel before it
// ends: a step at batch 8 takes 3-6% less; from 32 tokens on cuBLAS is faster on the
// middle-sized products (qkv, o, down: this kernel loses 1-4 us more than at 8 tokens, not from
// its x reads: version 4 halves them and is no faster), but not on the largest (lm_head: 359
// against 384 us on an H100), nor on one tensor-parallel rank's qkv and o at 32 tokens, nor on
// SmolLM2-135M's, whose products are a few microseconds of launch and latency.
constexpr int32_t kWgmmaGemmPickMaxTokens = 16;
constexpr int64_t kWgmmaGemmSmallElements = int64_t(1) << 22;
constexpr int64_t kWgmmaGemmMediumElements = int64_t(1) << 24;
constexpr int64_t kWgmmaGemmLargeElements = int64_t(1) << 26;
bool wgmma_gemm_pick(int32_t T, int32_t N, int32_t K);
// The gate/up product and SwiGLU in one launch, where wgmma_gemm_pick takes the gate/up product:
// y [T, inter] bf16 = silu(g) * u with g, u = x . W[0:inter]^T, x . W[inter:2 inter]^T, each
// rounded to bf16 first (as the product into bf16 followed by llama_kernels.h's swiglu).
bool wgmma_gemm_swiglu_takes(int32_t T, int32_t inter, int32_t K);
// a.N = inter, a.w [2 * inter, K], a.y bf16 [T, ldy]. Throws Error on what it does not take.
void wgmma_gemm_swiglu(const GemvArgs& a, cudaStream_t stream);
// Enqueues the product with `version` (0: kWgmmaGemmDefaultVersion). Throws Error on arguments
// wgmma_gemm_supported refuses, an unknown version, a device that cannot run it, a tensor map
// the driver refuses or a failed launch.
void wgmma_gemm(const GemvArgs& a, cudaStream_t stream, int version = 0);

}  // namespace pagedattn::cuda
