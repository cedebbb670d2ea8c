// The Hopper (wgmma + bulk tensor copy) prefill kernel against the double-precision reference:
// random ragged, chunked and mixed batches over every head dim, GQA group and page size it takes,
// outputs poisoned with NaN and unwritten cache slots holding NaN (cuda_problem.h).
#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <memory>
#include <random>
#include <string>
#include <thread>

#include "cuda_problem.h"
#include "pagedattn/error.h"

using namespace pagedattn;
using namespace pagedattn::gputest;

namespace {

// Skips (and says why) unless the plan would pick the Hopper kernel for a plain prefill here.
bool hopper_here() {
  Spec s;
  s.q_len = {3};
  s.kv_len = {3};
  Problem pr(s, 1);
  CudaAttentionPlan plan;
  pr.run_cuda(plan);
  return plan.info().prefill_hopper;
}

#define PA_SKIP_WITHOUT_HOPPER() \
  PA_SKIP_WITHOUT_GPU();         \
  if (!hopper_here())            \
  GTEST_SKIP() << "the Hopper prefill kernel needs an sm_90 GPU and a build for sm_90a"

Spec random_hopper_spec(std::mt19937_64& rng) {
  auto pick = [&](std::initializer_list<int> v) { return *(v.begin() + rng() % v.size()); };
  Spec s;
  s.q_dtype = s.kv_dtype = rng() % 3 ? DType::bf16 : DType::f16;
  if (rng() % 4 == 0) s.kv_dtype = DType::fp8_e4m3;  // e4m3 pools with per-head scales
  s.head_dim = pick({64, 128, 256});
  s.page_size = pick({1, 8, 12, 16, 32, 48, 64, 128, 384, 1024});
  s.num_kv_heads = pick({1, 2, 4});
  s.num_q_heads = s.num_kv_heads * pick({1, 2, 4, 8, 16});
  if (s.num_q_heads > 32) s.num_q_heads = s.num_kv_heads * 8;
  const int n = 1 + int(rng() % 4);
  for (int b = 0; b < n; ++b) {
    const int kv = 1 + int(rng() % (rng() % 8 == 0 ? 2000 : 700));
    int q = 1 + int(rng() % uint64_t(std::min(kv, 160)));
    if (rng() % 5 == 0) q = 1;   // a decode row beside the prefill rows
    if (rng() % 8 == 0) q = kv;  // a whole prompt
    if (q > 300) q = 300;
    s.kv_len.push_back(kv);
    s.q_len.push_back(q);
  }
  s.opt.causal = rng() % 5 != 0;
  if (rng() % 4 == 0) s.opt.window = 1 + int(rng() % 500);
  if (rng() % 5 == 0) s.opt.softcap = 5.f + float(rng() % 30);
  if (rng() % 5 == 0) s.opt.scale = 0.02f + float(rng() % 100) * 0.001f;
  return s;
}

// The plan's choices (tensor copies wherever the page size allows, the overlapped loop), K/V
// gathered, the serial loop, both; the overlapped loop without ping-pong.
enum class Variant { automatic, gather, serial, gather_serial, no_pingpong };

CudaPlanOptions options(Variant v) {
  CudaPlanOptions o;
  o.hopper_gather = v == Variant::gather || v == Variant::gather_serial;
  o.hopper_prefill_overlap = !(v == Variant::serial || v == Variant::gather_serial);
  o.hopper_pingpong = v != Variant::no_pingpong;
  return o;
}

// A random schedule of the kernel's works: heads per L2 section (the plan's choice, one, or a
// few), ping-pong between the consumer warpgroups on or off, and the grid (one CTA per SM, one
// per work, or a few CTAs that each run many works, their barriers' phases running on).
CudaPlanOptions random_schedule(CudaPlanOptions o, std::mt19937_64& rng) {
  const int32_t sections[] = {-1, 1, 2, 3};
  o.hopper_head_section = sections[rng() % 4];
  o.hopper_pingpong = rng() % 2 == 0;
  const int32_t ctas[] = {-1, 0, 1, 2, 5};
  o.hopper_ctas = ctas[rng() % 5];
  return o;
}

// Whether the plan runs the Hopper kernel for this spec under these options: fp8 pools only by
// tensor copies (a page size that is a multiple of 8, no gathering asked for).
bool hopper_takes(const Spec& s, const CudaPlanOptions& o) {
  if (s.kv_dtype != DType::fp8_e4m3) return true;
  return !o.hopper_gather && s.page_size % 8 == 0;
}

void check_hopper(const Spec& s, uint64_t seed, bool expect_hopper = true,
                  Variant variant = Variant::automatic) {
  Problem pr(s, seed);
  CudaAttentionPlan plan(size_t(64) << 20, options(variant));
  const std::vector<uint8_t> got = pr.run_cuda(plan);
  bool any_prefill = false;
  for (int32_t q : s.q_len) any_prefill |= q > 1;
  if (any_prefill) {
    EXPECT_EQ(plan.info().prefill_hopper, expect_hopper) << describe(s);
  }
  expect_close(got, s.q_dtype, pr.reference(), describe(s) + " seed " + std::to_string(seed));
}

}  // namespace

// The GPU runs the problems one by one; the double-precision references (the slow part) are
// computed on every core afterwards.
TEST(HopperPrefill, MatchesReferenceOnRandomShapes) {
  PA_SKIP_WITHOUT_HOPPER();
  constexpr int kProblems = 200;
  std::mt19937_64 rng(2026);
  std::vector<std::unique_ptr<Problem>> problems;
  std::vector<std::vector<uint8_t>> got;
  for (int i = 0; i < kProblems; ++i) {
    const Spec s = random_hopper_spec(rng);
    problems.push_back(std::make_unique<Problem>(s, 5000 + uint64_t(i)));
    // Both producers and both loops over every page size (tensor copies fall back to gathering
    // where a page is not a multiple of 8 tokens).
    const Variant variants[] = {Variant::automatic, Variant::gather, Variant::serial,
                                  Variant::gather_serial};
    const CudaPlanOptions o = random_schedule(options(variants[i % 4]), rng);
    CudaAttentionPlan plan(size_t(64) << 20, o);
    got.push_back(problems.back()->run_cuda(plan));
    bool any_prefill = false;
    for (int32_t q : s.q_len) any_prefill |= q > 1;
    if (any_prefill) {
      EXPECT_EQ(plan.info().prefill_hopper, hopper_takes(s, o)) << describe(s);
    }
  }
  std::vector<std::vector<float>> refs(problems.size());
  std::atomic<size_t> next{0};
  std::vector<std::thread> workers;
  const unsigned n = std::clamp(std::thread::hardware_concurrency(), 1u, 16u);
  for (unsigned w = 0; w < n; ++w)
    workers.emplace_back([&] {
      for (size_t k; (k = next++) < problems.size();) refs[k] = problems[k]->reference();
    });
  for (std::thread& t : workers) t.join();
  for (size_t k = 0; k < problems.size(); ++k) {
    expect_close(got[k], problems[k]->spec.q_dtype, refs[k],
                 describe(problems[k]->spec) + " seed " + std::to_string(5000 + k));
    if (HasFailure()) return;
  }
}

// A chunk of queries at the end of a long cached context (offset causal), with and without a
// sliding window, and a whole prompt spanning many tiles.
TEST(HopperPrefill, ChunksAtTheEndOfLongContexts) {
  PA_SKIP_WITHOUT_HOPPER();
  Spec s;
  s.num_q_heads = 4;
  s.num_kv_heads = 1;
  s.head_dim = 128;
  s.page_size = 16;
  s.q_len = {256, 40};
  s.kv_len = {6000, 3001};
  check_hopper(s, 21);
  s.opt.window = 1000;
  check_hopper(s, 22);
  check_hopper(s, 22, true, Variant::serial);
  check_hopper(s, 22, true, Variant::no_pingpong);
  s.opt.window = 0;
  s.page_size = 128;
  s.q_len = {700};
  s.kv_len = {700};
  check_hopper(s, 23);
  check_hopper(s, 23, true, Variant::gather);
}

// fp8 pools on the Hopper kernel (staging tiles converted by the producer): chunks at the end of
// long contexts, whole prompts over many tiles, every head dim, with and without ping-pong.
TEST(HopperPrefill, Fp8PoolsRunOnTheHopperKernel) {
  PA_SKIP_WITHOUT_HOPPER();
  for (int d : {64, 128, 256}) {
    Spec s;
    s.num_q_heads = 8;
    s.num_kv_heads = 2;
    s.head_dim = d;
    s.page_size = d == 64 ? 8 : 16;
    s.kv_dtype = DType::fp8_e4m3;
    s.q_len = {300, 1, 64};
    s.kv_len = {2500, 700, 64};
    check_hopper(s, 40 + uint64_t(d));
    check_hopper(s, 41 + uint64_t(d), true, Variant::no_pingpong);
    s.q_dtype = DType::f16;
    s.opt.window = 200;
    check_hopper(s, 42 + uint64_t(d), true, Variant::serial);
  }
}

// Sharp and flat softmaxes over many tiles: a logit scale well above 1 / sqrt(head_dim) moves
// rows' running maxima by steps both under and over the kernel's lazy threshold (kLazyMax), so
// probabilities up to 2^8 go through P and O is rescaled only sometimes; a small scale keeps every
// row near uniform. bf16 and fp8 pools, both loops.
TEST(HopperPrefill, SharpAndFlatSoftmaxesOverManyTiles) {
  PA_SKIP_WITHOUT_HOPPER();
  for (int d : {64, 128, 256})
    for (DType kv : {DType::bf16, DType::fp8_e4m3})
      for (float scale : {2.f, 0.01f}) {
        Spec s;
        s.num_q_heads = 8;
        s.num_kv_heads = 2;
        s.head_dim = d;
        s.page_size = 16;
        s.kv_dtype = kv;
        s.opt.scale = scale;
        s.q_len = {300, 64};
        s.kv_len = {1500, 2100};
        const uint64_t seed = 60 + uint64_t(d) + (kv == DType::fp8_e4m3 ? 7 : 0);
        check_hopper(s, seed);
        if (d == 128) check_hopper(s, seed + 1, true, Variant::serial);
      }
}

// The two producers fill the stages with the same values (slots past kv_len: zeroed in V, masked
// in K), so the outputs are the same bits.
TEST(HopperPrefill, GatherAndTensorCopiesGiveTheSameBits) {
  PA_SKIP_WITHOUT_HOPPER();
  std::mt19937_64 rng(77);
  for (int i = 0; i < 40; ++i) {
    Spec s = random_hopper_spec(rng);
    if (s.page_size % 8 != 0) s.page_size = 16;
    s.kv_dtype = s.q_dtype;  // fp8 pools are never gathered
    Problem pr(s, 9000 + uint64_t(i));
    CudaAttentionPlan tensor(size_t(64) << 20, options(Variant::automatic));
    CudaAttentionPlan gather(size_t(64) << 20, options(Variant::gather));
    const std::vector<uint8_t> a = pr.run_cuda(tensor);
    ASSERT_EQ(a, pr.run_cuda(gather)) << describe(s);
  }
}

// The order of the works and whether the consumer warpgroups take turns change nothing in a
// row's arithmetic: every schedule gives the same bits.
TEST(HopperPrefill, EveryScheduleGivesTheSameBits) {
  PA_SKIP_WITHOUT_HOPPER();
  std::mt19937_64 rng(91);
  for (int i = 0; i < 40; ++i) {
    Spec s = random_hopper_spec(rng);
    Problem pr(s, 9500 + uint64_t(i));
    CudaPlanOptions base = options(i % 3 == 2 ? Variant::gather : Variant::automatic);
    base.hopper_head_section = 1;
    base.hopper_pingpong = false;
    base.hopper_ctas = 0;
    CudaAttentionPlan plain(size_t(64) << 20, base);
    const std::vector<uint8_t> a = pr.run_cuda(plain);
    for (int k = 0; k < 3; ++k) {
      const CudaPlanOptions o = random_schedule(base, rng);
      CudaAttentionPlan other(size_t(64) << 20, o);
      ASSERT_EQ(a, pr.run_cuda(other))
          << describe(s) << " head_section " << o.hopper_head_section << " pingpong "
          << o.hopper_pingpong << " ctas " << o.hopper_ctas;
    }
  }
}

// Bad schedule options are refused by name.
TEST(HopperPrefill, RefusesBadScheduleOptions) {
  PA_SKIP_WITHOUT_GPU();
  auto refusal = [](const CudaPlanOptions& o) -> std::string {
    try {
      CudaAttentionPlan plan(size_t(1) << 20, o);
    } catch (const Error& e) {
      return e.what();
    }
    return "";
  };
  CudaPlanOptions o;
  o.hopper_head_section = 0;
  EXPECT_NE(refusal(o).find("hopper_head_section"), std::string::npos) << refusal(o);
  o.hopper_head_section = -3;
  EXPECT_NE(refusal(o).find("hopper_head_section"), std::string::npos) << refusal(o);
  o.hopper_head_section = -1;
  o.hopper_ctas = -2;
  EXPECT_NE(refusal(o).find("hopper_ctas"), std::string::npos) << refusal(o);
}

// A few CTAs, each running many works one after the other: the K/V ring's stages, the barriers'
// phases, Q's reuse, the published work indices and the ping-pong turns run on from work to work
// (works of different lengths, tiles crossing kv_len, windows, a decode row beside them), against
// the reference and against one CTA per work, bit for bit, launch after launch of one plan. One
// test per head dim (a racecheck run takes one), and fp8 pools (whose producer converts K/V).
namespace {
void check_few_ctas(int d, DType kv = DType::bf16) {
  Spec s;
  s.kv_dtype = kv;
  s.num_q_heads = 8;
  s.num_kv_heads = 2;
  s.head_dim = d;
  s.page_size = 16;
  s.q_len = {300, 1, 77, 500};
  s.kv_len = {1333, 700, 77, 900};
  for (int window : {0, 250}) {
    s.opt.window = window;
    Problem pr(s, 60 + uint64_t(d) + uint64_t(window) + (kv == DType::bf16 ? 0 : 7));
    const std::vector<float> ref = pr.reference();
    for (Variant v : {Variant::automatic, Variant::gather, Variant::serial, Variant::no_pingpong}) {
      CudaPlanOptions one_each = options(v);
      one_each.hopper_ctas = 0;
      CudaAttentionPlan plan0(size_t(64) << 20, one_each);
      const std::vector<uint8_t> want = pr.run_cuda(plan0);
      expect_close(want, s.q_dtype, ref, describe(s));
      // Three launches of one plan: the work counter is back at zero after each.
      for (int32_t ctas : {1, 3}) {
        CudaPlanOptions o = options(v);
        o.hopper_ctas = ctas;
        CudaAttentionPlan plan(size_t(64) << 20, o);
        for (const std::vector<uint8_t>& got : pr.run_cuda_repeated(plan, 3))
          ASSERT_EQ(want, got) << describe(s) << " ctas " << ctas;
      }
    }
  }
}
}  // namespace

TEST(HopperPrefill, FewCtasRunEveryWork64) {
  PA_SKIP_WITHOUT_HOPPER();
  check_few_ctas(64);
}

TEST(HopperPrefill, FewCtasRunEveryWork128) {
  PA_SKIP_WITHOUT_HOPPER();
  check_few_ctas(128);
}

TEST(HopperPrefill, FewCtasRunEveryWork256) {
  PA_SKIP_WITHOUT_HOPPER();
  check_few_ctas(256);
}

TEST(HopperPrefill, FewCtasRunEveryWorkFp8x64) {
  PA_SKIP_WITHOUT_HOPPER();
  check_few_ctas(64, DType::fp8_e4m3);
}

TEST(HopperPrefill, FewCtasRunEveryWorkFp8x128) {
  PA_SKIP_WITHOUT_HOPPER();
  check_few_ctas(128, DType::fp8_e4m3);
}

TEST(HopperPrefill, FewCtasRunEveryWorkFp8x256) {
  PA_SKIP_WITHOUT_HOPPER();
  check_few_ctas(256, DType::fp8_e4m3);
}

// Shapes the Hopper kernel does not take run on the mma.sync kernel, correctly.
TEST(HopperPrefill, OtherShapesTakeTheMmaKernel) {
  PA_SKIP_WITHOUT_HOPPER();
  Spec s;
  s.num_q_heads = 6;
  s.num_kv_heads = 2;  // group 3 does not divide the 128-row tile
  s.q_len = {100, 1};
  s.kv_len = {300, 50};
  check_hopper(s, 31, false);
  // A page that is not a multiple of 8 tokens has no bulk tensor copy, but is gathered.
  s.num_q_heads = 8;
  s.page_size = 12;
  check_hopper(s, 32, true);
}
