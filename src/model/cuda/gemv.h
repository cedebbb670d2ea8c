// The decode steps' matrix products at a few tokens: y [T, N] = x [T, K] . W [N, K]^T with bf16
// operands and fp32 accumulation, for T <= kGemvMaxTokens, on the CUDA cores.
//
// At so few tokens a product is a stream of W and nothing else; cuBLAS's kernels for it carry a
// fixed cost of about 7 us (an H200 at SmolLM2-135M's 576-wide projections: 2-12% of the copy
// rate) and reach 36-63% of the copy rate on one rank's share of Llama-3-8B's o and qkv. Here each
// warp streams R rows of W in 16-byte loads (evict-first), each lane holding the tokens' matching
// x values, and sums its lanes at the end: the same order every call, on every GPU.
// kernels_dev/gemv.cu measures it against cuBLAS (versions: R = 2 and 4).
// Compiled as C++17 (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagedattn::cuda {

constexpr int32_t kGemvMaxTokens = 8;

struct GemvArgs {
  const uint16_t* x = nullptr;  // [T, K] bf16, rows K apart
  const uint16_t* w = nullptr;  // [N, K] bf16
  void* y = nullptr;            // [T, ldy] f32, or bf16 when y_bf16
  int32_t T = 0, N = 0, K = 0, ldy = 0;
  bool y_bf16 = false;
  bool accumulate = false;  // y += x W^T (f32 y only)
};

// Whether gemv takes these arguments: 1 <= T <= kGemvMaxTokens, K a multiple of 8, x and w
// 16-byte aligned, ldy >= N, accumulate only into f32.
bool gemv_supported(const GemvArgs& a);
// Enqueues the product; rows_per_warp 2 or 4 (0: the default, 4). Throws Error on arguments
// gemv_supported refuses or a failed launch.
void gemv(const GemvArgs& a, cudaStream_t stream, int rows_per_warp = 0);

}  // namespace pagedattn::cuda
