// Scheduler: builds each step's ragged batch under a token budget.
//
// Each step, within max_num_batched_tokens and max_num_seqs:
//   1. running sequences that decode (one uncomputed token), oldest first;
//   2. running sequences still prefilling, oldest first, a chunk each (chunked
//   prefill);
//   3. waiting sequences in arrival order (no skipping ahead, so none starves):
//   each is admitted
//      only when the pages of its first chunk fit with a watermark to spare;
//      with the prefix cache its longest cached prefix is attached first and
//      not recomputed.
// Running sequences with nothing to compute (a beam waiting for its siblings) are skipped.
// When a running sequence needs a page and none is left, the newest running
// sequence not yet scheduled this step is preempted: its pages are freed and it
// goes back to the waiting queue to be recomputed later (its tokens are kept,
// so greedy output is unchanged). A prefill chunk shrinks to what fits before
// it preempts anyone.
//
// The scheduler reserves the slots (KvCache::append_slots) of everything it
// schedules, so its output is all the model runner needs.
#pragma once

#include <cstdint>
#include <map>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"
#include "pagedattn/request.h"

namespace pagedattn {

struct SchedulerConfig {
  int32_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 64;
  // Pages kept free when admitting a waiting sequence (-1: 1% of the pool).
  int32_t watermark_pages = -1;
  bool enable_prefix_cache = true;
};

struct ScheduledSeq {
  Sequence *seq = nullptr;
  int32_t num_tokens = 0;  // tokens computed this step
  int32_t logit_row = -1;  // row of the step's logits to sample from, -1 when none (mid-prefill)
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
  // cancelled).
  void remove(Sequence *seq);

  SchedulerOutput schedule();
  // After the forward pass: the scheduled tokens are computed; full pages
  // become reusable.
  void commit(const SchedulerOutput &out);

  int32_t num_waiting() const { return int32_t(waiting_.size()); }
  int32_t num_running() const { return int32_t(running_.size()); }
  bool has_work() const { return !waiting_.empty() || !running_.empty(); }
  int64_t num_preemptions() const { return num_preemptions_; }
  // Prompt tokens looked up in / reused from the prefix cache at first
  // admission.
  int64_t prefix_queried_tokens() const { return prefix_queried_; }
  int64_t prefix_hit_tokens() const { return prefix_hits_; }
  int32_t watermark_pages() const { return watermark_; }

 private:
  int32_t available_pages() const;
  void preempt(Sequence *seq, SchedulerOutput &out);
  // Largest n <= want whose pages fit in `available` (0 if none).
  int32_t tokens_that_fit(const Sequence &seq, int32_t want, int32_t available) const;
  void append(Sequence *seq, int32_t n, SchedulerOutput &out);
  bool admit_one(int32_t &budget, SchedulerOutput &out);

  SchedulerConfig config_;
  KvCache &cache_;
  int32_t watermark_ = 0;
  std::map<uint64_t, Sequence *> waiting_;  // by age
  std::map<uint64_t, Sequence *> running_;  // by age
  int64_t num_preemptions_ = 0;
  int64_t prefix_queried_ = 0;
  int64_t prefix_hits_ = 0;
};

}  // namespace pagedattn
