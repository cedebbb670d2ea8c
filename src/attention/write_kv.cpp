// The KV write path on the CPU: new tokens' K and V into their slots, converted to the pool dtype.
#include <cmath>

#include "pagedattn/attention.h"
#include "pagedattn/error.h"

namespace pagedattn {

void write_kv_cpu(const PagedKVView& kv, const int32_t* slots, int32_t num_tokens, const void* k,
                  const void* v, DType src_dtype) {
  PA_CHECK(num_tokens >= 0, "write_kv: num_tokens must be >= 0, got ", num_tokens);
  if (num_tokens == 0) return;
  PA_CHECK(slots && k && v, "write_kv: slots, k and v must not be null");
  PA_CHECK(kv.k_pages && kv.v_pages, "write_kv: the KV pools are null");
  PA_CHECK(src_dtype != DType::fp8_e4m3, "write_kv: k/v source dtype must be f32, f16 or bf16, got ",
           dtype_name(src_dtype));
  const bool fp8 = kv.dtype == DType::fp8_e4m3;
  PA_CHECK(!fp8 || (kv.k_scale && kv.v_scale), "write_kv: fp8 pools need k_scale and v_scale");
  const int64_t total_slots = int64_t(kv.num_pages) * kv.page_size;
  // Validate every slot before writing anything.
  for (int32_t t = 0; t < num_tokens; ++t) {
    PA_CHECK(slots[t] >= 0 && slots[t] < total_slots, "write_kv: slots[", t, "] = ", slots[t],
             " is outside the pool of ", kv.num_pages, " pages x ", kv.page_size, " slots");
  }
  const int32_t H = kv.num_kv_heads, D = kv.head_dim;
  for (int32_t t = 0; t < num_tokens; ++t) {
    const int32_t page = slots[t] / kv.page_size, slot = slots[t] % kv.page_size;
    for (int32_t h = 0; h < H; ++h) {
      const int64_t src = (int64_t(t) * H + h) * D;
      const int64_t dst = kv.offset(page, h, slot);
      const float ks = fp8 ? 1.f / kv.k_scale[h] : 1.f;
      const float vs = fp8 ? 1.f / kv.v_scale[h] : 1.f;
      for (int32_t d = 0; d < D; ++d) {
        store_from_f32(kv.k_pages, kv.dtype, dst + d, load_as_f32(k, src_dtype, src + d) * ks);
        store_from_f32(kv.v_pages, kv.dtype, dst + d, load_as_f32(v, src_dtype, src + d) * vs);
      }
    }
  }
}

}  // namespace pagedattn
