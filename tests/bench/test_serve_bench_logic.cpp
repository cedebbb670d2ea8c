// The serving benchmark's logic (bench/serve_bench.h, bench/static_baseline.h): percentiles against
// a brute-force definition, Poisson arrival statistics, length distributions, workload shape, and
// the static baseline's admission rule. No timing.
#include <gtest/gtest.h>

#include <cmath>
#include <numeric>
#include <random>

#include "pagedattn/error.h"
#include "serve_bench.h"
#include "serve_bench_sweep.h"
#include "static_baseline.h"

namespace sb = pagedattn::bench::serve_bench;
using pagedattn::Error;

namespace {

// numpy.percentile's linear method written out from its definition: the value at fractional rank
// p/100 * (n-1) of the sorted data, interpolating between the two ranks around it.
double percentile_oracle(std::vector<double> v, double p) {
  std::sort(v.begin(), v.end());
  const double rank = p / 100.0 * double(v.size() - 1);
  const double lo = std::floor(rank), hi = std::ceil(rank);
  return v[size_t(lo)] * (1 - (rank - lo)) + v[size_t(hi)] * (rank - lo);
}

}  // namespace

TEST(ServeBenchPercentile, HandCheckedValues) {
  // 1..5: p50 = 3, p90 = 4.6 (rank 3.6), p0 = min, p100 = max.
  const std::vector<double> v = {5, 1, 4, 2, 3};
  EXPECT_DOUBLE_EQ(sb::percentile(v, 50), 3.0);
  EXPECT_NEAR(sb::percentile(v, 90), 4.6, 1e-12);
  EXPECT_DOUBLE_EQ(sb::percentile(v, 0), 1.0);
  EXPECT_DOUBLE_EQ(sb::percentile(v, 100), 5.0);
  EXPECT_DOUBLE_EQ(sb::percentile({7.5}, 99), 7.5);
  EXPECT_TRUE(std::isnan(sb::percentile({}, 50)));
  EXPECT_THROW(sb::percentile(v, 101), Error);
  EXPECT_THROW(sb::percentile(v, -1), Error);
}

TEST(ServeBenchPercentile, MatchesOracleOnRandomData) {
  std::mt19937_64 rng(3);
  for (int trial = 0; trial < 50; ++trial) {
    std::vector<double> v(size_t(1 + rng() % 200));
    for (auto& x : v) x = std::lognormal_distribution<double>(0, 1)(rng);
    for (double p : {0.0, 1.0, 37.5, 50.0, 90.0, 99.0, 100.0})
      EXPECT_NEAR(sb::percentile(v, p), percentile_oracle(v, p), 1e-12) << "p=" << p;
    const sb::Summary s = sb::summarize(v);
    EXPECT_NEAR(s.mean, std::accumulate(v.begin(), v.end(), 0.0) / double(v.size()), 1e-9);
    EXPECT_LE(s.p50, s.p90);
    EXPECT_LE(s.p90, s.p99);
    EXPECT_EQ(s.count, int64_t(v.size()));
  }
}

TEST(ServeBenchArrivals, PoissonGapsHaveTheRightStatistics) {
  const double rate = 8.0;
  const int n = 20000;
  const std::vector<double> t = sb::poisson_arrivals(n, rate, 42);
  ASSERT_EQ(t.size(), size_t(n));
  EXPECT_EQ(t[0], 0.0);
  std::vector<double> gaps;
  for (int i = 1; i < n; ++i) {
    ASSERT_GE(t[size_t(i)], t[size_t(i - 1)]);
    gaps.push_back(t[size_t(i)] - t[size_t(i - 1)]);
  }
  double mean = 0, var = 0;
  for (double g : gaps) mean += g;
  mean /= double(gaps.size());
  for (double g : gaps) var += (g - mean) * (g - mean);
  var /= double(gaps.size() - 1);
  // Exponential(rate): mean 1/rate, standard deviation 1/rate (coefficient of variation 1);
  // with 20,000 gaps the standard error of the mean is 0.7%, so 3% is > 4 sigma.
  EXPECT_NEAR(mean, 1 / rate, 0.03 / rate);
  EXPECT_NEAR(std::sqrt(var) / mean, 1.0, 0.03);
  // Memorylessness: P(gap > 1/rate) = e^-1.
  const double frac =
      double(std::count_if(gaps.begin(), gaps.end(), [&](double g) { return g > 1 / rate; })) /
      double(gaps.size());
  EXPECT_NEAR(frac, std::exp(-1.0), 0.015);
  // Counts in unit windows are Poisson(rate): variance equals the mean.
  std::vector<int> counts(size_t(t.back()) + 1, 0);
  for (double x : t) ++counts[size_t(x)];
  counts.pop_back();  // the last window is partial
  double cm = 0, cv = 0;
  for (int c : counts) cm += c;
  cm /= double(counts.size());
  for (int c : counts) cv += (c - cm) * (c - cm);
  cv /= double(counts.size() - 1);
  EXPECT_NEAR(cm, rate, 0.3);
  EXPECT_NEAR(cv / cm, 1.0, 0.15);
}

TEST(ServeBenchArrivals, InfiniteRateAndSeeds) {
  for (double x : sb::poisson_arrivals(10, std::numeric_limits<double>::infinity(), 1))
    EXPECT_EQ(x, 0.0);
  EXPECT_EQ(sb::poisson_arrivals(100, 2.0, 5), sb::poisson_arrivals(100, 2.0, 5));
  EXPECT_NE(sb::poisson_arrivals(100, 2.0, 5), sb::poisson_arrivals(100, 2.0, 6));
  EXPECT_THROW(sb::poisson_arrivals(-1, 1.0, 1), Error);
}

TEST(ServeBenchLengths, ParseAndSampleWithinBounds) {
  std::mt19937_64 rng(9);
  const sb::LengthSpec f = sb::parse_length_spec("64", "--x");
  EXPECT_EQ(sb::sample_length(f, rng), 64);
  const sb::LengthSpec u = sb::parse_length_spec("uniform:10:20", "--x");
  const sb::LengthSpec ln = sb::parse_length_spec("lognormal:32:1.0:400", "--x");
  const sb::LengthSpec pa = sb::parse_length_spec("pareto:16:1.2:500", "--x");
  std::vector<double> lv, pv;
  bool saw10 = false, saw20 = false;
  for (int i = 0; i < 20000; ++i) {
    const int32_t a = sb::sample_length(u, rng);
    ASSERT_GE(a, 10);
    ASSERT_LE(a, 20);
    saw10 |= a == 10;
    saw20 |= a == 20;
    const int32_t b = sb::sample_length(ln, rng);
    ASSERT_GE(b, 1);
    ASSERT_LE(b, 400);
    lv.push_back(b);
    const int32_t c = sb::sample_length(pa, rng);
    ASSERT_GE(c, 16);
    ASSERT_LE(c, 500);
    pv.push_back(c);
  }
  EXPECT_TRUE(saw10 && saw20);
  EXPECT_NEAR(sb::percentile(lv, 50), 32, 2);  // the lognormal's median
  // Pareto(16, 1.2): P(X > 32) = 2^-1.2 = 0.435, so the median is 16 * 2^(1/1.2) = 28.5.
  EXPECT_NEAR(sb::percentile(pv, 50), 28.5, 1.5);
  EXPECT_GT(sb::percentile(pv, 99), 4 * sb::percentile(pv, 50));  // long tail
  for (const char* bad : {"", "zero", "0", "uniform:5", "uniform:9:3", "lognormal:32:1:8",
                          "pareto:16:0:100", "weird:1:2", "fixed:-3", "12abc"})
    EXPECT_THROW(sb::parse_length_spec(bad, "--prompt-len"), Error) << bad;
  try {
    sb::parse_length_spec("uniform:9:3", "--prompt-len");
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("--prompt-len", 0), 0u) << e.what();
  }
}

TEST(ServeBenchWorkload, SharedPrefixAndLengths) {
  sb::WorkloadSpec w;
  w.num_requests = 50;
  w.rate = 4;
  w.prefix_len = 40;
  w.prompt = sb::parse_length_spec("uniform:5:9", "p");
  w.output = sb::parse_length_spec("7", "o");
  w.vocab_lo = 100;
  w.vocab_hi = 200;
  const auto items = sb::make_workload(w);
  ASSERT_EQ(items.size(), 50u);
  for (size_t i = 0; i < items.size(); ++i) {
    const auto& it = items[i];
    EXPECT_GE(it.prompt.size(), 45u);
    EXPECT_LE(it.prompt.size(), 49u);
    EXPECT_EQ(it.max_tokens, 7);
    EXPECT_TRUE(std::equal(it.prompt.begin(), it.prompt.begin() + 40, items[0].prompt.begin()));
    for (int32_t t : it.prompt) EXPECT_TRUE(t >= 100 && t < 200);
    if (i > 0) {
      EXPECT_GE(it.arrival_s, items[i - 1].arrival_s);
    }
  }
  EXPECT_NE(std::vector<int32_t>(items[0].prompt.begin() + 40, items[0].prompt.end()),
            std::vector<int32_t>(items[1].prompt.begin() + 40, items[1].prompt.end()));
  w.vocab_lo = 200;
  EXPECT_THROW(sb::make_workload(w), Error);
}

TEST(StaticBaseline, BatchIsTheLongestFittingPrefix) {
  // Budget 1000: 300 + 300 + 300 fit, the fourth (200) would make 1100.
  EXPECT_EQ(sb::static_batch_size({300, 300, 300, 200, 10}, 1000, 64), 3);
  // First come, first served: the small one behind a big one does not jump the queue.
  EXPECT_EQ(sb::static_batch_size({600, 500, 10}, 1000, 64), 1);
  EXPECT_EQ(sb::static_batch_size({100, 100, 100}, 1000, 2), 2);  // max_seqs
  EXPECT_EQ(sb::static_batch_size({500, 500}, 1000, 8), 2);       // exactly full
  EXPECT_EQ(sb::static_batch_size({}, 1000, 8), 0);
  EXPECT_THROW(sb::static_batch_size({1001}, 1000, 8), Error);  // can never fit
  EXPECT_THROW(sb::static_batch_size({10}, 0, 8), Error);
  EXPECT_EQ(sb::static_reservation(128, 64), 192);
}

TEST(StaticBaseline, BatchStartsWhenFullTimedOutOrLast) {
  // Partial batch (all 3 queued fit, below max_seqs), fresh, more coming: wait.
  EXPECT_FALSE(sb::static_batch_ready(3, 3, 8, 0.1, 0.5, true));
  EXPECT_TRUE(sb::static_batch_ready(3, 3, 8, 0.5, 0.5, true));   // timed out
  EXPECT_TRUE(sb::static_batch_ready(3, 3, 8, 0.0, 0.5, false));  // nothing more will come
  EXPECT_TRUE(sb::static_batch_ready(3, 4, 8, 0.0, 0.5, true));   // full: the 4th does not fit
  EXPECT_TRUE(sb::static_batch_ready(8, 8, 8, 0.0, 0.5, true));   // full: max_seqs
  EXPECT_FALSE(sb::static_batch_ready(0, 0, 8, 9.0, 0.5, false));
}

TEST(StaticBaseline, BatcherHoldsReservationsUntilTheBatchEnds) {
  sb::StaticBatcher b(1000, 8, 0.5);
  b.push(0, 400, 0.0);
  b.push(1, 400, 0.1);
  EXPECT_TRUE(b.launch(0.2, true).empty());  // 800 of 1000, could still fill: waits
  b.push(2, 400, 0.3);                       // would make 1200: the batch is full
  const auto first = b.launch(0.3, true);
  EXPECT_EQ(first, (std::vector<size_t>{0, 1}));
  EXPECT_EQ(b.reserved_tokens(), 800);
  EXPECT_TRUE(b.running());
  b.push(3, 100, 0.4);
  EXPECT_TRUE(b.launch(5.0, false).empty());  // a batch is running: nothing starts
  EXPECT_EQ(b.reserved_tokens(), 800);        // held until the whole batch ends
  b.finish_batch();
  EXPECT_EQ(b.reserved_tokens(), 0);
  EXPECT_DOUBLE_EQ(b.deadline(), 0.8);
  const auto second = b.launch(0.5, true);  // 500 fits, not full, waited 0.2 s < 0.5: waits
  EXPECT_TRUE(second.empty());
  const auto third = b.launch(0.8, true);  // the oldest (arrived 0.3) timed out
  EXPECT_EQ(third, (std::vector<size_t>{2, 3}));
  EXPECT_EQ(b.reserved_tokens(), 500);
  EXPECT_EQ(b.queued(), 0u);
  EXPECT_THROW(b.push(9, 1001, 1.0), Error);  // larger than the whole budget
  EXPECT_EQ(b.queued(), 0u);
  EXPECT_THROW(sb::StaticBatcher(0, 8, 0.5), Error);
}

TEST(ServeBenchSweep, FourWorkloadsAtThreeBudgetsOfWorstCaseTimesConcurrency) {
  const sb::LengthSpec prompt = sb::parse_length_spec("128", "p");
  const auto cases = sb::make_sweep(prompt, sb::parse_length_spec("128", "o"), 4);
  ASSERT_EQ(cases.size(), 12u);
  const char* names[] = {"fixed", "uniform", "lognormal", "pareto"};
  for (size_t i = 0; i < cases.size(); ++i) {
    const sb::SweepCase& c = cases[i];
    EXPECT_EQ(c.workload, names[i / 3]);
    EXPECT_EQ(c.multiple, sb::kSweepMultiples[i % 3]);
    const int64_t worst = 128 + c.output.max_value();
    EXPECT_EQ(c.kv_tokens, c.multiple * worst * 4);
  }
  EXPECT_EQ(cases[0].kv_tokens, 1024);  // fixed 128 + 128, four at once
  EXPECT_EQ(cases[11].kv_tokens, 4 * (128 + 256) * 4);
  // Every varied workload stays within 2F and really varies.
  for (size_t i = 3; i < cases.size(); i += 3) {
    std::mt19937_64 rng(3);
    int32_t lo = 1 << 30, hi = 0;
    for (int k = 0; k < 2000; ++k) {
      const int32_t v = sb::sample_length(cases[i].output, rng);
      lo = std::min(lo, v);
      hi = std::max(hi, v);
    }
    EXPECT_GE(lo, 1);
    EXPECT_LE(hi, 256);
    EXPECT_GT(hi - lo, 100) << cases[i].workload;
  }
  EXPECT_THROW(sb::make_sweep(prompt, sb::parse_length_spec("uniform:1:9", "o"), 4), Error);
  EXPECT_THROW(sb::make_sweep(prompt, sb::parse_length_spec("128", "o"), 0), Error);
}
