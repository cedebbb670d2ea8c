// The split-KV merge pass, and the dtype dispatch of the decode kernel.
#include "cuda_common.cuh"
#include "kernels.h"

namespace pagedattn::cuda {

void launch_decode_bf16_bf16(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_bf16_fp8(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_f16_f16(const AttentionParams& p, int head_dim, cudaStream_t s);
void launch_decode_f16_fp8(const AttentionParams& p, int head_dim, cudaStream_t s);

namespace {

// Grid: x = merge items, y = num_q_heads. Block: head_dim threads, one output element each.
// Merges the row's chunk states in position order with merge_state, as the decode kernel does.
template <class Q>
__global__ void merge_kernel(const AttentionParams p, int head_dim, bool fp8) {
  const MergeItem mi = p.merge_items[blockIdx.x];
  const int h = blockIdx.y, dim = threadIdx.x;
  SoftmaxState run{-INFINITY, 0.f, 0.f};
  for (int c = 0; c < mi.num_chunks; ++c) {
    const int64_t slot = int64_t(mi.partial + c) * p.num_q_heads + h;
    merge_state(run, p.partial_md[slot * 2], p.partial_md[slot * 2 + 1],
                p.partial_o[slot * head_dim + dim]);
  }
  const float v_mul = fp8 ? p.v_scale[h / p.group] : 1.f;
  uint16_t* out = static_cast<uint16_t*>(p.out);
  out[(int64_t(mi.q_row) * p.num_q_heads + h) * head_dim + dim] =
      Q::from_float(finalize_state(run, v_mul));
}

}  // namespace

void launch_decode(const AttentionParams& p, DType q, DType kv, int head_dim, cudaStream_t s) {
  if (q == DType::bf16 && kv == DType::bf16) return launch_decode_bf16_bf16(p, head_dim, s);
  if (q == DType::bf16 && kv == DType::fp8_e4m3) return launch_decode_bf16_fp8(p, head_dim, s);
  if (q == DType::f16 && kv == DType::f16) return launch_decode_f16_f16(p, head_dim, s);
  if (q == DType::f16 && kv == DType::fp8_e4m3) return launch_decode_f16_fp8(p, head_dim, s);
  fail("paged_attention_cuda: q dtype ", dtype_name(q), " with KV dtype ", dtype_name(kv),
       " is not supported (q: bf16 or f16; KV: q's dtype or fp8_e4m3)");
}

void launch_merge(const AttentionParams& p, DType q, DType kv, int head_dim, cudaStream_t s) {
  if (p.num_merge_items == 0) return;
  const dim3 grid(unsigned(p.num_merge_items), unsigned(p.num_q_heads));
  const bool fp8 = kv == DType::fp8_e4m3;
  if (q == DType::bf16) {
    merge_kernel<Bf16><<<grid, head_dim, 0, s>>>(p, head_dim, fp8);
  } else {
    merge_kernel<F16><<<grid, head_dim, 0, s>>>(p, head_dim, fp8);
  }
  check_launch("paged_attention_cuda: merge kernel launch");
}

}  // namespace pagedattn::cuda
