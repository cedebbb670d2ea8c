// Prefill kernel instances: q and KV bf16, head_dim 64/128/256.
#include "prefill_kernel.cuh"

namespace pagedattn::cuda {

void launch_prefill_bf16(const AttentionParams& p, int head_dim, cudaStream_t s) {
  launch_prefill_q<Bf16>(p, head_dim, s);
}

}  // namespace pagedattn::cuda
