// Decode kernel instances: q f16, KV fp8, head_dim 64/128/256.
#include "decode_kernel.cuh"

namespace pagedattn::cuda {

void launch_decode_f16_fp8(const AttentionParams& p, int head_dim, cudaStream_t s) {
  launch_decode_pair<F16, Fp8>(p, head_dim, s);
}

int decode_ctas_per_sm_f16_fp8(int head_dim, int tc_rows, int group_tile) {
  return decode_ctas_per_sm_pair<F16, Fp8>(head_dim, tc_rows, group_tile);
}

}  // namespace pagedattn::cuda
