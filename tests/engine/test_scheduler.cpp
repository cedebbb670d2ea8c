// Scheduler unit tests: a real KvCache, the engine's sampling replaced by
// "append token 1".
#include <gtest/gtest.h>

#include <memory>
#include <vector>

#include "pagedattn/error.h"
#include "engine/scheduler.h"
#include "tiny_models.h"

using namespace pagedattn;

namespace {

using pagedattn::testing::scheduler_kv_config;

struct Harness {
  KvCache cache;
  Scheduler sched;
  std::vector<std::unique_ptr<Sequence>> seqs;
  uint64_t next_order = 0;

  Harness(KvCacheConfig kc, SchedulerConfig sc) : cache(kc), sched(sc, cache) {}

  Sequence *add(int32_t prompt_len, int32_t first_token = 1) {
    auto s = std::make_unique<Sequence>(SamplingParams{});
    for (int32_t i = 0; i < prompt_len; ++i) s->tokens.push_back(first_token + i);
    s->prompt_len = prompt_len;
    s->order = (next_order++) << 8;
    sched.add_waiting(s.get());
    seqs.push_back(std::move(s));
    return seqs.back().get();
  }
  // One step: schedule, commit, and give every sequence whose logits were
  // computed a new token.
  SchedulerOutput step() {
    SchedulerOutput out = sched.schedule();
    sched.commit(out);
    for (const ScheduledSeq &s : out.scheduled)
      if (s.logit_row >= 0) s.seq->tokens.push_back(7);
    return out;
  }
  int32_t scheduled_tokens(const SchedulerOutput &out, const Sequence *s) {
    for (const ScheduledSeq &e : out.scheduled)
      if (e.seq == s) return e.num_tokens;
    return 0;
  }
};

}  // namespace

TEST(Scheduler, TokenBudgetAndSeqLimitRespected) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 10;
  sc.max_num_seqs = 3;
  Harness h(scheduler_kv_config(256, 4), sc);
  for (int32_t len : {7, 5, 9, 13, 2, 30}) h.add(len);
  int32_t steps = 0;
  while (h.sched.has_work() && steps < 200) {
    SchedulerOutput out = h.step();
    ASSERT_LE(int32_t(out.batch.tokens.size()), 10);
    ASSERT_LE(int32_t(out.scheduled.size()), 3);
    ASSERT_EQ(out.batch.q_indptr.back(), int32_t(out.batch.tokens.size()));
    ASSERT_EQ(out.batch.slots.size(), out.batch.tokens.size());
    // Finish sequences after 4 generated tokens.
    for (auto &s : h.seqs)
      if (s->cache_seq >= 0 && s->num_generated() >= 4 && s->num_uncomputed() == 1)
        h.sched.remove(s.get());
    ++steps;
  }
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.cache.stats().pages_used, 0);
}

TEST(Scheduler, FirstStepChunksPrefillsInArrivalOrder) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 10;
  Harness h(scheduler_kv_config(256, 4), sc);
  Sequence *a = h.add(7);
  Sequence *b = h.add(5);
  SchedulerOutput out = h.sched.schedule();
  ASSERT_EQ(out.scheduled.size(), 2u);
  EXPECT_EQ(out.scheduled[0].seq, a);
  EXPECT_EQ(out.scheduled[0].num_tokens, 7);
  EXPECT_EQ(out.scheduled[0].logit_row, 0);
  EXPECT_EQ(out.scheduled[1].seq, b);
  EXPECT_EQ(out.scheduled[1].num_tokens, 3);  // chunked: the rest next step
  EXPECT_EQ(out.scheduled[1].logit_row, -1);
  EXPECT_EQ(out.batch.logit_rows, std::vector<int32_t>{6});
  EXPECT_EQ(out.batch.positions[7], 0);
  EXPECT_EQ(out.batch.positions[9], 2);
}

TEST(Scheduler, RunningDecodesComeFirstAndNeverStarve) {
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 16;
  Harness h(scheduler_kv_config(512, 4), sc);
  Sequence *a = h.add(3);
  Sequence *b = h.add(4);
  h.step();
  ASSERT_EQ(a->num_uncomputed(), 1);
  ASSERT_EQ(b->num_uncomputed(), 1);
  Sequence *c = h.add(100);
  Sequence *d = h.add(40);
  int32_t steps = 0;
  while (c->num_uncomputed() > 1 || d->num_computed == 0) {
    SchedulerOutput out = h.step();
    ASSERT_GE(out.scheduled.size(), 3u);
    // Both decodes, first, one token each; the prefill gets what is left.
    EXPECT_EQ(out.scheduled[0].seq, a);
    EXPECT_EQ(out.scheduled[1].seq, b);
    EXPECT_EQ(out.scheduled[0].num_tokens, 1);
    EXPECT_EQ(out.scheduled[1].num_tokens, 1);
    EXPECT_EQ(int32_t(out.batch.tokens.size()), 16);
    ASSERT_LT(++steps, 50);
  }
  // c (older) finished its prefill before d started: no skipping ahead in the
  // waiting queue.
  EXPECT_EQ(h.scheduled_tokens(h.step(), c), 1);
}

TEST(Scheduler, AdmissionWaitsForPages) {
  SchedulerConfig sc;
  sc.watermark_pages = 0;
  Harness h(scheduler_kv_config(8, 4), sc);
  Sequence *a = h.add(20);       // 5 pages
  Sequence *b = h.add(16, 100);  // 4 pages: only 3 left
  SchedulerOutput out = h.step();
  ASSERT_EQ(out.scheduled.size(), 1u);
  EXPECT_EQ(out.scheduled[0].seq, a);
  EXPECT_EQ(h.sched.num_waiting(), 1);
  EXPECT_EQ(b->cache_seq, -1);
  EXPECT_EQ(h.cache.stats().pages_used, 5);
  out = h.step();  // a decodes (token 21 fits in page 5... a needs a 6th page),
                   // b still waits
  EXPECT_EQ(h.sched.num_waiting(), 1);
  EXPECT_EQ(h.scheduled_tokens(out, b), 0);
  h.sched.remove(a);
  EXPECT_EQ(h.cache.stats().pages_used, 0);
  out = h.step();
  EXPECT_EQ(h.scheduled_tokens(out, b), 16);
  EXPECT_EQ(h.sched.num_waiting(), 0);
}

TEST(Scheduler, WatermarkKeepsPagesSpare) {
  SchedulerConfig sc;
  sc.watermark_pages = 2;
  Harness h(scheduler_kv_config(10, 4), sc);
  h.add(16);                     // 4 pages (alone: no watermark needed)
  Sequence *b = h.add(16, 100);  // 4 more would leave 2: allowed
  Sequence *c = h.add(4, 200);   // 1 more would leave 1 < 2: waits
  SchedulerOutput out = h.step();
  EXPECT_EQ(h.scheduled_tokens(out, b), 16);
  EXPECT_EQ(h.scheduled_tokens(out, c), 0);
  EXPECT_EQ(h.sched.num_waiting(), 1);
}

TEST(Scheduler, PreemptsNewestWhenPagesRunOut) {
  SchedulerConfig sc;
  sc.watermark_pages = 0;
  sc.enable_prefix_cache = false;  // (with it, b's full pages would be reattached)
  Harness h(scheduler_kv_config(5, 4), sc);
  Sequence *a = h.add(8);       // 2 pages
  Sequence *b = h.add(8, 100);  // 2 pages (different tokens: no prefix sharing)
  h.step();
  EXPECT_EQ(h.cache.stats().pages_used, 4);
  // Token 9 of each needs a page: a takes the last one, b (newest) is
  // preempted.
  SchedulerOutput out = h.step();
  ASSERT_EQ(out.preempted.size(), 1u);
  EXPECT_EQ(out.preempted[0], b);
  EXPECT_EQ(b->cache_seq, -1);
  EXPECT_EQ(b->num_computed, 0);
  EXPECT_EQ(h.sched.num_waiting(), 1);
  EXPECT_EQ(h.scheduled_tokens(out, a), 1);
  EXPECT_EQ(h.sched.num_preemptions(), 1);
  EXPECT_EQ(b->num_tokens(), 9);  // its tokens are kept for the recompute
  // Once a is gone, b is recomputed from scratch: all 9 tokens in one chunk.
  h.sched.remove(a);
  out = h.step();
  EXPECT_EQ(h.scheduled_tokens(out, b), 9);
}

TEST(Scheduler, SequenceLargerThanTheCacheFinishesInsteadOfLooping) {
  SchedulerConfig sc;
  Harness h(scheduler_kv_config(2, 4), sc);
  Sequence *a = h.add(7);
  SchedulerOutput out = h.step();
  EXPECT_EQ(h.scheduled_tokens(out, a), 7);
  out = h.step();  // position 7: the last slot
  EXPECT_EQ(h.scheduled_tokens(out, a), 1);
  out = h.step();  // position 8 needs a third page
  ASSERT_EQ(out.out_of_memory.size(), 1u);
  EXPECT_EQ(out.out_of_memory[0], a);
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.cache.stats().pages_used, 0);
}

// Whether a prompt fits is the engine's check
// (EngineModes.PromptThatCanNeverFitIsRefusedAtTheDoor); one that reaches the scheduler anyway
// comes out as out of memory, holding nothing.
TEST(Scheduler, PromptsThatCanNeverFitComeOutAsOutOfMemory) {
  Harness h(scheduler_kv_config(2, 4), SchedulerConfig{});
  Sequence *a = h.add(9);
  std::vector<Sequence *> oom;
  for (int step = 0; step < 3 && h.sched.has_work(); ++step) {
    const SchedulerOutput out = h.step();  // the 8 tokens that fit, then nothing more can
    oom.insert(oom.end(), out.out_of_memory.begin(), out.out_of_memory.end());
  }
  ASSERT_EQ(oom.size(), 1u);
  EXPECT_EQ(oom[0], a);
  EXPECT_FALSE(h.sched.has_work());
  EXPECT_EQ(h.sched.num_waiting(), 0);
  EXPECT_EQ(h.cache.stats().pages_used, 0);
}

TEST(Scheduler, PrefixHitSkipsCachedPages) {
  SchedulerConfig sc;
  Harness h(scheduler_kv_config(64, 4), sc);
  Sequence *a = h.add(13);
  h.step();
  h.sched.remove(a);
  EXPECT_EQ(h.cache.stats().pages_cached, 3);
  Sequence *b = h.add(13);  // same tokens 1..13
  SchedulerOutput out = h.step();
  EXPECT_EQ(h.scheduled_tokens(out, b), 1);
  EXPECT_EQ(out.batch.positions[0], 12);
  EXPECT_EQ(h.cache.stats().prefix_hits, 12);

  SchedulerConfig off;
  off.enable_prefix_cache = false;
  Harness h2(scheduler_kv_config(64, 4), off);
  Sequence *c = h2.add(13);
  h2.step();
  h2.sched.remove(c);
  Sequence *d = h2.add(13);
  EXPECT_EQ(h2.scheduled_tokens(h2.step(), d), 13);
}

TEST(Scheduler, BadConfigThrows) {
  KvCache cache(scheduler_kv_config(8, 4));
  SchedulerConfig sc;
  sc.max_num_batched_tokens = 0;
  EXPECT_THROW(Scheduler(sc, cache), Error);
  sc = SchedulerConfig{};
  sc.max_num_seqs = 0;
  EXPECT_THROW(Scheduler(sc, cache), Error);
  sc = SchedulerConfig{};
  sc.watermark_pages = 8;
  EXPECT_THROW(Scheduler(sc, cache), Error);
}
