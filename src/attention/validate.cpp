// validate_paged_attention: every argument of the operator checked before any backend runs.
//
// The batch metadata (q_indptr, kv_len, block_table) must be host memory here; the pools and the
// fp8 scales are only checked for presence, never dereferenced (they may live on a device).
#include <cmath>
#include <cstdint>

#include "attention_internal.h"
#include "pagedattn/attention.h"
#include "pagedattn/error.h"

namespace pagedattn {
namespace {

constexpr const char* kOp = "paged_attention";

bool readable_qo_dtype(DType t) { return t == DType::f32 || t == DType::f16 || t == DType::bf16; }

void check_qo(const QKVTensor& t, const char* name) {
  PA_CHECK(t.num_tokens >= 0, kOp, ": ", name, ".num_tokens must be >= 0, got ", t.num_tokens);
  PA_CHECK(t.num_heads > 0, kOp, ": ", name, ".num_heads must be > 0, got ", t.num_heads);
  PA_CHECK(t.head_dim > 0, kOp, ": ", name, ".head_dim must be > 0, got ", t.head_dim);
  PA_CHECK(readable_qo_dtype(t.dtype), kOp, ": ", name, ".dtype must be f32, f16 or bf16, got ",
           dtype_name(t.dtype));
  PA_CHECK(t.num_tokens == 0 || t.data != nullptr, kOp, ": ", name, ".data is null");
}

}  // namespace

void validate_paged_attention(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                              const AttentionOptions& opt, const QKVTensor& out) {
  // ---- shapes and dtypes ----
  check_qo(q, "q");
  check_qo(out, "out");
  PA_CHECK(kv.num_kv_heads > 0, kOp, ": kv.num_kv_heads must be > 0, got ", kv.num_kv_heads);
  PA_CHECK(kv.head_dim > 0, kOp, ": kv.head_dim must be > 0, got ", kv.head_dim);
  PA_CHECK(kv.page_size > 0, kOp, ": kv.page_size must be > 0, got ", kv.page_size);
  PA_CHECK(kv.num_pages >= 0, kOp, ": kv.num_pages must be >= 0, got ", kv.num_pages);
  PA_CHECK(q.head_dim == kv.head_dim, kOp, ": q.head_dim (", q.head_dim,
           ") does not match kv.head_dim (", kv.head_dim, ")");
  PA_CHECK(out.head_dim == kv.head_dim, kOp, ": out.head_dim (", out.head_dim,
           ") does not match kv.head_dim (", kv.head_dim, ")");
  PA_CHECK(out.num_tokens == q.num_tokens, kOp, ": out.num_tokens (", out.num_tokens,
           ") does not match q.num_tokens (", q.num_tokens, ")");
  PA_CHECK(out.num_heads == q.num_heads, kOp, ": out.num_heads (", out.num_heads,
           ") does not match q.num_heads (", q.num_heads, ")");
  PA_CHECK(q.num_heads % kv.num_kv_heads == 0, kOp, ": num_q_heads (", q.num_heads,
           ") is not a multiple of kv.num_kv_heads (", kv.num_kv_heads, ")");
  PA_CHECK(kv.num_pages == 0 || (kv.k_pages != nullptr && kv.v_pages != nullptr), kOp,
           ": kv.k_pages or kv.v_pages is null");
  if (kv.dtype == DType::fp8_e4m3) {
    PA_CHECK(kv.k_scale != nullptr, kOp, ": kv.k_scale is null but the pools are fp8_e4m3 ",
             "(fp8 needs per-head scales; there is no default)");
    PA_CHECK(kv.v_scale != nullptr, kOp, ": kv.v_scale is null but the pools are fp8_e4m3 ",
             "(fp8 needs per-head scales; there is no default)");
  }

  // ---- options ----
  PA_CHECK(std::isfinite(opt.scale), kOp, ": opt.scale must be finite, got ", opt.scale);
  PA_CHECK(opt.window >= 0, kOp, ": opt.window must be >= 0 (0: no window), got ", opt.window);
  PA_CHECK(std::isfinite(opt.softcap) && opt.softcap >= 0.f, kOp,
           ": opt.softcap must be finite and >= 0 (0: off), got ", opt.softcap);

  // ---- the batch ----
  const int32_t n = batch.num_seqs;
  PA_CHECK(n >= 0, kOp, ": batch.num_seqs must be >= 0, got ", n);
  PA_CHECK(batch.max_pages_per_seq >= 0, kOp, ": batch.max_pages_per_seq must be >= 0, got ",
           batch.max_pages_per_seq);
  PA_CHECK(batch.q_indptr != nullptr, kOp, ": batch.q_indptr is null");
  PA_CHECK(batch.q_indptr[0] == 0, kOp, ": q_indptr[0] must be 0, got ", batch.q_indptr[0]);
  PA_CHECK(batch.q_indptr[n] == q.num_tokens, kOp, ": q_indptr[", n, "] = ", batch.q_indptr[n],
           " must equal q.num_tokens (", q.num_tokens, ")");
  if (n == 0) return;
  PA_CHECK(batch.kv_len != nullptr, kOp, ": batch.kv_len is null");
  PA_CHECK(batch.block_table != nullptr || batch.max_pages_per_seq == 0, kOp,
           ": batch.block_table is null");
  const int64_t capacity = int64_t(batch.max_pages_per_seq) * kv.page_size;
  for (int32_t b = 0; b < n; ++b) {
    const int32_t lo = batch.q_indptr[b], hi = batch.q_indptr[b + 1];
    PA_CHECK(hi >= lo, kOp, ": q_indptr must be non-decreasing, but q_indptr[", b + 1, "] = ", hi,
             " < q_indptr[", b, "] = ", lo);
    const int32_t len = batch.kv_len[b];
    PA_CHECK(len >= 0, kOp, ": kv_len[", b, "] must be >= 0, got ", len);
    PA_CHECK(hi - lo <= len, kOp, ": q_len of sequence ", b, " (", hi - lo, ") exceeds kv_len[", b,
             "] = ", len, " (the new tokens must be written to the cache first)");
    PA_CHECK(len <= capacity, kOp, ": kv_len[", b, "] = ", len, " exceeds the block table (",
             batch.max_pages_per_seq, " pages x ", kv.page_size, " tokens)");
    const int32_t used = int32_t((int64_t(len) + kv.page_size - 1) / kv.page_size);
    const int32_t* row = batch.block_table + int64_t(b) * batch.max_pages_per_seq;
    for (int32_t i = 0; i < used; ++i) {
      PA_CHECK(row[i] >= 0 && row[i] < kv.num_pages, kOp, ": block_table[", b, "][", i,
               "] = ", row[i], " is outside the pool of ", kv.num_pages, " pages");
    }
  }
}

}  // namespace pagedattn

namespace pagedattn::detail {

void check_host_fp8_scales(const PagedKVView& kv) {
  if (kv.dtype != DType::fp8_e4m3) return;
  for (int32_t h = 0; h < kv.num_kv_heads; ++h) {
    PA_CHECK(std::isfinite(kv.k_scale[h]) && kv.k_scale[h] > 0.f, kOp, ": kv.k_scale[", h,
             "] = ", kv.k_scale[h], " must be finite and > 0");
    PA_CHECK(std::isfinite(kv.v_scale[h]) && kv.v_scale[h] > 0.f, kOp, ": kv.v_scale[", h,
             "] = ", kv.v_scale[h], " must be finite and > 0");
  }
}

}  // namespace pagedattn::detail
