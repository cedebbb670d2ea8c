// The dtype dispatch of the decode kernels (the split-KV merge is fused into them:
// decode_merge.cuh).
#include "cuda_common.cuh"
#include "kernels.h"

namespace pagedattn::cuda {

void launch_decode_bf16_bf16(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_bf16_fp8(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_f16_f16(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_f16_fp8(const AttentionParams& p, int head_dim, cudaStream_t s);
int decode_ctas_per_sm_bf16_bf16(int head_dim, int tc_rows, int group_tile);
int decode_ctas_per_sm_bf16_fp8(int head_dim, int tc_rows, int group_tile);
int decode_ctas_per_sm_f16_f16(int head_dim, int tc_rows, int group_tile);
int decode_ctas_per_sm_f16_fp8(int head_dim, int tc_rows, int group_tile);

void launch_decode(const AttentionParams& p, DType q, DType kv, int head_dim, cudaStream_t s) {
  if (q == DType::bf16 && kv == DType::bf16) return launch_decode_bf16_bf16(p, head_dim, s);
  if (q == DType::bf16 && kv == DType::fp8_e4m3) return launch_decode_bf16_fp8(p, head_dim, s);
  if (q == DType::f16 && kv == DType::f16) return launch_decode_f16_f16(p, head_dim, s);
  if (q == DType::f16 && kv == DType::fp8_e4m3) return launch_decode_f16_fp8(p, head_dim, s);
  fail("paged_attention_cuda: q dtype ", dtype_name(q), " with KV dtype ", dtype_name(kv),
       " is not supported (q: bf16 or f16; KV: q's dtype or fp8_e4m3)");
}

int decode_ctas_per_sm(DType q, DType kv, int head_dim, int tc_rows, int group_tile) {
  const bool fp8 = kv == DType::fp8_e4m3;
  if (q == DType::bf16) {
    return fp8 ? decode_ctas_per_sm_bf16_fp8(head_dim, tc_rows, group_tile)
               : decode_ctas_per_sm_bf16_bf16(head_dim, tc_rows, group_tile);
  }
  return fp8 ? decode_ctas_per_sm_f16_fp8(head_dim, tc_rows, group_tile)
             : decode_ctas_per_sm_f16_f16(head_dim, tc_rows, group_tile);
}

}  // namespace pagedattn::cuda
