// The skinny GEMM of decode steps (skinny_gemm_kernel.cuh): Y[T, N] = X[T, K] . W[N, K]^T for
// T <= kSkinnyMaxTokens, bf16 operands, f32 accumulation, deterministic (no atomics on values).
// Host side: the split of K over CTAs, the workspace it needs, and the launch. Compiled as C++17
// (nvcc), so no C++20 headers here.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pagedattn::cuda {

constexpr int kSkinnyMaxTokens = 64;

// How one (N, K) product is cut: `splits` CTAs share each tile's K range. It depends on N, K and
// the GPU only, not on T, so a token's row is computed the same way at every batch size.
struct SkinnyPlan {
  int tiles = 0, splits = 1;
  bool global_partials = false;  // the split's partials go through global memory (lab v1 only)
  size_t partial_floats(int T, int N) const {
    return splits > 1 && global_partials ? size_t(splits) * T * N : 0;
  }
  int counters() const { return splits > 1 && global_partials ? tiles : 0; }
};
SkinnyPlan skinny_gemm_plan(int N, int K, int num_sms, int version = 0);

// True when skinny_gemm can run this shape (1 <= T <= kSkinnyMaxTokens, K a multiple of 8).
bool skinny_gemm_supports(int T, int K);

struct SkinnyArgs {
  const uint16_t* x = nullptr;  // [T, K] bf16
  const uint16_t* w = nullptr;  // [N, K] bf16
  void* y = nullptr;            // [T, N] f32 (y_bf16 false) or bf16
  int T = 0, N = 0, K = 0;
  bool y_bf16 = false;
  bool accumulate = false;       // y += X . W^T (f32 y only)
  float* partial = nullptr;      // plan.partial_floats(T, N) floats
  unsigned* counters = nullptr;  // plan.counters() values, zero before the first launch
  // Launched as a programmatic dependent of the kernel before it on the stream: the CTAs start
  // copying weights while that kernel finishes, and read X once it has (the kernel before should
  // execute griddepcontrol.launch_dependents early for the overlap to happen).
  bool overlap_previous = false;
};

// Launches on `stream`; throws Error for an unsupported shape or a failed launch. version picks a
// kernel configuration (0: the default, v1's; 1.. the lab's numbered ones); plan must come from
// skinny_gemm_plan with the same version.
void skinny_gemm(const SkinnyArgs& a, const SkinnyPlan& plan, cudaStream_t stream, int version = 0);

}  // namespace pagedattn::cuda
