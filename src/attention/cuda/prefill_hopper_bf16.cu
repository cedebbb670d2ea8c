// Hopper prefill kernel instances: q and KV bf16, head_dim 64/128/256.
#include "prefill_hopper_kernel.cuh"

namespace pagedattn::cuda {

void launch_prefill_hopper_bf16(const AttentionParams& p, int head_dim, const HopperMaps& m,
                                cudaStream_t s) {
  launch_prefill_hopper_q<Bf16>(p, head_dim, m, s);
}

// What the runtime knows of one instance (binaryVersion 90: built for sm_90a and loadable here).
cudaError_t prefill_hopper_attributes(cudaFuncAttributes* a) {
  return cudaFuncGetAttributes(a, prefill_hopper_kernel<Bf16, 128, true, false, false>);
}

}  // namespace pagedattn::cuda
