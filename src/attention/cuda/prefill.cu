// The dtype dispatch of the tensor-core prefill kernel (prefill_kernel.cuh).
#include "cuda_common.cuh"
#include "kernels.h"

namespace pagedattn::cuda {

void launch_prefill_bf16(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_prefill_f16(const AttentionParams& p, int head_dim, cudaStream_t s);

// NOTE: fp8 pools take the decode kernel for prefill rows (the tensor-core kernel reads K/V tiles
// of q's dtype straight into ldmatrix layout; an fp8 -> bf16 conversion stage is not written yet).
bool prefill_supported(DType q, DType kv, int head_dim) {
  return (q == DType::bf16 || q == DType::f16) && kv == q &&
         (head_dim == 64 || head_dim == 128 || head_dim == 256);
}

void launch_prefill(const AttentionParams& p, DType q, DType kv, int head_dim, cudaStream_t s) {
  PA_CHECK(prefill_supported(q, kv, head_dim), "paged_attention_cuda: no prefill kernel for q ",
           dtype_name(q), ", KV ", dtype_name(kv), ", head_dim ", head_dim);
  if (q == DType::bf16) return launch_prefill_bf16(p, head_dim, s);
  return launch_prefill_f16(p, head_dim, s);
}

}  // namespace pagedattn::cuda
