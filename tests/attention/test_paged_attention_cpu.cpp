// The fused CPU kernel (every compiled ISA variant) and the dense baseline against the reference
// on random configurations: page sizes 1..128, head dims 64/128/256 (and odd ones), GQA 1/4/8 and
// MQA, ragged batches of prefill, chunked prefill and decode, causal or not, window, softcap, every
// q x KV dtype pair, outputs poisoned with NaN first, long shuffled contexts.
#include <gtest/gtest.h>

#include <random>
#include <vector>

#include "attention/cpu/cpu_attention.h"
#include "pagedattn/error.h"
#include "problem.h"

using namespace pagedattn;
using namespace pagedattn::testing;

namespace {

constexpr DType kQDtypes[] = {DType::f32, DType::f16, DType::bf16};
constexpr DType kKvDtypes[] = {DType::f32, DType::f16, DType::bf16, DType::fp8_e4m3};

// Reference (f32 output) vs the given backend (output dtype of the spec). Returns the error.
template <class Run>
double compare(const Problem& pr, Run&& run) {
  OutBuffer want(pr, DType::f32);
  paged_attention_reference(pr.q_tensor(), pr.view(), pr.batch(), pr.spec.opt, want.t);
  OutBuffer got(pr, pr.spec.out_dtype);
  run(pr, got.t);
  return rel_error(got.values(), want.values());
}

// Sequence lengths that hit page boundaries: exact multiples, one more, a single token, random.
int32_t pick_kv_len(std::mt19937_64& rng, int32_t page, int32_t max_len) {
  std::uniform_int_distribution<int> kind(0, 4);
  const int32_t pages = std::max(1, max_len / page);
  std::uniform_int_distribution<int32_t> npages(1, pages);
  switch (kind(rng)) {
    case 0:
      return std::min(max_len, npages(rng) * page);
    case 1:
      return std::min(max_len, npages(rng) * page + 1);
    case 2:
      return 1;
    default:
      return std::uniform_int_distribution<int32_t>(1, max_len)(rng);
  }
}

ProblemSpec random_spec(std::mt19937_64& rng, int index) {
  ProblemSpec s;
  const int32_t head_dims[] = {64, 128, 256, 64, 128, 256, 40, 96};
  const int32_t pages[] = {1, 2, 3, 7, 8, 16, 16, 32, 64, 128};
  auto pick = [&](int n) { return std::uniform_int_distribution<int>(0, n - 1)(rng); };
  s.head_dim = head_dims[pick(8)];
  s.page_size = pages[pick(10)];
  switch (pick(4)) {  // GQA ratio 1, 4, 8 or MQA
    case 0:
      s.num_kv_heads = 1 + pick(3), s.num_q_heads = s.num_kv_heads;
      break;
    case 1:
      s.num_kv_heads = 1 + pick(2), s.num_q_heads = 4 * s.num_kv_heads;
      break;
    case 2:
      s.num_kv_heads = 1 + pick(2), s.num_q_heads = 8 * s.num_kv_heads;
      break;
    default:
      s.num_kv_heads = 1, s.num_q_heads = 1 << (1 + pick(4));
      break;
  }
  // Every (q, KV) dtype pair equally often; the output dtype varies independently.
  s.q_dtype = kQDtypes[index % 3];
  s.kv_dtype = kKvDtypes[(index / 3) % 4];
  s.out_dtype = kQDtypes[pick(3)];
  // Work budget: bigger heads, fewer and shorter sequences.
  const int32_t max_len = s.head_dim * s.num_q_heads >= 1024 ? 96 : 200;
  const int32_t num_seqs = 1 + pick(4);
  for (int32_t b = 0; b < num_seqs; ++b) {
    const int32_t L = pick_kv_len(rng, s.page_size, max_len);
    int32_t q = 1;
    switch (pick(4)) {
      case 0:
        q = 1;
        break;  // decode
      case 1:
        q = L;
        break;  // prefill
      case 2:
        q = std::uniform_int_distribution<int32_t>(1, std::min(L, 24))(rng);
        break;  // chunk
      default:
        q = pick(2) ? 1 : std::min(L, 1 + pick(5));
        break;  // mixed
    }
    s.q_len.push_back(q);
    s.kv_len.push_back(L);
  }
  s.opt.causal = pick(4) != 0;
  if (pick(4) == 0) s.opt.window = 1 + pick(64);
  if (pick(5) == 0) s.opt.softcap = 5.f + float(pick(45));
  if (pick(4) == 0) s.opt.scale = 0.02f + 0.01f * float(pick(10));
  s.extra_table_cols = pick(3);
  return s;
}

TEST(PagedAttentionCpu, MatchesReferenceOnRandomConfigs) {
  std::mt19937_64 rng(20261122);
  const int kConfigs = 1200;
  int failures = 0;
  for (int i = 0; i < kConfigs && failures < 5; ++i) {
    const ProblemSpec spec = random_spec(rng, i);
    const Problem pr(spec, 1000 + uint64_t(i));
    const double err = compare(pr, [](const Problem& p, QKVTensor& out) {
      paged_attention_cpu(p.q_tensor(), p.view(), p.batch(), p.spec.opt, out);
    });
    const bool ok = err <= tolerance(spec.out_dtype);  // false for NaN
    EXPECT_TRUE(ok) << "config " << i << ": " << describe(spec) << "\n  rel error " << err;
    failures += !ok;
  }
}

// Every compiled variant (generic, AVX2, AVX-512) on its own, on a subset of the same configs.
TEST(PagedAttentionCpu, EveryIsaVariantMatchesReference) {
  for (CpuIsa isa : {CpuIsa::generic, CpuIsa::avx2, CpuIsa::avx512}) {
    if (!cpu_isa_available(isa)) continue;
    std::mt19937_64 rng(77 + int(isa));
    for (int i = 0; i < 120; ++i) {
      const ProblemSpec spec = random_spec(rng, i);
      const Problem pr(spec, 5000 + uint64_t(i));
      const double err = compare(pr, [isa](const Problem& p, QKVTensor& out) {
        paged_attention_cpu_isa(p.q_tensor(), p.view(), p.batch(), p.spec.opt, out, isa);
      });
      ASSERT_LE(err, tolerance(spec.out_dtype))
          << "isa " << int(isa) << " config " << i << ": " << describe(spec);
    }
  }
}

// Long contexts (8k+) with shuffled block tables: decode and chunked prefill.
TEST(PagedAttentionCpu, LongShuffledContexts) {
  struct Case {
    int32_t page, kv0, kv1, q0, q1;
    DType kv;
    int32_t window;
  };
  const Case cases[] = {
      {16, 8192, 8500, 1, 16, DType::bf16, 0},
      {1, 8193, 4000, 1, 1, DType::f32, 0},
      {128, 9000, 8192, 8, 1, DType::fp8_e4m3, 0},
      {32, 8300, 8200, 1, 12, DType::f16, 1024},
  };
  for (const Case& c : cases) {
    ProblemSpec s;
    s.num_q_heads = 8, s.num_kv_heads = 2, s.head_dim = 128, s.page_size = c.page;
    s.q_dtype = DType::bf16, s.kv_dtype = c.kv, s.out_dtype = DType::f32;
    s.q_len = {c.q0, c.q1}, s.kv_len = {c.kv0, c.kv1};
    s.opt.window = c.window;
    const Problem pr(s, 42 + uint64_t(c.page));
    const double err = compare(pr, [](const Problem& p, QKVTensor& out) {
      paged_attention_cpu(p.q_tensor(), p.view(), p.batch(), p.spec.opt, out);
    });
    EXPECT_LE(err, 5e-5) << describe(s);
  }
}

// Page ids beyond 16 bits: a sequence whose pages sit past 65,536 in a 70,000-page pool.
TEST(PagedAttentionCpu, PoolBeyondSixteenBitPageIds) {
  ProblemSpec s;
  s.num_q_heads = 2, s.num_kv_heads = 1, s.head_dim = 64, s.page_size = 1;
  s.q_len = {1, 3}, s.kv_len = {300, 200};
  s.extra_pages = 70000 - 500;
  const Problem pr0(s, 9);
  // Move every used page id past 65,536 (copy the page content along).
  Problem pr = pr0;
  const PagedKVView v = pr.view();
  const size_t page_bytes = size_t(v.page_stride()) * dtype_size(v.dtype);
  int32_t next = 65600;
  for (int32_t b = 0; b < 2; ++b) {
    for (int32_t i = 0; i < pr.kv_len[size_t(b)]; ++i) {
      int32_t& id = pr.block_table[size_t(b) * pr.max_pages_per_seq + i];
      std::copy_n(&pr0.k_pages[size_t(id) * page_bytes], page_bytes,
                  &pr.k_pages[size_t(next) * page_bytes]);
      std::copy_n(&pr0.v_pages[size_t(id) * page_bytes], page_bytes,
                  &pr.v_pages[size_t(next) * page_bytes]);
      id = next++;
    }
  }
  OutBuffer want(pr0, DType::f32), got(pr, DType::f32);
  paged_attention_reference(pr0.q_tensor(), pr0.view(), pr0.batch(), s.opt, want.t);
  paged_attention_cpu(pr.q_tensor(), pr.view(), pr.batch(), s.opt, got.t);
  EXPECT_LE(rel_error(got.values(), want.values()), 2e-5);
}

// Sequences with no queries (one with an empty cache) beside one that has some.
TEST(PagedAttentionCpu, SequencesWithoutQueries) {
  ProblemSpec s;
  s.q_len = {0, 2, 0}, s.kv_len = {5, 7, 0};
  const Problem pr(s, 3);
  OutBuffer want(pr, DType::f32), got(pr, DType::f32);
  paged_attention_reference(pr.q_tensor(), pr.view(), pr.batch(), s.opt, want.t);
  paged_attention_cpu(pr.q_tensor(), pr.view(), pr.batch(), s.opt, got.t);
  EXPECT_LE(rel_error(got.values(), want.values()), 2e-5);
}

// The dense no-paging baseline (used by the benchmark) computes the same thing.
TEST(DenseAttentionCpu, MatchesReference) {
  std::mt19937_64 rng(11);
  for (int i = 0; i < 60; ++i) {
    ProblemSpec spec = random_spec(rng, i);
    const Problem pr(spec, 300 + uint64_t(i));
    // Dense copy: [num_seqs][num_kv_heads][max_len][head_dim].
    const int32_t n = int32_t(spec.kv_len.size()), Hk = spec.num_kv_heads, D = spec.head_dim;
    const int32_t max_len = *std::max_element(spec.kv_len.begin(), spec.kv_len.end()) + 3;
    const size_t es = dtype_size(spec.kv_dtype);
    std::vector<uint8_t> k = nan_buffer(spec.kv_dtype, int64_t(n) * Hk * max_len * D), v = k;
    const PagedKVView pv = pr.view();
    for (int32_t b = 0; b < n; ++b)
      for (int32_t p = 0; p < spec.kv_len[size_t(b)]; ++p)
        for (int32_t h = 0; h < Hk; ++h) {
          const int32_t page =
              pr.block_table[size_t(b) * pr.max_pages_per_seq + p / spec.page_size];
          const size_t src = size_t(pv.offset(page, h, p % spec.page_size)) * es;
          const size_t dst = ((size_t(b) * Hk + h) * max_len + p) * D * es;
          std::copy_n(&pr.k_pages[src], D * es, &k[dst]);
          std::copy_n(&pr.v_pages[src], D * es, &v[dst]);
        }
    DenseKV dense{k.data(),
                  v.data(),
                  spec.kv_dtype,
                  Hk,
                  D,
                  max_len,
                  pr.k_scale.empty() ? nullptr : pr.k_scale.data(),
                  pr.v_scale.empty() ? nullptr : pr.v_scale.data()};
    const double err = compare(pr, [&](const Problem& p, QKVTensor& out) {
      dense_attention_cpu(p.q_tensor(), dense, n, p.q_indptr.data(), p.kv_len.data(), p.spec.opt,
                          out);
    });
    ASSERT_LE(err, tolerance(spec.out_dtype)) << describe(spec);
  }
}

}  // namespace

namespace {

// Plan-then-run: one plan run over two layers' pools (same layout, other values) gives the bits
// of the one-shot call on each; run() refuses tensors or pools of other shapes.
TEST(CpuAttentionPlan, PlannedOnceRunPerLayerEqualsOneShot) {
  std::mt19937_64 rng(31);
  for (int i = 0; i < 40; ++i) {
    const ProblemSpec spec = random_spec(rng, i);
    const Problem layer0(spec, 700 + uint64_t(i));
    Problem layer1 = layer0;
    std::swap(layer1.k_pages, layer1.v_pages);  // another layer: the same slots, other values
    CpuAttentionPlan plan;
    OutBuffer planned0(layer0, spec.out_dtype), planned1(layer0, spec.out_dtype);
    plan.plan(layer0.q_tensor(), layer0.view(), layer0.batch(), spec.opt, planned0.t);
    plan.run(layer0.q_tensor(), layer0.view(), planned0.t);
    plan.run(layer1.q_tensor(), layer1.view(), planned1.t);
    OutBuffer once0(layer0, spec.out_dtype), once1(layer0, spec.out_dtype);
    paged_attention_cpu(layer0.q_tensor(), layer0.view(), layer0.batch(), spec.opt, once0.t);
    paged_attention_cpu(layer1.q_tensor(), layer1.view(), layer1.batch(), spec.opt, once1.t);
    ASSERT_EQ(planned0.bytes, once0.bytes) << describe(spec);
    ASSERT_EQ(planned1.bytes, once1.bytes) << describe(spec);
  }
}

TEST(CpuAttentionPlan, RunRefusesOtherShapes) {
  std::mt19937_64 rng(5);
  const ProblemSpec spec = random_spec(rng, 0);
  const Problem pr(spec, 9);
  OutBuffer out(pr, spec.out_dtype);
  CpuAttentionPlan plan;
  auto error_of = [](auto&& f) -> std::string {
    try {
      f();
    } catch (const pagedattn::Error& e) {
      return e.what();
    }
    return "";
  };
  EXPECT_NE(error_of([&] { plan.run(pr.q_tensor(), pr.view(), out.t); }).find("before plan"),
            std::string::npos);
  plan.plan(pr.q_tensor(), pr.view(), pr.batch(), spec.opt, out.t);
  QKVTensor q = pr.q_tensor();
  q.num_heads *= 2;
  EXPECT_NE(error_of([&] { plan.run(q, pr.view(), out.t); }).find("differ in shape"),
            std::string::npos);
  PagedKVView kv = pr.view();
  kv.num_pages -= 1;
  EXPECT_NE(error_of([&] { plan.run(pr.q_tensor(), kv, out.t); }).find("pools of run()"),
            std::string::npos);
}

}  // namespace
