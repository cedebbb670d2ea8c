// Scheduler (internal to the engine): builds each step's ragged batch under a token budget.
//
// Each step, within max_num_batched_tokens and max_num_seqs:
//   1. running sequences that decode (one uncomputed token), oldest first;
//   2. running sequences still prefilling, oldest first, a chunk each (chunked
//   prefill);
//   3. waiting sequences in arrival order (no skipping ahead, so none starves):
//      each is admitted only when the pages of its first chunk fit with a
//      watermark to spare and (admission lookahead, the default) the pages the
//      running batch and it will need until they finish still fit at their
//      forecast peak (admission.h); with the prefix cache its longest cached
//      prefix is attached first and not recomputed. A step in which the oldest
//      waiting sequence is held back for want of pages counts one admission
//      stall.
// Running sequences with nothing to compute (a beam waiting for its siblings)
// are skipped. When a running sequence needs a page and none is left, a running
// sequence not yet scheduled this step is preempted (victim least_work, the
// default: the one with the fewest computed tokens, the newest among equals;
// newest: the newest) and goes back to the waiting queue (its tokens are kept,
// so greedy output is unchanged). Its computed tokens are either
//   - swapped: its pages copied to host memory (KvCache::swap_out) and back at
//     its re-admission, which then needs all its pages at once; chosen when the
//     swap space holds them and (PreemptionMode::cheaper) the two copies at the
//     measured copy rate cost less than computing the tokens again at the
//     measured prefill rate; or
//   - recomputed: its pages are freed; its full pages stay in the prefix cache
//     until evicted, so its re-admission reuses what is left of them; the tokens
//     computed again are counted as recomputed.
// A prefill chunk shrinks to what fits before it preempts anyone.
//
// The scheduler reserves the slots (KvCache::append_slots) of everything it
// schedules, so its output is all the model runner needs.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <unordered_set>
#include <vector>

#include "admission.h"
#include "pagedattn/engine_config.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"
#include "pagedattn/request.h"
#include "sequence.h"

namespace pagedattn {


struct SchedulerConfig {
  int32_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 64;
  // Pages kept free when admitting a waiting sequence (-1: 1% of the pool).
  int32_t watermark_pages = -1;
  bool enable_prefix_cache = true;
  // Running decodes wait while a prefill can be scheduled (a batch's prefill runs apart from its
  // decode steps: bench model times the two phases). Off: decodes first, the default.
  bool prefill_first = false;
  // lookahead: admit only while the forecast peak of the running batch fits
  // (admission.h); immediate: admit as soon as the first chunk fits (grows into
  // preemptions when lengths do).
  AdmissionPolicy admission = AdmissionPolicy::lookahead;
  VictimPolicy victim = VictimPolicy::least_work;
  PreemptionMode preemption = PreemptionMode::cheaper;
  int64_t swap_space_bytes = 0;  // host memory for swapped-out pages; 0: every preemption recomputes
};

// What swap did (Scheduler::swap_stats).
struct SwapStats {
  int64_t preemptions = 0;  // preemptions that swapped
  int64_t tokens = 0;       // computed tokens kept by swap (not recomputed)
  int64_t out_bytes = 0, in_bytes = 0;
  double seconds = 0;       // copying, both ways (pinning included)
  double pin_seconds = 0;   // of those, getting page-locked host memory (first uses)
  int32_t swapped_now = 0;  // waiting sequences in host memory
  int64_t used_bytes = 0;   // of the swap space
};

struct ScheduledSeq {
  Sequence *seq = nullptr;
  int32_t num_tokens = 0;  // tokens computed this step
  int32_t logit_row = -1;  // row of the step's logits to sample from, -1 when none (mid-prefill)
  // Sequence::all_logit_rows: every token of this step has a logit row, rows
  // first_logit_row .. first_logit_row + num_tokens - 1 (else the one at logit_row, if any).
  int32_t first_logit_row = -1;
};

struct SchedulerOutput {
  ForwardBatch batch;
  std::vector<ScheduledSeq> scheduled;  // in batch order
  std::vector<Sequence *> preempted;    // this step
  // Sequences that cannot grow even with the whole cache to themselves: the
  // engine finishes them with FinishReason::length. They are no longer in any
  // queue.
  std::vector<Sequence *> out_of_memory;
  int32_t num_prefill_tokens = 0;
  int32_t num_decode_tokens = 0;
  bool empty() const { return scheduled.empty(); }
};

class Scheduler {
 public:
  Scheduler(const SchedulerConfig &config, KvCache &cache);

  const SchedulerConfig &config() const { return config_; }
  // Queues a new sequence (no cache state yet) for admission. Throws Error when
  // its prompt can never fit in the cache.
  void add_waiting(Sequence *seq);
  // Adds a sequence that already holds cache state (a fork of a running one) to
  // the running set.
  void add_running(Sequence *seq);
  // Takes a sequence out of the queues and frees its pages at once (finished or
  // cancelled). A finished one's output length feeds the growth estimates.
  void remove(Sequence *seq);

  SchedulerOutput schedule();
  // After the forward pass: the scheduled tokens are computed; full pages
  // become reusable. written = false: the pass still runs (the engine schedules
  // the next step ahead of it); the cache's pages get their hashes later
  // (KvCache::commit), once the pass has written them. Sequences removed since
  // `out` was scheduled are skipped.
  void commit(const SchedulerOutput &out, bool written = true);

  int32_t num_waiting() const { return int32_t(waiting_.size()); }
  int32_t num_running() const { return int32_t(running_.size()); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Preemptions that free the pages and recompute them later.
  int64_t num_recompute_preemptions() const { return num_preemptions_ - swap_.preemptions; }
  const SwapStats &swap_stats() const { return swap_; }
  // After the forward pass of `out`, which took `seconds`: the prefill rate that the choice
  // between swap and recompute weighs.
  void observe_step(const SchedulerOutput &out, double seconds);
  // Tokens computed a second time after a preemption (what recompute costs).
  int64_t recomputed_tokens() const { return recomputed_tokens_; }
  // Tokens that preempted sequences had computed, and of those, tokens that
  // their re-admission found in the prefix cache (not recomputed).
  int64_t preempted_computed_tokens() const { return preempted_computed_; }
  // Steps in which the oldest waiting sequence was held back for want of pages
  // (now or forecast).
  int64_t admission_stalls() const { return admission_stalls_; }
  // The forecast peak of pages in use (admission.h) of the running sequences
  // alone.
  int64_t forecast_peak_pages() const;
  // Prompt tokens looked up in / reused from the prefix cache at first
  // admission (re-admissions after a preemption are not counted here).
  int32_t watermark_pages() const { return watermark_; }

 private:
  int32_t available_pages() const;
  void preempt(Sequence *seq, SchedulerOutput &out);
  // Whether a preempted seq's computed tokens go to host memory rather than being recomputed.
  bool should_swap(const Sequence &seq) const;
  // The swapped waiting sequence at the queue's head back in the cache, and its first chunk
  // scheduled; false when it must wait.
  bool admit_swapped(int32_t &budget, SchedulerOutput &out);
  void drop_swapped(Sequence &seq);
  // Largest n <= want whose pages fit in `available` (0 if none).
  int32_t tokens_that_fit(const Sequence &seq, int32_t want, int32_t available) const;
  void append(Sequence *seq, int32_t n, SchedulerOutput &out);
  bool admit_one(int32_t &budget, SchedulerOutput &out);
  // Whether a sequence admitted now would run alone: nothing else computes this step (beams
  // parked for their siblings' step hold pages but wait).
  bool admitted_alone(const SchedulerOutput &out) const;
  Sequence *pick_victim(const Sequence *self,
                        const std::unordered_set<const Sequence *> &scheduled);
  GrowthForecast forecast(const Sequence &seq) const;
  // Whether the running sequences and `candidate` (holding cache state) fit at
  // their forecast peak.
  bool forecast_fits(const Sequence &candidate) const;

  SchedulerConfig config_;
  KvCache &cache_;
  int32_t watermark_ = 0;
  std::map<uint64_t, Sequence *> waiting_;  // by age
  std::map<uint64_t, Sequence *> running_;  // by age
  int64_t num_preemptions_ = 0;
  int64_t recomputed_tokens_ = 0;
  int64_t preempted_computed_ = 0;
  int64_t admission_stalls_ = 0;
  OutputLengthStats output_lengths_;
  SwapStats swap_;
  double prefill_s_per_token_ = 0;  // measured by observe_step (0: not yet)
};

}  // namespace pagedattn
