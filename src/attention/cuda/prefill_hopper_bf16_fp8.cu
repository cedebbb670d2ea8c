// Hopper prefill kernel instances: q bf16, KV fp8 (e4m3), head_dim 64/128/256.
#include "prefill_hopper_kernel.cuh"

namespace pagedattn::cuda {

void launch_prefill_hopper_bf16_fp8(const AttentionParams& p, int head_dim, const HopperMaps& m,
                                   cudaStream_t s) {
  launch_prefill_hopper_q<Bf16, true>(p, head_dim, m, s);
}

}  // namespace pagedattn::cuda
