// The workload sweep of `bench serve --sweep` (header-only, so tests/engine can
// check it): output lengths fixed, uniform, lognormal and pareto, each at KV
// budgets of 1x, 2x and 4x one request's worst case (longest prompt + longest
// output) times the sweep's concurrency (the requests the static baseline holds
// at once at the tightest budget).
//
// From the fixed output length F (--output-len, 128 by default) the varied
// workloads keep F's scale and reach at most 2F:
//   fixed      F
//   uniform    uniform:1:2F          (mean F)
//   lognormal  lognormal:F/2:0.8:2F  (median F/2, a long tail)
//   pareto     pareto:F/4:1.2:2F     (most short, a few at the cap)
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/error.h"
#include "serve_bench.h"

namespace pagedattn::bench::serve_bench {

struct SweepCase {
  std::string workload;  // fixed | uniform | lognormal | pareto
  LengthSpec output;
  int32_t multiple = 1;  // the budget in units of worst case x concurrency
  int64_t kv_tokens = 0;
};

inline constexpr int32_t kSweepMultiples[] = {1, 2, 4};

inline std::vector<SweepCase> make_sweep(const LengthSpec &prompt, const LengthSpec &output,
                                         int32_t concurrency) {
  PA_CHECK(output.kind == LengthKind::fixed, "bench serve: --sweep needs a fixed --output-len ",
           "(the varied workloads are built from it), got another distribution");
  PA_CHECK(concurrency >= 1, "bench serve: --sweep-concurrency must be >= 1, got ", concurrency);
  const double f = std::max(4.0, output.a);
  const std::vector<std::pair<std::string, LengthSpec>> workloads = {
      {"fixed", {LengthKind::fixed, f, 0, 0}},
      {"uniform", {LengthKind::uniform, 1, 2 * f, 0}},
      {"lognormal", {LengthKind::lognormal, f / 2, 0.8, 2 * f}},
      {"pareto", {LengthKind::pareto, f / 4, 1.2, 2 * f}}};
  std::vector<SweepCase> cases;
  for (const auto &[name, out] : workloads) {
    const int64_t worst = int64_t(prompt.max_value()) + out.max_value();
    for (int32_t m : kSweepMultiples) cases.push_back({name, out, m, m * worst * concurrency});
  }
  return cases;
}

}  // namespace pagedattn::bench::serve_bench
