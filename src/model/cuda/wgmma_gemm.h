// The decode steps' matrix products at a few dozen tokens on Hopper:
// y [T, N] = x [T, K] . W [N, K]^T with bf16 operands and fp32 accumulation, for
// T <= kWgmmaGemmMaxTokens, on the tensor cores (wgmma), W and x brought into shared memory by
// bulk tensor copies (TMA).
//
// A decode step's product is a stream of W: at 32 tokens cuBLAS reaches 69-74% of the copy rate
// on Llama-3-8B's qkv and o and 36-41% on one tensor-parallel rank's (kernels_dev/gemv.cu and
// wgmma_gemm.cu measure them). Here a CTA owns 64 or 128 rows of W (one or two m64 wgmmas sharing
// each x tile) and a slice of K: one producer warp keeps a ring of W stages in flight (up to about
// 200 KiB), issuing them before the kernel ahead of it has finished (programmatic dependent
// launch; x waits for it); the K slices of a row block form a thread-block cluster whose CTAs add
// their partial sums through distributed shared memory in slice order, so every call gives the
// same bits. The gate/up product can end in SwiGLU (wgmma_gemm_swiglu), one kernel fewer a
// layer; an RMSNorm between two products can be folded into them (NormFold), two fewer; the qkv
// product can end in the RoPE kernel's work (wgmma_gemm_qkv), one fewer.
// Compiled as C++17 (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "gemv.h"           // GemvArgs
#include "llama_kernels.h"  // QkvParams

namespace pagedattn::cuda {

constexpr int32_t kWgmmaGemmMaxTokens = 64;
// Versions (kernels_dev/wgmma_gemm.cu measures them): the depth of the copy ring, the CTAs per SM
// and the rows per CTA (wgmma_gemm.cu).
constexpr int kWgmmaGemmVersions = 6, kWgmmaGemmDefaultVersion = 5;
// The version of the products of weights of at most this many elements (wgmma_gemm_version_for).
constexpr int64_t kWgmmaGemmSmallElements = int64_t(1) << 22;
// The version of the gate/up product with SwiGLU: its 64-row version (32 gate and 32 up rows a
// CTA) made Llama-3-8B's step 4-5% longer at 8-64 sequences than this one (an H100, 2026-11-26).
constexpr int kWgmmaGemmSwigluVersion = 1;
// The version of a tensor-parallel rank's o product (64 rows a CTA, a ring of about 100 KiB, two
// CTAs an SM): its CTAs fit beside the attention kernel's before it (96 KiB, one an SM on a
// rank's grid) and can start their copies while it runs. Two H100s, Llama-3-8B: batch 32 0.5-1.6%
// shorter steps, 64 0.4-0.6% (one GPU, with two attention CTAs an SM: 0.7% longer at 64).
constexpr int kWgmmaGemmBesideAttentionVersion = 6;
// The version of a tensor-parallel rank's qkv product, behind the peer all-reduce: two 64-row
// CTAs an SM, so its 48 row blocks at Llama-3-8B's 3072 rows a rank take up to five K slices
// each (as many as fit the GPU at once) instead of version 5's two on 96 SMs. Its rings fill
// while the all-reduce runs; what is left when x comes is each CTA's run through its stages,
// shorter the more slices there are (versions of three and four CTAs an SM, more slices still,
// were slower). Two H100s, Llama-3-8B, 512-token prompts: batch 32 3.838-3.846 ms a step against
// 3.891-3.896 on version 5, 64 4.503-4.509 against 4.522-4.537, level at 1; one GPU, where qkv
// follows the down product, level to 0.2% slower on it: version 5 kept there.
constexpr int kWgmmaGemmBehindReduceVersion = 6;
// The version of the qkv product that ends in qkv_post's work (wgmma_gemm_qkv) on weights of more
// than kWgmmaGemmSmallElements: version 6's CTAs take more K slices, whose cluster shares out the
// epilogue's groups, where version 5's one CTA a row block stores all of its own at the kernel's
// end. One H100, Llama-3-8B, 512-token prompts: batch 32 6.486-6.492 ms a step against
// 6.513-6.515 on version 5 and 6.496-6.502 with the product and qkv_post on version 5.
constexpr int kWgmmaGemmQkvVersion = 6;

// An RMSNorm folded into the products on either side of it (a decode step's norms at 3-64 tokens:
// one launch a norm fewer). rms_norm(h) W^T, with out = bf16(h * r * g) and r = rsqrt(mean(h^2) +
// eps) per token, becomes r * (bf16(h * g) W^T): the product that writes h (an f32 product
// accumulated into the residual stream) also writes bf16(h * g) and the sums of squares of h over
// each 64 of its rows; the product that reads bf16(h * g) sums those and scales its output rows
// by r. The roundings differ from the norm kernel's (g * h rounded before r is applied), by as
// much as one bf16 rounding of the product's input.
struct NormFold {
  enum Mode { kNone, kProduce, kConsume };
  Mode mode = kNone;
  // kProduce: weight [N] (the norm's g), out [T, N] bf16 = bf16(y * weight) after the
  // accumulation, sq[t * sq_ld + i] = sum of y[t, 64 i .. 64 i + 63]^2 (sq 16-byte aligned,
  // sq_ld a multiple of 4, at least ceil(N / 64)).
  const float* weight = nullptr;
  uint16_t* out = nullptr;
  // kConsume: y[t] = rsqrt(sum over i < ceil(K / 64) of sq[t * sq_ld + i] / K + eps) * x[t] W^T
  // (SwiGLU: gate and up both scaled before their rounding).
  float* sq = nullptr;
  int32_t sq_ld = 0;
  float eps = 0.f;
};
// Whether `f` fits the product `a`: kProduce on an accumulated f32 product with its buffers given
// and sq as above for N values a token; kConsume on a product that does not accumulate, sq as
// above for K.
bool norm_fold_ok(const GemvArgs& a, const NormFold& f);

// Whether this process can run it: an sm_90 device, a kernel image built for sm_90a and the
// driver's tensor-map encoder (false without a device).
bool wgmma_gemm_available();
// Whether it takes these arguments: product_args_ok (gemv.h) up to kWgmmaGemmMaxTokens tokens.
bool wgmma_gemm_supported(const GemvArgs& a);
// Whether the model takes it over cuBLAS, where wgmma_gemm_available(): up to
// kWgmmaGemmMaxTokens tokens on every weight (gemv takes one or two first).
// PAGEDATTN_WGMMA_GEMM=N takes it up to N tokens instead (0: never; a comparison). Alone
// (kernels_dev/wgmma_gemm.cu, cold L2) it is level with cuBLAS at 8-16 tokens and slower on the
// middle-sized products from 32; in the model it is faster at every batch from 4 to 64 (an H100,
// 2026-11-26: Llama-3-8B's step 4-6% shorter at 8 and 32 sequences, 3% at 64), because as a
// programmatic dependent launch it streams up to 200 KiB of W per SM in while the kernel before
// it ends.
bool wgmma_gemm_pick(int32_t T, int32_t N, int32_t K);
// The gate/up product and SwiGLU in one launch, where wgmma_gemm_pick takes the gate/up product:
// y [T, inter] bf16 = silu(g) * u with g, u = x . W[0:inter]^T, x . W[inter:2 inter]^T, each
// rounded to bf16 first (as the product into bf16 followed by llama_kernels.h's swiglu).
bool wgmma_gemm_swiglu_takes(int32_t T, int32_t inter, int32_t K);
// a.N = inter, a.w [2 * inter, K], a.y bf16 [T, ldy]; version 0: kWgmmaGemmSwigluVersion.
// Throws Error on what it does not take.
// `fold`: kConsume only (or null).
void wgmma_gemm_swiglu(const GemvArgs& a, cudaStream_t stream, int version = 0,
                       const NormFold* fold = nullptr);
// The version the model runs at this shape: 1 on weights of at most kWgmmaGemmSmallElements,
// kWgmmaGemmDefaultVersion on the others (PAGEDATTN_WGMMA_GEMM_VERSION=v: v everywhere).
int wgmma_gemm_version_for(int32_t T, int32_t N, int32_t K);
// Enqueues the product with `version` (0: wgmma_gemm_version_for's). Throws Error on arguments
// wgmma_gemm_supported refuses, an unknown version, a device that cannot run it, a tensor map
// the driver refuses or a failed launch; `fold` (or null) where norm_fold_ok refuses it.
void wgmma_gemm(const GemvArgs& a, cudaStream_t stream, int version = 0,
                const NormFold* fold = nullptr);

// The qkv product and what qkv_post does after it in one launch, for weights whose rows are in
// interleave_rope_rows' order: each group of 4 sums is two whole RoPE pairs of a head, which the
// epilogue takes from the cluster's sums as qkv_post would take them from an f32 qkv (bias, the
// rotation of q and k, bf16 q, k and v straight into their pool slots, bf16 or fp8), with the
// same arithmetic (qkv_rows.cuh): the same bits as wgmma_gemm into f32 followed by qkv_post with
// p.interleaved, without the f32 qkv written and read again or the kernel between. Not with a
// per-head norm of q and k (Qwen3), whose sums span a head's row blocks.
//   a: x [T, K] bf16, w [(Hq + 2 Hkv) D, K] in that order; a.y not written (but set, as
//   wgmma_gemm_supported asks)
//   e.p: qkv_post's parameters with k_pool and interleaved set (q to e.q); e.bias [(Hq + 2 Hkv) D] f32 in the
//   heads' own order, or null; e.cos, e.sin [T, D / 2] f32 (each token's rows)
struct QkvEpilogue {
  QkvParams p;
  const float* bias = nullptr;
  const float* cos = nullptr;
  const float* sin = nullptr;
  uint16_t* q = nullptr;  // [T, Hq, D] bf16
};
// The versions it runs (the model's qkv products: 1 for small weights, 5, 6 behind an all-reduce).
bool wgmma_gemm_qkv_version_ok(int version);
// version 0: wgmma_gemm_version_for's. `fold`: kConsume only (or null). Throws Error where
// wgmma_gemm would, on a version it does not run, and on parameters that do not describe the
// product (a.N (Hq + 2 Hkv) D, D 64, 128 or 256, no pools, no slots or cos and sin, p.num_tokens
// not a.T, p.interleaved not set, an accumulated or bf16 product).
void wgmma_gemm_qkv(const GemvArgs& a, const QkvEpilogue& e, cudaStream_t stream, int version = 0,
                    const NormFold* fold = nullptr);

// The greedy step's lm_head without its logits: ids [T] = each token's argmax over the N outputs
// of x W^T, with argmax_rows's rules and answer (llama_kernels.h: the lowest index of the largest
// value; NaNs never win, except that a NaN output 0 gives 0). Each CTA's product goes to its
// (largest value, lowest index) per token in pairs [T, row blocks] instead of y (a.y is not used:
// 2 x 16 MB of f32 logits written and read again at 32 tokens with a 128K vocabulary, and the
// argmax kernel's launch), then argmax_combine_by_row folds the blocks. Version 1's configuration
// (128 rows a CTA), a.accumulate and a.y_bf16 false; throws Error as wgmma_gemm does. pairs holds
// wgmma_gemm_argmax_blocks(N) x T.
struct ArgmaxPair;
int32_t wgmma_gemm_argmax_blocks(int32_t N);
// Whether the model takes it for its lm_head at this shape: wgmma_gemm_pick's answer, unless
// PAGEDATTN_LM_HEAD_ARGMAX=0 (the product and argmax_rows instead; a comparison).
bool wgmma_gemm_argmax_takes(int32_t T, int32_t N, int32_t K);
void wgmma_gemm_argmax(const GemvArgs& a, ArgmaxPair* pairs, int32_t* ids, cudaStream_t stream);
// The same over a tensor-parallel rank's slice of the vocabulary (a.w its rows, ids vocab0 on):
// out [T] = each token's pair as argmax_rows_slice gives it over the slice's logits (the rule of a
// NaN output 0 only where vocab0 is 0), for argmax_combine across the ranks.
void wgmma_gemm_argmax_slice(const GemvArgs& a, int32_t vocab0, ArgmaxPair* pairs,
                             ArgmaxPair* out, cudaStream_t stream);

}  // namespace pagedattn::cuda
