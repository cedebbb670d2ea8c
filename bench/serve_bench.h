// The serving benchmark's pure logic (header-only, so tests/engine can check it without the CLI):
// length distributions, Poisson arrivals, workload generation, percentiles and the admission rule
// of the static contiguous-KV baseline.
//
// Workload: request i arrives at arrivals[i] seconds (Poisson process at `rate` requests/s: the
// gaps are exponential with mean 1/rate; rate = inf puts every arrival at 0). Its prompt is
// `prefix_len` shared tokens (the same "system prompt" for every request) followed by
// prompt_len(i) tokens of its own; it asks for exactly max_tokens(i) output tokens (greedy,
// EOS ignored).
//
// Static baseline (what serving looked like before paging): each request reserves one contiguous
// KV region of its worst case, prompt + max_tokens, up front. A batch is the longest run of queued
// requests (first come, first served) whose reservations fit together in the KV budget; it starts
// when it is full (the next request does not fit, or max_seqs is reached), when its oldest member
// has waited batch_timeout, or when no more requests will come; it then runs until its last member
// finishes, holding every reservation, and only then does the next batch start.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagedattn/error.h"

namespace pagedattn::bench::serve_bench {

// ---- length distributions ----

enum class LengthKind { fixed, uniform, lognormal, pareto };

// fixed:N | uniform:LO:HI | lognormal:MEDIAN:SIGMA:MAX | pareto:MIN:ALPHA:MAX (the last two are
// long-tailed, clipped to [1, MAX] and [MIN, MAX]).
struct LengthSpec {
  LengthKind kind = LengthKind::fixed;
  double a = 128, b = 0, c = 0;
  int32_t max_value() const {
    switch (kind) {
      case LengthKind::fixed:
        return int32_t(a);
      case LengthKind::uniform:
        return int32_t(b);
      case LengthKind::lognormal:
      case LengthKind::pareto:
        return int32_t(c);
    }
    return int32_t(a);
  }
};

inline LengthSpec parse_length_spec(const std::string& text, const std::string& option) {
  std::vector<std::string> parts;
  std::stringstream ss(text);
  for (std::string p; std::getline(ss, p, ':');) parts.push_back(p);
  PA_CHECK(!parts.empty(), option, ": empty length spec");
  auto num = [&](size_t i) {
    try {
      size_t used = 0;
      const double v = std::stod(parts[i], &used);
      PA_CHECK(used == parts[i].size() && std::isfinite(v) && v > 0, option, ": '", parts[i],
               "' in '", text, "' is not a positive number");
      return v;
    } catch (const std::logic_error&) {
      ::pagedattn::fail(option, ": '", parts[i], "' in '", text, "' is not a number");
    }
  };
  LengthSpec s;
  const std::string& k = parts[0];
  if (parts.size() == 1) {  // a bare number: fixed
    parts.insert(parts.begin(), "fixed");
    s.kind = LengthKind::fixed;
    s.a = num(1);
  } else if (k == "fixed" && parts.size() == 2) {
    s.kind = LengthKind::fixed;
    s.a = num(1);
  } else if (k == "uniform" && parts.size() == 3) {
    s.kind = LengthKind::uniform;
    s.a = num(1);
    s.b = num(2);
    PA_CHECK(s.a <= s.b, option, ": uniform:LO:HI needs LO <= HI, got '", text, "'");
  } else if ((k == "lognormal" || k == "pareto") && parts.size() == 4) {
    s.kind = k == "lognormal" ? LengthKind::lognormal : LengthKind::pareto;
    s.a = num(1);
    s.b = num(2);
    s.c = num(3);
    PA_CHECK(s.c >= s.a, option, ": the MAX of '", text, "' is below its ",
             k == "pareto" ? "MIN" : "MEDIAN");
  } else {
    ::pagedattn::fail(option,
                      ": expected N, fixed:N, uniform:LO:HI, lognormal:MEDIAN:SIGMA:MAX or ",
                      "pareto:MIN:ALPHA:MAX, got '", text, "'");
  }
  PA_CHECK(s.max_value() >= 1, option, ": lengths must be at least 1, got '", text, "'");
  return s;
}

inline int32_t sample_length(const LengthSpec& s, std::mt19937_64& rng) {
  std::uniform_real_distribution<double> u01(0.0, 1.0);
  switch (s.kind) {
    case LengthKind::fixed:
      return int32_t(s.a);
    case LengthKind::uniform:
      return int32_t(std::uniform_int_distribution<int64_t>(int64_t(s.a), int64_t(s.b))(rng));
    case LengthKind::lognormal: {
      const double x = std::exp(std::log(s.a) + s.b * std::normal_distribution<double>()(rng));
      return int32_t(std::clamp(std::llround(x), 1LL, (long long)s.c));
    }
    case LengthKind::pareto: {  // inverse CDF: MIN / U^(1/ALPHA)
      const double x = s.a / std::pow(1.0 - u01(rng), 1.0 / s.b);
      return int32_t(std::clamp(std::llround(x), (long long)s.a, (long long)s.c));
    }
  }
  return int32_t(s.a);
}

// ---- arrivals ----

// n arrival times in seconds, ascending, starting near 0. rate <= 0 or inf: all at 0.
inline std::vector<double> poisson_arrivals(int32_t n, double rate, uint64_t seed) {
  PA_CHECK(n >= 0, "poisson_arrivals: n must be >= 0, got ", n);
  PA_CHECK(!std::isnan(rate), "poisson_arrivals: rate is NaN");
  std::vector<double> t(size_t(n), 0.0);
  if (!(rate > 0) || std::isinf(rate)) return t;
  std::mt19937_64 rng(seed);
  std::exponential_distribution<double> gap(rate);
  double now = 0;
  for (auto& x : t) {
    x = now;  // the first request arrives at 0
    now += gap(rng);
  }
  return t;
}

// ---- workload ----

struct WorkloadSpec {
  int32_t num_requests = 64;
  double rate = std::numeric_limits<double>::infinity();  // requests/s
  LengthSpec prompt{LengthKind::fixed, 128};
  LengthSpec output{LengthKind::fixed, 128};
  int32_t prefix_len = 0;              // shared system-prompt tokens in front of every prompt
  int32_t vocab_lo = 0, vocab_hi = 1;  // token ids are drawn from [vocab_lo, vocab_hi)
  uint64_t seed = 1;
};

struct WorkItem {
  double arrival_s = 0;
  std::vector<int32_t> prompt;
  int32_t max_tokens = 1;
};

inline std::vector<WorkItem> make_workload(const WorkloadSpec& w) {
  PA_CHECK(w.num_requests >= 1, "make_workload: num_requests must be >= 1, got ", w.num_requests);
  PA_CHECK(w.prefix_len >= 0, "make_workload: prefix_len must be >= 0, got ", w.prefix_len);
  PA_CHECK(w.vocab_lo >= 0 && w.vocab_lo < w.vocab_hi, "make_workload: token range [", w.vocab_lo,
           ", ", w.vocab_hi, ") is empty");
  std::mt19937_64 rng(w.seed);
  std::uniform_int_distribution<int32_t> tok(w.vocab_lo, w.vocab_hi - 1);
  std::vector<int32_t> prefix(size_t(w.prefix_len));
  for (auto& t : prefix) t = tok(rng);
  const std::vector<double> arrivals = poisson_arrivals(w.num_requests, w.rate, w.seed ^ 0x5eed);
  std::vector<WorkItem> items(size_t(w.num_requests));
  for (size_t i = 0; i < items.size(); ++i) {
    WorkItem& it = items[i];
    it.arrival_s = arrivals[i];
    it.prompt = prefix;
    const int32_t own = sample_length(w.prompt, rng);
    for (int32_t j = 0; j < own; ++j) it.prompt.push_back(tok(rng));
    it.max_tokens = sample_length(w.output, rng);
  }
  return items;
}

// ---- statistics ----

// The p-th percentile (0..100) with linear interpolation between closest ranks (numpy's default).
// Empty input: NaN.
inline double percentile(std::vector<double> v, double p) {
  PA_CHECK(p >= 0 && p <= 100, "percentile: p must be in [0, 100], got ", p);
  if (v.empty()) return std::numeric_limits<double>::quiet_NaN();
  std::sort(v.begin(), v.end());
  const double pos = p / 100.0 * double(v.size() - 1);
  const size_t lo = size_t(std::floor(pos));
  const size_t hi = std::min(lo + 1, v.size() - 1);
  return v[lo] + (pos - double(lo)) * (v[hi] - v[lo]);
}

struct Summary {
  double mean = 0, p50 = 0, p90 = 0, p99 = 0;
  int64_t count = 0;
};

inline Summary summarize(const std::vector<double>& v) {
  Summary s;
  s.count = int64_t(v.size());
  if (v.empty()) {
    s.mean = s.p50 = s.p90 = s.p99 = std::numeric_limits<double>::quiet_NaN();
    return s;
  }
  double sum = 0;
  for (double x : v) sum += x;
  s.mean = sum / double(v.size());
  s.p50 = percentile(v, 50);
  s.p90 = percentile(v, 90);
  s.p99 = percentile(v, 99);
  return s;
}

// ---- static baseline admission ----

// KV tokens a request reserves in the static baseline: its worst case, one contiguous region.
inline int64_t static_reservation(int64_t prompt_len, int64_t max_tokens) {
  return prompt_len + max_tokens;
}

// How many of the queued requests (their reservations, oldest first) form the next batch: the
// longest prefix whose reservations sum to at most budget_tokens, at most max_seqs of them.
// Throws Error when the oldest can never fit (its reservation alone exceeds the budget).
inline int32_t static_batch_size(const std::vector<int64_t>& queued, int64_t budget_tokens,
                                 int32_t max_seqs) {
  PA_CHECK(budget_tokens > 0, "static_batch_size: budget_tokens must be positive, got ",
           budget_tokens);
  PA_CHECK(max_seqs > 0, "static_batch_size: max_seqs must be positive, got ", max_seqs);
  int64_t used = 0;
  int32_t n = 0;
  for (int64_t r : queued) {
    PA_CHECK(r > 0, "static_batch_size: reservation ", n, " is ", r, ", not positive");
    if (n == max_seqs || used + r > budget_tokens) break;
    used += r;
    ++n;
  }
  PA_CHECK(queued.empty() || n > 0, "static_batch_size: a request reserving ", queued.front(),
           " tokens can never fit in the KV budget of ", budget_tokens, " tokens");
  return n;
}

// Whether the batch formed from the queue starts now: it is full (a queued request is left out,
// or max_seqs is reached), its oldest member has waited at least timeout_s, or no more requests
// will arrive. batch_size 0 (empty queue): never.
inline bool static_batch_ready(int32_t batch_size, size_t queued, int32_t max_seqs,
                               double oldest_wait_s, double timeout_s, bool more_arrivals) {
  if (batch_size <= 0) return false;
  const bool full = size_t(batch_size) < queued || batch_size >= max_seqs;
  return full || oldest_wait_s >= timeout_s || !more_arrivals;
}

}  // namespace pagedattn::bench::serve_bench
