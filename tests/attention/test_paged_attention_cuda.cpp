// The CUDA paged attention kernels against the double-precision reference, on random shapes.
#include <gtest/gtest.h>

#include <random>
#include <utility>

#include "cuda_problem.h"
#include "pagedattn/error.h"

using namespace pagedattn;
using namespace pagedattn::gputest;

namespace {

const DType kPairs[4][2] = {{DType::bf16, DType::bf16},
                            {DType::f16, DType::f16},
                            {DType::bf16, DType::fp8_e4m3},
                            {DType::f16, DType::fp8_e4m3}};

// A random shape; q_len 1 for every sequence when decode_only.
Spec random_spec(std::mt19937_64& rng, bool decode_only, int max_kv) {
  auto pick = [&](std::initializer_list<int> v) { return *(v.begin() + rng() % v.size()); };
  Spec s;
  const auto& pair = kPairs[rng() % 4];
  s.q_dtype = pair[0];
  s.kv_dtype = pair[1];
  s.head_dim = pick({64, 128, 256});
  s.page_size = pick({16, 32, 64, 8, 48});
  s.num_kv_heads = pick({1, 2, 4, 8});
  s.num_q_heads = s.num_kv_heads * pick({1, 2, 3, 4, 6, 8, 16});
  const int n = 1 + int(rng() % 6);
  for (int b = 0; b < n; ++b) {
    const int kv = 1 + int(rng() % uint64_t(max_kv));
    int q = 1;
    if (!decode_only && rng() % 3) q = 1 + int(rng() % uint64_t(std::min(kv, 96)));
    if (!decode_only && rng() % 6 == 0) q = 0;  // a sequence with nothing to compute this step
    s.kv_len.push_back(kv);
    s.q_len.push_back(q);
  }
  s.opt.causal = rng() % 4 != 0;
  if (rng() % 4 == 0) s.opt.window = 1 + int(rng() % 700);
  if (rng() % 4 == 0) s.opt.softcap = 5.f + float(rng() % 30);
  if (rng() % 4 == 0) s.opt.scale = 0.02f + float(rng() % 100) * 0.001f;
  return s;
}

void check_problem(const Spec& s, uint64_t seed, CudaPlanOptions opts = {}) {
  Problem pr(s, seed);
  CudaAttentionPlan plan(size_t(64) << 20, opts);
  const std::vector<uint8_t> got = pr.run_cuda(plan);
  expect_close(got, s.q_dtype, pr.reference(), describe(s) + " seed " + std::to_string(seed));
}

}  // namespace

TEST(CudaAttention, DecodeMatchesReferenceOnRandomShapes) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(1234);
  for (int i = 0; i < 160; ++i) {
    const Spec s = random_spec(rng, true, i % 10 == 0 ? 9000 : 1500);
    check_problem(s, 100 + uint64_t(i));
    if (HasFailure()) return;
  }
}

TEST(CudaAttention, SplitKvMatchesReference) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(99);
  for (int i = 0; i < 60; ++i) {
    Spec s = random_spec(rng, true, 3000);
    CudaPlanOptions o;
    o.chunks_per_cta = 1 + int(rng() % 3);
    // Every third problem with a chunk size of its own: one step of the tensor-core kernel (64),
    // three steps (192), or fewer, longer chunks.
    const int32_t sizes[] = {64, 192, 512, 1024};
    if (i % 3 == 0) o.decode_chunk_tokens = sizes[rng() % 4];
    check_problem(s, 500 + uint64_t(i), o);
    if (HasFailure()) return;
  }
}

// Both decode kernels on every group size: the CUDA-core one (which the plan picks for group 1)
// and the tensor-core one (group >= 2 by default), each forced onto all shapes.
TEST(CudaAttention, BothDecodeKernelsMatchReferenceOnEveryGroup) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(777);
  for (int i = 0; i < 80; ++i) {
    const Spec s = random_spec(rng, true, i % 8 == 0 ? 6000 : 1200);
    CudaPlanOptions o;
    o.tensor_core_decode_min_group = i % 2 ? 1 : 1 << 20;
    if (i % 3 == 0) o.chunks_per_cta = 1 + int(rng() % 2);
    Problem pr(s, 1300 + uint64_t(i));
    CudaAttentionPlan plan(size_t(64) << 20, o);
    const std::vector<uint8_t> got = pr.run_cuda(plan);
    EXPECT_EQ(plan.info().decode_tc_rows > 0, o.tensor_core_decode_min_group == 1);
    expect_close(got, s.q_dtype, pr.reference(),
                 describe(s) + (i % 2 ? " tensor cores" : " CUDA cores") + " seed " +
                     std::to_string(1300 + i));
    if (HasFailure()) return;
  }
}

// A split plan run several times (as every layer of a step runs it): the fused merge's counters
// return to zero after each launch, so every run merges and gives the same bits.
TEST(CudaAttention, SplitPlanRunsRepeatedly) {
  PA_SKIP_WITHOUT_GPU();
  for (int min_group : {2, 1 << 20}) {
    for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
      Spec s;
      s.kv_dtype = kv;
      s.q_len = {1, 1, 1};
      s.kv_len = {3000, 700, 1800};
      Problem pr(s, 31);
      CudaPlanOptions o;
      o.chunks_per_cta = 1;
      o.tensor_core_decode_min_group = min_group;
      CudaAttentionPlan plan(size_t(64) << 20, o);
      const auto outs = pr.run_cuda_repeated(plan, 3);
      EXPECT_GT(plan.info().split_rows, 0);
      expect_close(outs[0], s.q_dtype, pr.reference(), describe(s) + " first run");
      EXPECT_EQ(outs[0], outs[1]);
      EXPECT_EQ(outs[0], outs[2]);
    }
  }
}

TEST(CudaAttention, PrefillAndMixedBatchesMatchReference) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937_64 rng(4321);
  for (int i = 0; i < 120; ++i) {
    const Spec s = random_spec(rng, false, 700);
    CudaPlanOptions o;
    o.tensor_core_prefill = i % 4 != 0;  // every fourth problem through the decode kernel alone
    check_problem(s, 900 + uint64_t(i), o);
    if (HasFailure()) return;
  }
}

TEST(CudaAttention, LongContexts) {
  PA_SKIP_WITHOUT_GPU();
  for (DType kv : {DType::bf16, DType::fp8_e4m3}) {
    Spec s;
    s.num_q_heads = 8;
    s.num_kv_heads = 2;
    s.kv_dtype = kv;
    s.page_size = 64;
    s.q_len = {1, 1, 1};
    s.kv_len = {40000, 257, 33000};
    check_problem(s, 7);
    s.q_len = {3, 200};
    s.kv_len = {20000, 5000};
    check_problem(s, 8);
  }
}

// Page ids above 65,535 must be read as they are (no 16-bit truncation anywhere).
TEST(CudaAttention, PoolsBeyond65536Pages) {
  PA_SKIP_WITHOUT_GPU();
  Spec s;
  s.num_q_heads = 4;
  s.num_kv_heads = 1;
  s.head_dim = 64;
  s.page_size = 16;
  s.min_page_id = 70000;
  s.q_len = {1, 5};
  s.kv_len = {700, 300};
  check_problem(s, 11);
}

// The split-KV partition is fixed by position: a row gives the same bits split or not, and alone
// or in a bigger batch (and with its cached positions copied before the kernel's wait).
TEST(CudaAttention, SplitAndBatchInvariance) {
  PA_SKIP_WITHOUT_GPU();
  // Chunk sizes chosen per row (the 30000-position row takes 2048, 1024 with fp8 pools on the
  // tensor-core kernel; on the CUDA-core kernel with bf16 pools the rows of 3 and 700 positions
  // take 128), and 256 for every row: then that row has 118 chunks, more than one window of the
  // merge (decode_merge.cuh) and than one warp scan of its running max. GQA 4 and group 1.
  for (int32_t chunk_tokens : {0, 256}) {
    for (int min_group : {2, 1 << 20}) {  // the tensor-core and the CUDA-core decode kernel
      for (auto [kv, kv_heads] : {std::pair{DType::bf16, 2}, std::pair{DType::fp8_e4m3, 2},
                                  std::pair{DType::bf16, 8}, std::pair{DType::fp8_e4m3, 8}}) {
        Spec s;
        s.kv_dtype = kv;
        s.num_kv_heads = kv_heads;
        s.q_len = {1, 1, 1, 1, 1, 1};
        s.kv_len = {5000, 1200, 3, 2600, 30000, 700};
        Problem pr(s, 21);
        CudaPlanOptions dflt;
        dflt.tensor_core_decode_min_group = min_group;
        dflt.decode_chunk_tokens = chunk_tokens;
        CudaPlanOptions unsplit = dflt;
        unsplit.target_ctas_per_sm = 0;
        CudaPlanOptions split = dflt;
        split.chunks_per_cta = 1;
        CudaPlanOptions table_only = dflt;  // pages read from the block table alone
        table_only.decode_item_pages = false;
        CudaPlanOptions early = split;  // cached positions copied before the kernel's wait
        early.decode_early_cached_kv = true;
        CudaAttentionPlan a(size_t(64) << 20, unsplit), b(size_t(64) << 20, split),
            c(size_t(64) << 20, dflt), e(size_t(64) << 20, table_only),
            f(size_t(64) << 20, early);
        const auto out_a = pr.run_cuda(a), out_b = pr.run_cuda(b), out_c = pr.run_cuda(c);
        EXPECT_EQ(a.info().split_rows, 0);
        EXPECT_GT(b.info().split_rows, 0);
        EXPECT_EQ(out_a, out_b);
        EXPECT_EQ(out_a, out_c);
        EXPECT_EQ(out_a, pr.run_cuda(e));
        EXPECT_EQ(out_a, pr.run_cuda(f));
        // The first sequence alone.
        Spec one = s;
        one.q_len = {1};
        one.kv_len = {5000};
        Problem alone(one, 21);
        alone.q.assign(pr.q.begin(), pr.q.begin() + int64_t(alone.q.size()));
        alone.k_pages = pr.k_pages;
        alone.v_pages = pr.v_pages;
        alone.k_scale = pr.k_scale;
        alone.v_scale = pr.v_scale;
        alone.num_pages = pr.num_pages;
        alone.max_pages_per_seq = pr.max_pages_per_seq;
        alone.block_table.assign(pr.block_table.begin(),
                                 pr.block_table.begin() + pr.max_pages_per_seq);
        alone.upload();
        CudaAttentionPlan d(size_t(64) << 20, dflt);
        const auto out_d = alone.run_cuda(d);
        EXPECT_TRUE(std::equal(out_d.begin(), out_d.end(), out_a.begin()));
      }
    }
  }
}

TEST(CudaAttention, PlanRejectsBadArgumentsWithTheirNames) {
  PA_SKIP_WITHOUT_GPU();
  for (int32_t bad_chunk : {-64, 100, 1 << 25}) {
    CudaPlanOptions o;
    o.decode_chunk_tokens = bad_chunk;
    try {
      CudaAttentionPlan refused(size_t(1) << 20, o);
      ADD_FAILURE() << "no error for decode_chunk_tokens " << bad_chunk;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("decode_chunk_tokens"), std::string::npos) << e.what();
    }
  }
  Spec s;
  s.q_len = {1, 2};
  s.kv_len = {40, 9};
  Problem pr(s, 3);
  CudaAttentionPlan plan;
  QKVTensor out{pr.d_q.data(), s.q_dtype, pr.num_tokens, s.num_q_heads, s.head_dim};
  auto expect_error = [&](const BatchLayout& batch, const QKVTensor& q, const PagedKVView& kv,
                          const QKVTensor& o, const std::string& needle) {
    try {
      plan.plan(q, kv, batch, s.opt, o);
      ADD_FAILURE() << "no error, expected one mentioning " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  BatchLayout bad = pr.batch();
  std::vector<int32_t> table = pr.block_table;
  table[1] = pr.num_pages;  // sequence 0's second page
  bad.block_table = table.data();
  expect_error(bad, pr.device_q(), pr.device_view(), out, "block_table[0][1]");
  std::vector<int32_t> lens = {40, 1000};
  bad = pr.batch();
  bad.kv_len = lens.data();
  expect_error(bad, pr.device_q(), pr.device_view(), out, "kv_len[1]");
  QKVTensor q32 = pr.device_q();
  q32.dtype = DType::f32;
  QKVTensor o32 = out;
  o32.dtype = DType::f32;
  expect_error(pr.batch(), q32, pr.device_view(), o32, "q.dtype");
  PagedKVView kv16 = pr.device_view();
  kv16.dtype = DType::f16;
  expect_error(pr.batch(), pr.device_q(), kv16, out, "kv.dtype");
  // A failed plan cannot be run.
  EXPECT_THROW(paged_attention_cuda(plan, pr.device_q(), pr.device_view(), out), Error);
  // A good plan refuses tensors of another shape.
  plan.plan(pr.device_q(), pr.device_view(), pr.batch(), s.opt, out);
  QKVTensor short_q = pr.device_q();
  short_q.num_tokens -= 1;
  try {
    paged_attention_cuda(plan, short_q, pr.device_view(), out);
    ADD_FAILURE() << "no error for a q of another shape";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("q.num_tokens"), std::string::npos) << e.what();
  }
}

TEST(CudaAttention, WithoutDeviceTheEntryPointsThrow) {
  if (cuda_device_count() != 0) GTEST_SKIP() << "a CUDA device is present";
  EXPECT_THROW(CudaAttentionPlan plan, Error);
  EXPECT_EQ(cuda_sm_count(), 0);
}
