// Decode kernel instances: q f16, KV fp8, head_dim 64/128/256.
#include "decode_kernel.cuh"

namespace pagedattn::cuda {

void launch_decode_f16_fp8(const AttentionParams& p, int head_dim, cudaStream_t s) {
  launch_decode_pair<F16, Fp8>(p, head_dim, s);
}

}  // namespace pagedattn::cuda
