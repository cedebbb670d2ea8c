// A snapshot of the engine's counters (Engine::metrics, AsyncEngine::metrics) and the histogram
// behind its latencies.
#pragma once

#include <cstdint>
#include <vector>

namespace pagedattn {

// A histogram with fixed upper bounds (Prometheus style; +Inf implied).
struct Histogram {
  std::vector<double> bounds;   // ascending upper bounds
  std::vector<int64_t> counts;  // [bounds.size() + 1], per bucket (not cumulative)
  double sum = 0;
  int64_t count = 0;

  Histogram() = default;
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
};

// A snapshot of the engine's counters.
struct EngineMetrics {
  int32_t num_running = 0;  // sequences
  int32_t num_waiting = 0;
  int32_t num_requests = 0;  // active requests
  int32_t pages_total = 0, pages_used = 0, pages_free = 0, pages_cached = 0;
  int64_t kv_capacity_tokens = 0;
  int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;
  int64_t preemptions = 0;            // every kind
  int64_t preemptions_recompute = 0;  // pages freed, recomputed at re-admission
  int64_t preemptions_swap = 0;       // pages copied to host memory, copied back at re-admission
  int64_t swapped_tokens = 0;         // computed tokens that swap kept (not recomputed)
  int64_t swap_out_bytes = 0, swap_in_bytes = 0;
  double swap_seconds = 0;            // spent copying pages out and in
  double swap_pin_seconds = 0;        // of those, pinning host memory (the swap space's first use)
  int32_t num_swapped = 0;            // waiting sequences whose pages are in host memory now
  int64_t swap_used_bytes = 0, swap_space_bytes = 0;
  int64_t recomputed_tokens = 0;      // tokens computed again after a preemption
  int64_t preempted_computed_tokens = 0;  // tokens computed before their sequence was preempted
  int64_t resumed_prefix_hit_tokens = 0;  // of those, found again in the prefix cache
  int64_t admission_stalls = 0;       // steps the oldest waiting request waited for pages
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t requests_finished = 0, requests_cancelled = 0;
  int64_t steps = 0;
  double generation_tokens_per_s = 0;  // over the last few seconds
  Histogram ttft_s;                    // arrival -> first token
  Histogram itl_s;                     // between consecutive tokens of a sequence

  double prefix_hit_rate() const {
    return prefix_queried_tokens ? double(prefix_hit_tokens) / double(prefix_queried_tokens) : 0.0;
  }
};

}  // namespace pagedattn
