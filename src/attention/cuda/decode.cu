// The dtype dispatch of the decode kernels (the split-KV merge is fused into them:
// decode_merge.cuh).
#include "cuda_common.cuh"
#include "kernels.h"

namespace pagedattn::cuda {

void launch_decode_bf16_bf16(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_bf16_fp8(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_f16_f16(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_f16_fp8(const AttentionParams& p, int head_dim, cudaStream_t s);

void launch_decode(const AttentionParams& p, DType q, DType kv, int head_dim, cudaStream_t s) {
  if (q == DType::bf16 && kv == DType::bf16) return launch_decode_bf16_bf16(p, head_dim, s);
  if (q == DType::bf16 && kv == DType::fp8_e4m3) return launch_decode_bf16_fp8(p, head_dim, s);
  if (q == DType::f16 && kv == DType::f16) return launch_decode_f16_f16(p, head_dim, s);
  if (q == DType::f16 && kv == DType::fp8_e4m3) return launch_decode_f16_fp8(p, head_dim, s);
  fail("paged_attention_cuda: q dtype ", dtype_name(q), " with KV dtype ", dtype_name(kv),
       " is not supported (q: bf16 or f16; KV: q's dtype or fp8_e4m3)");
}

}  // namespace pagedattn::cuda
