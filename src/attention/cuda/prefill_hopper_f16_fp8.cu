// Hopper prefill kernel instances: q f16, KV fp8 (e4m3), head_dim 64/128/256.
#include "prefill_hopper_kernel.cuh"

namespace pagedattn::cuda {

void launch_prefill_hopper_f16_fp8(const AttentionParams& p, int head_dim, const HopperMaps& m,
                                   cudaStream_t s) {
  launch_prefill_hopper_q<F16, true>(p, head_dim, m, s);
}

}  // namespace pagedattn::cuda
