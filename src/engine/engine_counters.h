// The engine's counters behind EngineMetrics (private to the engine).
#pragma once

#include <chrono>
#include <deque>
#include <utility>

#include "pagedattn/engine.h"

namespace pagedattn {

struct Engine::Counters {
  int64_t prompt_tokens = 0;
  int64_t generation_tokens = 0;
  int64_t requests_finished = 0;
  int64_t requests_cancelled = 0;
  int64_t steps = 0;
  Histogram ttft{{0.001, 0.005, 0.01, 0.02, 0.05, 0.1, 0.25, 0.5, 1, 2.5, 5, 10, 30, 60}};
  Histogram itl{{0.001, 0.0025, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5, 1, 2.5}};
  // (time, generation_tokens) per step over the last kRateWindow seconds.
  std::deque<std::pair<std::chrono::steady_clock::time_point, int64_t>> rate_samples;
  static constexpr double kRateWindow = 10.0;

  void record_rate(std::chrono::steady_clock::time_point now) {
    rate_samples.emplace_back(now, generation_tokens);
    while (rate_samples.size() > 2 &&
           std::chrono::duration<double>(now - rate_samples.front().first).count() > kRateWindow)
      rate_samples.pop_front();
  }
  void fill(EngineMetrics &m) const {
    m.prompt_tokens = prompt_tokens;
    m.generation_tokens = generation_tokens;
    m.requests_finished = requests_finished;
    m.requests_cancelled = requests_cancelled;
    m.steps = steps;
    m.ttft_s = ttft;
    m.itl_s = itl;
    if (rate_samples.size() >= 2) {
      const double dt =
          std::chrono::duration<double>(rate_samples.back().first - rate_samples.front().first)
              .count();
      if (dt > 0)
        m.generation_tokens_per_s =
            double(rate_samples.back().second - rate_samples.front().second) / dt;
    }
  }
};

}  // namespace pagedattn
