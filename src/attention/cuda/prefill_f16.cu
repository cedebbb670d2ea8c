// Prefill kernel instances: q and KV f16, head_dim 64/128/256.
#include "prefill_kernel.cuh"

namespace pagedattn::cuda {

void launch_prefill_f16(const AttentionParams& p, int head_dim, cudaStream_t s) {
  launch_prefill_q<F16>(p, head_dim, s);
}

}  // namespace pagedattn::cuda
