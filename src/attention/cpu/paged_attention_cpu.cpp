// paged_attention_cpu: plans a call into work items, then runs them on the thread pool with the
// widest kernel variant this CPU supports. Also the dense no-paging baseline (same kernel body).
#include <algorithm>
#include <array>
#include <cmath>
#include <cstdlib>
#include <limits>
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
// Below this many items per pool thread, items of several chunks are split into per-chunk parts.
constexpr int64_t kMinItemsPerThread = 4;

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

void merge_state(float& m, float& l, float* o, float m2, float l2, const float* o2, int dp) {
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  if (m2 == kNegInf) return;  // an empty chunk changes nothing
  const float m_new = std::max(m, m2);
  const float a = m == kNegInf ? 0.f : std::exp(m - m_new), b = std::exp(m2 - m_new);
  // NOTE: explicit fused multiply-adds, so no compiler contracts this differently in one caller
  // than in another; with a = 0 and b = 1 (the first chunk) the state is copied exactly.
  l = std::fma(l, a, l2 * b);
  for (int d = 0; d < dp; ++d) o[d] = std::fma(o[d], a, o2[d] * b);
  m = m_new;
}

void write_output(const KernelParams& p, const WorkItem& it, const float* o, const float* l,
                  int32_t Dp) {
  const int32_t g = it.kv_head, G = p.group, D = p.head_dim, q0 = p.q_indptr[it.seq];
  const int32_t M = (it.row_end - it.row_begin) * G;
  const float vscale = p.kv.dtype == DType::fp8_e4m3 ? p.v_scale[g] : 1.f;
  for (int32_t m = 0; m < M; ++m) {
    const int64_t dst = (int64_t(q0 + it.row_begin + m / G) * p.num_q_heads + g * G + m % G) * D;
    const float inv = l[m] > 0.f ? vscale / l[m] : 0.f;
    const float* om = o + int64_t(m) * Dp;
    for (int d = 0; d < D; ++d) store_from_f32(p.out, p.out_dtype, dst + d, om[d] * inv);
  }
}

Plan plan_items(const KernelParams& p, int32_t num_seqs, int32_t num_kv_heads) {
  const int32_t rows_per_item = std::max<int32_t>(1, kTargetVectors / p.group);
  std::vector<WorkItem> items;
  std::vector<int64_t> cost;
  std::vector<std::pair<int32_t, int32_t>> keys_of;  // [first tile's key, end) of each item
  for (int32_t b = 0; b < num_seqs; ++b) {
    const int32_t q_len = p.q_indptr[b + 1] - p.q_indptr[b], L = p.kv_len[b];
    for (int32_t r0 = 0; r0 < q_len; r0 += rows_per_item) {
      const int32_t r1 = std::min(q_len, r0 + rows_per_item);
      // Keys the item visits (causal: up to its last row's position; window: from its first's).
      const int32_t hi = p.causal ? L - q_len + r1 : L;
      const int32_t first = p.window > 0 ? std::max(0, L - q_len + r0 - p.window + 1) : 0;
      const int32_t lo = first / kTile * kTile;
      for (int32_t g = 0; g < num_kv_heads; ++g) {
        items.push_back({b, g, r0, r1});
        cost.push_back(int64_t(hi) * (r1 - r0));
        keys_of.push_back({lo, hi});
      }
    }
  }
  Plan plan;
  const int64_t threads = ThreadPool::global().num_threads();
  if (threads > 1 && int64_t(items.size()) < kMinItemsPerThread * threads) {
    // Too few items to keep the pool busy (decode of a few sequences): one part per chunk.
    const int32_t Dp = (p.head_dim + kLanes - 1) / kLanes * kLanes;
    std::vector<WorkItem> parts;
    std::vector<int64_t> part_cost;
    for (size_t i = 0; i < items.size(); ++i) {
      const auto [lo, hi] = keys_of[i];
      const int32_t c0 = lo / kChunk, c1 = hi <= lo ? c0 : (hi - 1) / kChunk + 1;
      const WorkItem& it = items[i];
      if (c1 - c0 < 2) {
        parts.push_back(it);
        part_cost.push_back(cost[i]);
        continue;
      }
      const int32_t M = (it.row_end - it.row_begin) * p.group;
      plan.split.push_back({it, c0, c1 - c0, plan.workspace});
      for (int32_t c = c0; c < c1; ++c) {
        WorkItem part = it;
        part.chunk = c;
        part.state = plan.workspace;
        plan.workspace += state_floats(M, Dp);
        parts.push_back(part);
        const int32_t keys = std::min(hi, (c + 1) * kChunk) - std::max(lo, c * kChunk);
        part_cost.push_back(int64_t(keys) * (it.row_end - it.row_begin));
      }
    }
    items = std::move(parts);
    cost = std::move(part_cost);
  }
  // Longest first, so the dynamic hand-out of the pool ends with short items.
  std::vector<size_t> order(items.size());
  std::iota(order.begin(), order.end(), size_t(0));
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return cost[a] > cost[b]; });
  plan.items.reserve(items.size());
  for (size_t i : order) plan.items.push_back(items[i]);
  return plan;
}

void run_items(const KernelParams& p, const Plan& plan, CpuIsa isa) {
  const ItemFn fn = item_fn(p, isa);
  PA_CHECK(fn != nullptr, "paged_attention: this build or CPU has no such kernel variant");
  thread_local std::vector<float> workspace;
  if (workspace.size() < size_t(plan.workspace)) workspace.resize(size_t(plan.workspace));
  float* ws = workspace.data();
  parallel_for(int64_t(plan.items.size()), [&](int64_t i) {
    thread_local Scratch scratch;
    fn(p, plan.items[size_t(i)], scratch, ws);
  });
  if (plan.split.empty()) return;
  // Each split item: its parts' states folded in order of chunk, as attend_item folds them.
  const int32_t Dp = (p.head_dim + kLanes - 1) / kLanes * kLanes;
  parallel_for(int64_t(plan.split.size()), [&](int64_t i) {
    const SplitItem& sp = plan.split[size_t(i)];
    const int32_t M = (sp.whole.row_end - sp.whole.row_begin) * p.group;
    thread_local std::vector<float> o, m, l;
    o.assign(size_t(M) * Dp, 0.f);
    m.assign(size_t(M), -std::numeric_limits<float>::infinity());
    l.assign(size_t(M), 0.f);
    for (int32_t c = 0; c < sp.num_chunks; ++c) {
      const float* st = ws + sp.state + c * state_floats(M, Dp);
      for (int32_t v = 0; v < M; ++v)
        merge_state(m[size_t(v)], l[size_t(v)], &o[size_t(v) * Dp], st[int64_t(M) * Dp + v],
                    st[int64_t(M) * (Dp + 1) + v], st + int64_t(v) * Dp, Dp);
    }
    write_output(p, sp.whole, o.data(), l.data(), Dp);
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

// The kernel's parameters for a batch over pools shaped like kv (q, out and the pools' pointers
// and scales are set per run).
cpu::KernelParams batch_params(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                               const AttentionOptions& opt, const QKVTensor& out) {
  QKVTensor out_copy = out;
  cpu::KernelParams p = make_params(q, opt, out_copy, kv.num_kv_heads, batch.q_indptr,
                                    batch.kv_len);
  p.kv.dtype = kv.dtype;
  p.kv.num_kv_heads = kv.num_kv_heads;
  p.kv.block_table = batch.block_table;
  p.kv.max_pages_per_seq = batch.max_pages_per_seq;
  p.kv.page_size = kv.page_size;
  return p;
}

// p for one run: the call's q, out, pools and scales.
cpu::KernelParams with_data(cpu::KernelParams p, const QKVTensor& q, const PagedKVView& kv,
                            QKVTensor& out) {
  p.q = q.data;
  p.out = out.data;
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  p.kv.k = kv.k_pages;
  p.kv.v = kv.v_pages;
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
  CpuAttentionPlan plan;
  plan.plan(q, kv, batch, opt, out);
  plan.run(q, kv, out);
}

struct CpuAttentionPlan::Impl {
  bool planned = false;
  QKVTensor q_shape, out_shape;  // data pointers unused: run() gets the layer's
  PagedKVView kv_shape;          // pool pointers and scales unused, likewise
  cpu::KernelParams params;      // everything but q, out and the pools
  cpu::Plan items;
};

CpuAttentionPlan::CpuAttentionPlan() : impl_(std::make_unique<Impl>()) {}
CpuAttentionPlan::~CpuAttentionPlan() = default;

void CpuAttentionPlan::plan(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                            const AttentionOptions& opt, const QKVTensor& out) {
  validate_paged_attention(q, kv, batch, opt, out);
  Impl& m = *impl_;
  m.params = batch_params(q, kv, batch, opt, out);
  m.items = q.num_tokens == 0 ? cpu::Plan{} : cpu::plan_items(m.params, batch.num_seqs,
                                                               kv.num_kv_heads);
  m.q_shape = q;
  m.out_shape = out;
  m.kv_shape = kv;
  m.planned = true;
}

void CpuAttentionPlan::run(const QKVTensor& q, const PagedKVView& kv, QKVTensor& out) const {
  const Impl& m = *impl_;
  PA_CHECK(m.planned, "paged_attention: run() before plan()");
  auto same = [](const QKVTensor& a, const QKVTensor& b) {
    return a.dtype == b.dtype && a.num_tokens == b.num_tokens && a.num_heads == b.num_heads &&
           a.head_dim == b.head_dim;
  };
  PA_CHECK(same(q, m.q_shape) && same(out, m.out_shape), "paged_attention: q or out of run() ",
           "differ in shape or dtype from the planned ones");
  const PagedKVView& p = m.kv_shape;
  PA_CHECK(kv.dtype == p.dtype && kv.num_pages == p.num_pages && kv.num_kv_heads == p.num_kv_heads &&
               kv.page_size == p.page_size && kv.head_dim == p.head_dim,
           "paged_attention: the pools of run() differ in shape or dtype from the planned ones");
  PA_CHECK(q.data && out.data && kv.k_pages && kv.v_pages, "paged_attention: null data in run()");
  detail::check_host_fp8_scales(kv);
  if (q.num_tokens == 0) return;
  cpu::run_items(with_data(m.params, q, kv, out), m.items, CpuIsa::best);
}

void paged_attention_cpu_isa(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                             const AttentionOptions& opt, QKVTensor& out, CpuIsa isa) {
  PA_CHECK(cpu_isa_available(isa), "paged_attention: the requested CPU kernel variant is not ",
           "available in this build or on this CPU");
  validate_paged_attention(q, kv, batch, opt, out);
  detail::check_host_fp8_scales(kv);
  if (q.num_tokens == 0) return;
  const cpu::KernelParams p = batch_params(q, kv, batch, opt, out);
  cpu::run_items(with_data(p, q, kv, out), cpu::plan_items(p, batch.num_seqs, kv.num_kv_heads), isa);
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
