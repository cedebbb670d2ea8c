// The KV write path on the device: new tokens' K and V into their slots, converted to the pool's
// dtype with exactly write_kv_cpu's arithmetic (dtype.h's conversions, x * (1 / scale) for fp8).
#include "cuda_common.cuh"
#include "pagedattn/attention_cuda.h"
#include "pdl.h"

namespace pagedattn {
namespace {

// Grid-stride over num_tokens * num_kv_heads * head_dim elements. Slots outside the pool are
// skipped (the host validates them when it has a copy).
//   slots: [num_tokens]; k, v: [num_tokens, num_kv_heads, head_dim] (src dtype)
__global__ void write_kv_kernel(const PagedKVView kv, const int32_t* slots, int32_t num_tokens,
                                const void* k, const void* v, DType src) {
  cuda::wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  cuda::allow_dependent_launch();
  const int64_t per_token = int64_t(kv.num_kv_heads) * kv.head_dim;
  const int64_t total = per_token * num_tokens;
  const int64_t total_slots = int64_t(kv.num_pages) * kv.page_size;
  const bool fp8 = kv.dtype == DType::fp8_e4m3;
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < total;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int32_t t = int32_t(i / per_token);
    const int32_t h = int32_t((i % per_token) / kv.head_dim);
    const int32_t d = int32_t(i % kv.head_dim);
    const int32_t slot = slots[t];
    if (slot < 0 || slot >= total_slots) continue;
    const int64_t dst = kv.offset(slot / kv.page_size, h, slot % kv.page_size) + d;
    const float ks = fp8 ? 1.f / kv.k_scale[h] : 1.f;
    const float vs = fp8 ? 1.f / kv.v_scale[h] : 1.f;
    store_from_f32(kv.k_pages, kv.dtype, dst, load_as_f32(k, src, i) * ks);
    store_from_f32(kv.v_pages, kv.dtype, dst, load_as_f32(v, src, i) * vs);
  }
}

}  // namespace

void write_kv_cuda(const PagedKVView& kv, const int32_t* slots, int32_t num_tokens, const void* k,
                   const void* v, DType src_dtype, void* stream, const int32_t* host_slots) {
  PA_CHECK(num_tokens >= 0, "write_kv: num_tokens must be >= 0, got ", num_tokens);
  if (num_tokens == 0) return;
  PA_CHECK(slots && k && v, "write_kv: slots, k and v must not be null");
  PA_CHECK(kv.k_pages && kv.v_pages, "write_kv: the KV pools are null");
  PA_CHECK(src_dtype != DType::fp8_e4m3,
           "write_kv: k/v source dtype must be f32, f16 or bf16, got ", dtype_name(src_dtype));
  const bool fp8 = kv.dtype == DType::fp8_e4m3;
  PA_CHECK(!fp8 || (kv.k_scale && kv.v_scale), "write_kv: fp8 pools need k_scale and v_scale");
  PA_CHECK(kv.num_kv_heads > 0 && kv.head_dim > 0 && kv.page_size > 0,
           "write_kv: kv.num_kv_heads, kv.head_dim and kv.page_size must be > 0");
  if (host_slots) {
    const int64_t total_slots = int64_t(kv.num_pages) * kv.page_size;
    for (int32_t t = 0; t < num_tokens; ++t) {
      PA_CHECK(host_slots[t] >= 0 && host_slots[t] < total_slots, "write_kv: slots[", t,
               "] = ", host_slots[t], " is outside the pool of ", kv.num_pages, " pages x ",
               kv.page_size, " slots");
    }
  }
  const int64_t total = int64_t(num_tokens) * kv.num_kv_heads * kv.head_dim;
  const int threads = 256;
  const int64_t blocks = std::min<int64_t>((total + threads - 1) / threads, 65535);
  cuda::check_cuda(cuda::launch_pdl(write_kv_kernel, dim3(unsigned(blocks)), dim3(threads), 0,
                                    static_cast<cudaStream_t>(stream), kv, slots, num_tokens, k,
                                    v, src_dtype),
                   "write_kv: kernel launch");
}

}  // namespace pagedattn
