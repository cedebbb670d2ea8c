// The host side of the Hopper prefill kernel (prefill_hopper_kernel.cuh): which shapes it takes,
// whether this device runs it, and the tensor maps of each launch (tensor_map.h).
#include "prefill_hopper_kernel.cuh"
#include "tensor_map.h"

namespace pagedattn::cuda {

void launch_prefill_hopper_bf16(const AttentionParams& p, int head_dim, const HopperMaps& m,
                                cudaStream_t s);
void launch_prefill_hopper_f16(const AttentionParams& p, int head_dim, const HopperMaps& m,
                               cudaStream_t s);
void launch_prefill_hopper_bf16_fp8(const AttentionParams& p, int head_dim, const HopperMaps& m,
                                    cudaStream_t s);
void launch_prefill_hopper_f16_fp8(const AttentionParams& p, int head_dim, const HopperMaps& m,
                                   cudaStream_t s);
cudaError_t prefill_hopper_attributes(cudaFuncAttributes* a);

bool prefill_hopper_supported(DType q, DType kv, int head_dim, int group, int page_size,
                              bool gather) {
  // fp8 pools: e4m3 K/V of a bf16 or f16 q, by tensor copies only (into staging tiles).
  const bool fp8 = kv == DType::fp8_e4m3;
  return (q == DType::bf16 || q == DType::f16) && (kv == q || (fp8 && !gather)) &&
         (head_dim == 64 || head_dim == 128 || head_dim == 256) && group >= 1 &&
         kPrefillRows % group == 0 && page_size >= 1 && (gather || page_size % 8 == 0);
}

bool prefill_hopper_available() {
  static PerDeviceAnswers answers;
  return hopper_kernel_runs_here(answers, prefill_hopper_attributes);
}

void launch_prefill_hopper(const AttentionParams& p_in, DType q, DType kv, int head_dim,
                           cudaStream_t s) {
  PA_CHECK(prefill_hopper_supported(q, kv, head_dim, p_in.group, p_in.page_size, p_in.hopper_gather),
           "paged_attention_cuda: no Hopper prefill kernel for q ", dtype_name(q), ", KV ",
           dtype_name(kv), ", head_dim ", head_dim, ", group ", p_in.group, ", page_size ",
           p_in.page_size);
  if (p_in.num_prefill_items == 0) return;
  AttentionParams p = p_in;
  p.tma_box_rows = p.hopper_gather ? 0 : hopper_box_rows(p.page_size, head_dim);
  const int G = p.group, D = head_dim;
  HopperMaps m;
  // q: [num_tokens][num_q_heads][D]; one box = kPrefillRows / G tokens x G heads x 64 dims.
  const cuuint64_t q_dims[3] = {cuuint64_t(D), cuuint64_t(p.num_q_heads), cuuint64_t(p.num_tokens)};
  const cuuint64_t q_strides[2] = {cuuint64_t(D) * 2, cuuint64_t(p.num_q_heads) * D * 2};
  const cuuint32_t q_box[3] = {64, cuuint32_t(G), cuuint32_t(kPrefillRows / G)};
  // pools: [num_pages][num_kv_heads][page_size][D]; one box = tma_box_rows slots x 64 dims.
  const cuuint64_t kv_dims[4] = {cuuint64_t(D), cuuint64_t(p.page_size), cuuint64_t(p.num_kv_heads),
                                 cuuint64_t(p.num_pages)};
  const cuuint64_t kv_strides[3] = {cuuint64_t(D) * 2, cuuint64_t(p.head_stride) * 2,
                                    cuuint64_t(p.page_stride) * 2};
  const cuuint32_t kv_box[4] = {64, cuuint32_t(p.tma_box_rows), 1, 1};
  // NOTE: a gathering launch reads K/V through pointers; its K/V maps stay unused (zeroed).
  m.k = m.v = CUtensorMap{};
  if (kv == DType::fp8_e4m3) {
    // One box = tma_box_rows slots x head_dim bytes, unswizzled (the staging tile's rows).
    const cuuint64_t f_strides[3] = {cuuint64_t(D), cuuint64_t(p.head_stride),
                                     cuuint64_t(p.page_stride)};  // bytes
    const cuuint32_t f_box[4] = {cuuint32_t(D), cuuint32_t(p.tma_box_rows), 1, 1};
    const bool ok = encode_tensor_map_16bit(&m.q, q, p.q, 3, q_dims, q_strides, q_box) &&
                    encode_tensor_map_u8(&m.k, p.k_pages, 4, kv_dims, f_strides, f_box) &&
                    encode_tensor_map_u8(&m.v, p.v_pages, 4, kv_dims, f_strides, f_box);
    // No other prefill kernel takes fp8 pools, and the plan picks this one without looking at the
    // pools' addresses: a pool the tensor maps cannot describe is an error here.
    PA_CHECK(ok, "paged_attention_cuda: the fp8 K/V pools cannot be described by tensor maps "
                 "(a pool is not 16-byte aligned)");
    if (q == DType::bf16) return launch_prefill_hopper_bf16_fp8(p, head_dim, m, s);
    return launch_prefill_hopper_f16_fp8(p, head_dim, m, s);
  }
  const bool ok =
      encode_tensor_map_16bit(&m.q, q, p.q, 3, q_dims, q_strides, q_box) &&
      (p.hopper_gather ||
       (encode_tensor_map_16bit(&m.k, kv, p.k_pages, 4, kv_dims, kv_strides, kv_box) &&
        encode_tensor_map_16bit(&m.v, kv, p.v_pages, 4, kv_dims, kv_strides, kv_box)));
  if (!ok) return launch_prefill(p_in, q, kv, head_dim, s);
  if (q == DType::bf16) return launch_prefill_hopper_bf16(p, head_dim, m, s);
  return launch_prefill_hopper_f16(p, head_dim, m, s);
}

}  // namespace pagedattn::cuda
