// Admission that foresees growth and cheaper preemption: the forecast of the
// pages a batch will need (admission.h), the scheduler that admits by it (never
// over-committing when lengths are known), the preemption victim that loses the
// least work, and the recompute counters.
#include <gtest/gtest.h>

#include <algorithm>
#include <memory>
#include <random>
#include <vector>

#include "engine/admission.h"
#include "pagedattn/error.h"
#include "engine/scheduler.h"
#include "tiny_models.h"

using namespace pagedattn;

namespace {

// The demand at every step j from 0 to the last finish, straight from the
// definition in admission.h (the function under test only looks at the steps
// where a peak can be).
int64_t peak_by_scan(const std::vector<GrowthForecast> &fs, int32_t ps, int64_t used) {
  int64_t last = 0, peak = used;
  for (const auto &f : fs) last = std::max<int64_t>(last, f.steps_left);
  for (int64_t j = 0; j <= last; ++j) {
    int64_t d = used;
    for (const auto &f : fs) {
      if (j >= f.steps_left) {
        d -= f.freed_pages;
      } else {
        const int64_t kv = std::min<int64_t>(f.num_tokens + j, f.final_kv);
        d += std::max<int64_t>(0, (kv + ps - 1) / ps - f.held_pages);
      }
    }
    peak = std::max(peak, d);
  }
  return peak;
}

using pagedattn::testing::scheduler_kv_config;

// A scheduler over a real cache; every computed logit row becomes token 7, and
// a sequence that reaches its max_length is finished (removed) the way the
// engine does it.
struct Harness {
  KvCache cache;
  Scheduler sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
  uint64_t next_order = 0;
  int64_t max_pages_used = 0;

  Harness(KvCacheConfig kc, SchedulerConfig sc) : cache(kc), sched(sc, cache) {}

  Sequence *add(int32_t prompt_len, int32_t max_tokens, bool exact = true) {
    auto s = std::make_unique<Sequence>(SamplingParams{});
    for (int32_t i = 0; i < prompt_len; ++i) s->tokens.push_back(100 + int32_t(next_order) + i);
    s->prompt_len = prompt_len;
    s->max_length = prompt_len + max_tokens;
    s->exact_length = exact;
    s->order = (next_order++) << 8;
    sched.add_waiting(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  SchedulerOutput step() {
    SchedulerOutput out = sched.schedule();
    max_pages_used = std::max<int64_t>(max_pages_used, cache.stats().pages_used);
    sched.commit(out);
    for (const ScheduledSeq &s : out.scheduled) {
      if (s.logit_row < 0) continue;
      s.seq->tokens.push_back(7);
      if (s.seq->num_tokens() >= s.seq->max_length) {
        s.seq->finish = FinishReason::length;
        sched.remove(s.seq);
      }
    }
    return out;
  }
  int64_t run(int32_t max_steps = 10000) {
    int64_t preempted = 0;
    for (int32_t i = 0; i < max_steps && sched.has_work(); ++i)
      preempted += step().preempted.size();
    EXPECT_FALSE(sched.has_work()) << "did not finish in " << max_steps << " steps";
    return preempted;
  }
};

// Twelve requests of varied prompt and output lengths in 40 pages of 4 tokens.
void add_varied(Harness &h, bool exact = true) {
  std::mt19937 rng(5);
  for (int32_t i = 0; i < 12; ++i) h.add(5 + int32_t(rng() % 26), 5 + int32_t(rng() % 36), exact);
}

}  // namespace

TEST(GrowthForecast, PeakByHand) {
  // Page size 4. A: 6 tokens in 2 pages, grows to 11 (3 pages) over 6 steps. B:
  // 3 tokens in 1 page, finishes after 2 steps freeing it. Step 0: +0; step 1:
  // B alive (kv 4, 1 page), A kv 7 (2 pages); step 2: B gone (-1); A reaches 3
  // pages at kv 9 (step 3): demand 10 + 1 - 1 = 10.
  std::vector<GrowthForecast> fs = {{6, 11, 6, 2, 2}, {3, 4, 2, 1, 1}};
  EXPECT_EQ(forecast_peak_pages(fs, 4, 10), 10);
  // B freeing nothing (its page is shared): 11 at A's end.
  fs[1].freed_pages = 0;
  EXPECT_EQ(forecast_peak_pages(fs, 4, 10), 11);
  // B growing to kv 6 (2 pages) over 4 steps: at step 3 A is at kv 9 (3 pages)
  // and B at kv 6, one page more each: 12.
  fs[1] = {3, 6, 4, 1, 1};
  EXPECT_EQ(forecast_peak_pages(fs, 4, 10), 12);
  EXPECT_EQ(forecast_peak_pages({}, 4, 3), 3);
}

TEST(GrowthForecast, EqualsAFullScanOnRandomBatches) {
  std::mt19937 rng(11);
  for (int trial = 0; trial < 500; ++trial) {
    const int32_t ps = 1 + int32_t(rng() % 16);
    std::vector<GrowthForecast> fs(rng() % 12);
    int64_t used = 0;
    for (auto &f : fs) {
      f.num_tokens = 1 + int32_t(rng() % 100);
      f.steps_left = 1 + int32_t(rng() % 80);
      f.final_kv = f.num_tokens + int32_t(rng() % (f.steps_left + 1));
      f.held_pages = (f.num_tokens - 1 - int32_t(rng() % 2)) / ps + 1;  // this step's page or not
      f.freed_pages = int32_t(rng() % (f.held_pages + 1));
      used += f.held_pages;
    }
    ASSERT_EQ(forecast_peak_pages(fs, ps, used), peak_by_scan(fs, ps, used)) << "trial " << trial;
  }
}

TEST(GrowthForecast, BadForecastThrows) {
  std::vector<GrowthForecast> fs = {{6, 5, 1, 2, 2}};  // final_kv below num_tokens
  EXPECT_THROW(forecast_peak_pages(fs, 4, 0), Error);
  fs = {{6, 8, 0, 2, 2}};  // no step left
  EXPECT_THROW(forecast_peak_pages(fs, 4, 0), Error);
  fs = {{6, 8, 2, 2, 3}};  // frees more than it holds
  EXPECT_THROW(forecast_peak_pages(fs, 4, 0), Error);
  EXPECT_THROW(forecast_peak_pages({}, 0, 0), Error);
}

TEST(OutputLengthStats, WorstCaseUntilEnoughSamplesThenAPercentileOfLongerOnes) {
  OutputLengthStats st;
  for (int i = 0; i < int(OutputLengthStats::kMinSamples) - 1; ++i) st.observe(10);
  EXPECT_EQ(st.estimate(0, 500), 500);  // too few samples
  st.observe(10);
  EXPECT_EQ(st.estimate(0, 500), 10);
  EXPECT_EQ(st.estimate(3, 8), 8);  // capped by max_tokens
  for (int v = 1; v <= 100; ++v) st.observe(v);
  // Longer than 50: 51..100 -> the 90th percentile of those is 95 or 96.
  EXPECT_NEAR(st.estimate(50, 1000), 95.5, 0.5);
  EXPECT_EQ(st.estimate(100, 1000),
            1000);  // longer than any seen: the worst case
  for (int i = 0; i < 1000; ++i) st.observe(4);
  EXPECT_EQ(st.size(), OutputLengthStats::kWindow);
  EXPECT_EQ(st.estimate(0, 1000), 4);
}

TEST(Admission, LookaheadNeverOverCommitsWhenLengthsAreKnown) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 64;
  Harness look(scheduler_kv_config(40, 4), sc);
  add_varied(look);
  int64_t preempted = 0;
  for (int32_t i = 0; i < 10000 && look.sched.has_work(); ++i) {
    preempted += int64_t(look.step().preempted.size());
    // What was admitted still fits at its forecast peak, with nothing else
    // admitted.
    ASSERT_LE(look.sched.forecast_peak_pages(), 40) << "step " << i;
  }
  EXPECT_FALSE(look.sched.has_work());
  EXPECT_EQ(preempted, 0);
  EXPECT_EQ(look.sched.num_preemptions(), 0);
  EXPECT_EQ(look.sched.recomputed_tokens(), 0);
  EXPECT_GT(look.sched.admission_stalls(), 0);  // it did hold requests back
  EXPECT_GT(look.max_pages_used, 30);           // and still filled the pool
  EXPECT_EQ(look.cache.stats().pages_used, 0);

  // The same workload admitted on current use alone outgrows the pool.
  sc.admission = AdmissionPolicy::immediate;
  sc.victim = VictimPolicy::newest;
  Harness now(scheduler_kv_config(40, 4), sc);
  add_varied(now);
  EXPECT_GT(now.run(), 0);
  EXPECT_GT(now.sched.recomputed_tokens(), 0);
}

TEST(Admission, EstimatedLengthsStillFinishWithoutLivelock) {
  // Outputs that may stop early (exact_length false): the forecast starts at
  // the worst case and learns from the finished ones; a miss is caught by
  // preemption. Everything finishes.
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 64;
  Harness h(scheduler_kv_config(40, 4), sc);
  for (int rep = 0; rep < 3; ++rep) add_varied(h, false);
  h.run();
  EXPECT_EQ(h.cache.stats().pages_used, 0);
}

TEST(Admission, ASequenceAloneIsAdmittedEvenIfItsForecastDoesNotFit) {
  // 10 pages of 4 tokens; the request ends at 60 tokens (15 pages): it runs
  // alone and is finished for want of memory rather than waiting forever.
  SchedulerConfig sc;
  Harness h(scheduler_kv_config(10, 4), sc);
  Sequence *s = h.add(8, 52);
  SchedulerOutput out = h.step();
  EXPECT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(s->num_computed, 8);
}

TEST(Preemption, VictimLosesTheLeastComputedWork) {
  // 12 pages of 4 tokens. C (oldest) decodes; A holds 3 computed tokens, B
  // (newest) 19. When C needs a page, least_work preempts A; newest would
  // preempt B.
  for (VictimPolicy v : {VictimPolicy::least_work, VictimPolicy::newest}) {
    SchedulerConfig sc;
    sc.admission = AdmissionPolicy::immediate;
    sc.watermark_pages = 0;
    sc.victim = v;
    Harness h(scheduler_kv_config(12, 4), sc);
    Sequence *c = h.add(24, 100, false);
    Sequence *a = h.add(3, 100, false);
    Sequence *b = h.add(19, 100, false);
    h.step();  // all three prefilled: C 6 pages, A 1, B 5 = 12 (A's and B's next
               // token fit)
    ASSERT_EQ(h.cache.num_available_pages(), 0);
    SchedulerOutput out = h.step();  // C (25 tokens) needs a 7th page; A's tail has room
    ASSERT_EQ(out.preempted.size(), 1u);
    EXPECT_EQ(out.preempted[0], v == VictimPolicy::least_work ? a : b);
    EXPECT_GE(c->cache_seq, 0);
  }
}

TEST(Preemption, RecomputedTokensAndPrefixHitsOnResumeAreCounted) {
  for (bool prefix : {true, false}) {
    SchedulerConfig sc;
    sc.admission = AdmissionPolicy::immediate;
    sc.watermark_pages = 0;
    sc.enable_prefix_cache = prefix;
    KvCacheConfig kc = scheduler_kv_config(12, 4);
    kc.enable_prefix_cache = prefix;
    Harness h(kc, sc);
    Sequence *c = h.add(24, 100, false);
    Sequence *b = h.add(22, 100, false);  // 6 pages: 5 full, a tail of 2
    h.step();
    ASSERT_EQ(h.cache.num_available_pages(), 0);
    SchedulerOutput out = h.step();  // C needs a page: B (the only other) is preempted
    ASSERT_EQ(out.preempted.size(), 1u);
    ASSERT_EQ(out.preempted[0], b);
    EXPECT_EQ(h.sched.preempted_computed_tokens(), 22);
    // B's partial tail page went to the free list and C took it: with the
    // prefix cache B's 5 full pages (20 tokens) stay cached. Finish C now so
    // that B comes back.
    c->finish = FinishReason::length;
    h.sched.remove(c);
    h.step();  // B re-admitted: 23 tokens exist, 22 were computed before
    EXPECT_EQ(b->num_computed, 23);
    const int64_t reused = prefix ? 20 : 0;
    EXPECT_EQ(h.cache.stats().resume_hits, reused);
    EXPECT_EQ(h.sched.recomputed_tokens(), 22 - reused);
    // A re-admission is not a first-time prefix query; with the cache off nothing is queried.
    EXPECT_EQ(h.cache.stats().prefix_queries, prefix ? 24 + 22 : 0);
  }
}

TEST(Admission, ParsePolicy) {
  EXPECT_EQ(parse_admission_policy("lookahead"), AdmissionPolicy::lookahead);
  EXPECT_EQ(parse_admission_policy("immediate"), AdmissionPolicy::immediate);
  EXPECT_THROW(parse_admission_policy("greedy"), Error);
}
