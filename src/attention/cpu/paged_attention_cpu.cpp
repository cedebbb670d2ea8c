// paged_attention_cpu: plans a call into work items, then runs them on the thread pool with the
// widest kernel variant this CPU supports. Also the dense no-paging baseline (same kernel body).
#include <algorithm>
#include <array>
#include <cstdlib>
#include <numeric>
#include <string_view>
#include <vector>

#include "attention_internal.h"
#include "cpu/cpu_attention.h"
#include "cpu/kernel_types.h"
#include "pagedattn/attention.h"
#include "pagedattn/error.h"
#include "pagedattn/thread_pool.h"

namespace pagedattn {
namespace cpu {
namespace {

// Query vectors (rows x heads of a GQA group) per work item: enough to reuse each K/V tile many
// times, few enough that the item's queries and outputs stay in L2.
constexpr int32_t kTargetVectors = 64;

// Widest variant this CPU supports: 0 generic, 1 avx2, 2 avx512 (PAGEDATTN_CPU_ISA=generic|avx2
// caps it).
int cpu_level() {
  static const int level = [] {
    int l = 0;
#if defined(__GNUC__) && defined(__x86_64__)
    __builtin_cpu_init();
    if (__builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")) l = 1;
    if (l == 1 && __builtin_cpu_supports("avx512f") && __builtin_cpu_supports("avx512bw") &&
        __builtin_cpu_supports("avx512dq") && __builtin_cpu_supports("avx512vl"))
      l = 2;
#endif
    if (const char* env = std::getenv("PAGEDATTN_CPU_ISA")) {
      const std::string_view want(env);
      if (want == "generic")
        l = 0;
      else if (want == "avx2")
        l = std::min(l, 1);
    }
    return l;
  }();
  return level;
}

// The instantiation for p on the variant (nullptr when this build or CPU lacks it).
ItemFn item_fn(const KernelParams& p, CpuIsa isa) {
  switch (isa) {
    case CpuIsa::generic:
      return select_item_fn_generic(p);
    case CpuIsa::avx2:
      return cpu_level() >= 1 ? select_item_fn_avx2(p) : nullptr;
    case CpuIsa::avx512:
      return cpu_level() >= 2 ? select_item_fn_avx512(p) : nullptr;
    case CpuIsa::best:
      break;
  }
  ItemFn fn = item_fn(p, CpuIsa::avx512);
  if (!fn) fn = item_fn(p, CpuIsa::avx2);
  return fn ? fn : select_item_fn_generic(p);
}

}  // namespace

const float* fp8_table() {
  static const std::array<float, 256> table = [] {
    std::array<float, 256> t{};
    for (int i = 0; i < 256; ++i) t[size_t(i)] = fp8e4m3_to_f32(uint8_t(i));
    return t;
  }();
  return table.data();
}

std::vector<WorkItem> plan_items(const KernelParams& p, int32_t num_seqs, int32_t num_kv_heads) {
  const int32_t rows_per_item = std::max<int32_t>(1, kTargetVectors / p.group);
  std::vector<WorkItem> items;
  std::vector<int64_t> cost;
  for (int32_t b = 0; b < num_seqs; ++b) {
    const int32_t q_len = p.q_indptr[b + 1] - p.q_indptr[b], L = p.kv_len[b];
    for (int32_t r0 = 0; r0 < q_len; r0 += rows_per_item) {
      const int32_t r1 = std::min(q_len, r0 + rows_per_item);
      // Keys the item visits (causal: up to its last row's position).
      const int64_t keys = p.causal ? int64_t(L) - q_len + r1 : L;
      for (int32_t g = 0; g < num_kv_heads; ++g) {
        items.push_back({b, g, r0, r1});
        cost.push_back(keys * (r1 - r0));
      }
    }
  }
  // Longest first, so the dynamic hand-out of the pool ends with short items.
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  std::vector<WorkItem> sorted;
  sorted.reserve(items.size());
  for (size_t i : order) sorted.push_back(items[i]);
  return sorted;
}

void run_items(const KernelParams& p, const std::vector<WorkItem>& items, CpuIsa isa) {
  const ItemFn fn = item_fn(p, isa);
  PA_CHECK(fn != nullptr, "paged_attention: this build or CPU has no such kernel variant");
  parallel_for(int64_t(items.size()), [&](int64_t i) {
    thread_local Scratch scratch;
    fn(p, items[size_t(i)], scratch);
  });
}

}  // namespace cpu

namespace {

cpu::KernelParams make_params(const QKVTensor& q, const AttentionOptions& opt, QKVTensor& out,
                              int32_t num_kv_heads, const int32_t* q_indptr,
                              const int32_t* kv_len) {
  cpu::KernelParams p;
  p.q = q.data;
  p.q_dtype = q.dtype;
  p.out = out.data;
  p.out_dtype = out.dtype;
  p.num_q_heads = q.num_heads;
  p.group = q.num_heads / num_kv_heads;
  p.head_dim = q.head_dim;
  p.scale = detail::attention_scale(opt, q.head_dim);
  p.softcap = opt.softcap;
  p.window = opt.window;
  p.causal = opt.causal;
  p.q_indptr = q_indptr;
  p.kv_len = kv_len;
  return p;
}

}  // namespace

bool cpu_isa_available(CpuIsa isa) {
  cpu::KernelParams probe;
  probe.head_dim = 128;
  return cpu::item_fn(probe, isa) != nullptr;
}

void paged_attention_cpu(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                         const AttentionOptions& opt, QKVTensor& out) {
  paged_attention_cpu_isa(q, kv, batch, opt, out, CpuIsa::best);
}

void paged_attention_cpu_isa(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                             const AttentionOptions& opt, QKVTensor& out, CpuIsa isa) {
  PA_CHECK(cpu_isa_available(isa), "paged_attention: the requested CPU kernel variant is not ",
           "available in this build or on this CPU");
  validate_paged_attention(q, kv, batch, opt, out);
  detail::check_host_fp8_scales(kv);
  if (q.num_tokens == 0) return;
  cpu::KernelParams p = make_params(q, opt, out, kv.num_kv_heads, batch.q_indptr, batch.kv_len);
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.kv.k = kv.k_pages;
  p.kv.v = kv.v_pages;
  p.kv.dtype = kv.dtype;
  p.kv.num_kv_heads = kv.num_kv_heads;
  p.kv.block_table = batch.block_table;
  p.kv.max_pages_per_seq = batch.max_pages_per_seq;
  p.kv.page_size = kv.page_size;
  cpu::run_items(p, cpu::plan_items(p, batch.num_seqs, kv.num_kv_heads), isa);
}

void dense_attention_cpu(const QKVTensor& q, const DenseKV& kv, int32_t num_seqs,
                         const int32_t* q_indptr, const int32_t* kv_len,
                         const AttentionOptions& opt, QKVTensor& out) {
  // Checked as a paged call where sequence b owns one page (b) of max_len tokens: the same
  // shapes, the same limits.
  PA_CHECK(num_seqs >= 0, "dense_attention: num_seqs must be >= 0, got ", num_seqs);
  PA_CHECK(kv.max_len > 0, "dense_attention: kv.max_len must be > 0, got ", kv.max_len);
  std::vector<int32_t> identity(static_cast<size_t>(num_seqs));
  std::iota(identity.begin(), identity.end(), 0);
  PagedKVView view;
  view.k_pages = const_cast<void*>(kv.k);
  view.v_pages = const_cast<void*>(kv.v);
  view.dtype = kv.dtype;
  view.num_pages = num_seqs;
  view.num_kv_heads = kv.num_kv_heads;
  view.page_size = kv.max_len;
  view.head_dim = kv.head_dim;
  view.k_scale = kv.k_scale;
  view.v_scale = kv.v_scale;
  const BatchLayout batch{num_seqs, q_indptr, kv_len, identity.data(), 1};
  validate_paged_attention(q, view, batch, opt, out);
  detail::check_host_fp8_scales(view);
  if (q.num_tokens == 0) return;
  cpu::KernelParams p = make_params(q, opt, out, kv.num_kv_heads, q_indptr, kv_len);
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.kv.k = kv.k;
  p.kv.v = kv.v;
  p.kv.dtype = kv.dtype;
  p.kv.num_kv_heads = kv.num_kv_heads;
  p.kv.dense_max_len = kv.max_len;
  cpu::run_items(p, cpu::plan_items(p, num_seqs, kv.num_kv_heads), CpuIsa::best);
}

}  // namespace pagedattn
