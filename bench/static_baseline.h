// The static contiguous-KV baseline's batcher (header-only; the rule is in serve_bench.h).
//
// Requests queue here instead of going to the engine. When the engine is idle, launch() forms the
// next batch (static_batch_size) and, if it is ready (static_batch_ready), hands it over and holds
// its reservations until finish_batch(): the whole batch runs to completion before the next one
// starts, and a member that finishes early keeps its region until then, as a contiguous
// max-length allocation would.
#pragma once

#include <cstdint>
#include <deque>
#include <vector>

#include "pagedattn/error.h"
#include "serve_bench.h"

namespace pagedattn::bench::serve_bench {

class StaticBatcher {
 public:
  StaticBatcher(int64_t budget_tokens, int32_t max_seqs, double timeout_s)
      : budget_(budget_tokens), max_seqs_(max_seqs), timeout_s_(timeout_s) {
    PA_CHECK(budget_tokens > 0, "StaticBatcher: budget_tokens must be positive, got ",
             budget_tokens);
    PA_CHECK(max_seqs > 0, "StaticBatcher: max_seqs must be positive, got ", max_seqs);
    PA_CHECK(timeout_s >= 0, "StaticBatcher: timeout_s must be >= 0, got ", timeout_s);
  }

  // Queues request `index` that arrived at arrival_s and reserves `reservation` tokens. Throws
  // Error (nothing queued) when the reservation alone exceeds the budget.
  void push(size_t index, int64_t reservation, double arrival_s) {
    PA_CHECK(reservation > 0 && reservation <= budget_, "StaticBatcher::push: reservation of ",
             reservation, " tokens for request ", index, " does not fit the KV budget of ", budget_,
             " tokens");
    queue_.push_back({index, reservation, arrival_s});
  }

  // At time now_s: when no batch is running and the next one is ready, returns its members'
  // indices (oldest first) and reserves their KV; otherwise returns nothing.
  std::vector<size_t> launch(double now_s, bool more_arrivals) {
    if (running_ || queue_.empty()) return {};
    std::vector<int64_t> res;
    for (const Entry& e : queue_) res.push_back(e.reservation);
    const int32_t n = static_batch_size(res, budget_, max_seqs_);
    if (!static_batch_ready(n, queue_.size(), max_seqs_, now_s - queue_.front().arrival_s,
                            timeout_s_, more_arrivals))
      return {};
    std::vector<size_t> batch;
    for (int32_t i = 0; i < n; ++i) {
      batch.push_back(queue_.front().index);
      reserved_ += queue_.front().reservation;
      queue_.pop_front();
    }
    running_ = true;
    return batch;
  }

  // The running batch's last member finished: its reservations are released.
  void finish_batch() {
    running_ = false;
    reserved_ = 0;
  }

  // When the oldest queued request's timeout expires (for sleeping until then); +inf when empty.
  double deadline() const {
    return queue_.empty() ? std::numeric_limits<double>::infinity()
                          : queue_.front().arrival_s + timeout_s_;
  }
  bool running() const { return running_; }
  size_t queued() const { return queue_.size(); }
  int64_t reserved_tokens() const { return reserved_; }

 private:
  struct Entry {
    size_t index;
    int64_t reservation;
    double arrival_s;
  };
  int64_t budget_;
  int32_t max_seqs_;
  double timeout_s_;
  std::deque<Entry> queue_;
  bool running_ = false;
  int64_t reserved_ = 0;
};

}  // namespace pagedattn::bench::serve_bench
