// The device sampler (src/model/cuda/sampling_kernels.h) against the host twin (sample_plan.h) on
// random rows of many shapes and parameters: greedy ids and top-N logprobs equal, each drawn token
// where the host's distribution and the same u put it, draws independent of the batch, the logits
// given back unchanged, and the frequencies of many draws against the host's distribution.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <random>
#include <vector>

#include "gpu_skip.h"
#include "pagedattn/sample_plan.h"

#if PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/sampling_kernels.h"

using namespace pagedattn;

namespace {

template <class T>
struct Dev {
  T* p = nullptr;
  size_t n = 0;
  explicit Dev(size_t count) : n(std::max<size_t>(count, 1)) {
    EXPECT_EQ(cudaMalloc(&p, n * sizeof(T)), cudaSuccess);
  }
  explicit Dev(const std::vector<T>& v) : Dev(v.size()) {
    if (!v.empty()) {
      EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
    }
  }
  ~Dev() { cudaFree(p); }
  std::vector<T> get(size_t count) const {
    std::vector<T> v(count);
    EXPECT_EQ(cudaMemcpy(v.data(), p, count * sizeof(T), cudaMemcpyDeviceToHost), cudaSuccess);
    return v;
  }
};

// The device sampler on logits [rows, vocab]; the logits as they are after it. cluster: the CTAs a
// top-k row is split over (0: the default for the vocabulary).
std::vector<TokenLogprobs> run_device(const std::vector<float>& logits, int32_t vocab,
                                      const SamplePlan& plan, std::vector<float>* after = nullptr,
                                      int32_t cluster = 0) {
  const int32_t R = int32_t(plan.rows.size());
  check_sample_plan(plan, R, vocab, "test");
  std::vector<cuda::SampleRowDesc> desc;
  for (const RowSampling& r : plan.rows)
    desc.push_back({r.temperature, r.top_p, r.min_p, r.repetition_penalty, r.presence_penalty,
                    r.frequency_penalty, r.top_k, r.logprobs, r.edit_begin, r.edit_end, r.seed,
                    r.counter});
  std::vector<cuda::SampleEdit> edits;
  for (const LogitEdit& e : plan.edits) edits.push_back({e.token, e.count, e.bias, e.repeat});
  const int32_t N = std::max(plan.max_logprobs(), 0);
  Dev<float> d_logits(logits);
  Dev<cuda::SampleRowDesc> d_desc(desc);
  Dev<cuda::SampleEdit> d_edits(edits);
  Dev<float> saved{edits.size()}, lp{static_cast<size_t>(R)}, top_lp{static_cast<size_t>(R) * N};
  Dev<int32_t> ids{static_cast<size_t>(R)}, top_ids{static_cast<size_t>(R) * N};
  cuda::sample_rows(d_logits.p, R, vocab, d_desc.p, d_edits.p, saved.p, ids.p, lp.p, top_ids.p,
                    top_lp.p, N, nullptr, cluster);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  const auto h_ids = ids.get(size_t(R)), h_top = top_ids.get(size_t(R) * N);
  const auto h_lp = lp.get(size_t(R)), h_top_lp = top_lp.get(size_t(R) * N);
  if (after) *after = d_logits.get(logits.size());
  std::vector<TokenLogprobs> out(static_cast<size_t>(R));
  for (int32_t i = 0; i < R; ++i) {
    out[size_t(i)].token = h_ids[size_t(i)];
    const int32_t n = plan.rows[size_t(i)].logprobs;
    if (n < 0) continue;
    out[size_t(i)].logprob = h_lp[size_t(i)];
    for (int32_t j = 0; j < std::min(n, vocab); ++j)
      out[size_t(i)].top.emplace_back(h_top[size_t(i) * N + j], h_top_lp[size_t(i) * N + j]);
  }
  return out;
}

// Where u puts the device's token in the host's distribution of the edited row: the token must be
// a survivor and u * total must fall in its interval of the id-ordered cumulative weights (up to
// `slack` for the float weights of the device).
void expect_consistent_draw(std::span<const float> raw, const RowSampling& r,
                            std::span<const LogitEdit> edits, int32_t token, const char* what) {
  std::vector<float> l(raw.begin(), raw.end());
  apply_logit_edits(l, r, edits);
  std::vector<TokenProb> d = filtered_distribution(l, r.temperature, r.top_k, r.top_p, r.min_p);
  std::sort(d.begin(), d.end(),
            [](const TokenProb& a, const TokenProb& b) { return a.token < b.token; });
  const double u = philox_uniform(r.seed, r.counter);
  double lo = 0;
  for (const TokenProb& t : d) {
    if (t.token == token) {
      const double slack = 1e-5;
      EXPECT_GE(u, lo - slack) << what;
      EXPECT_LE(u, lo + t.prob + slack) << what;
      return;
    }
    lo += t.prob;
  }
  ADD_FAILURE() << what << ": token " << token << " is not a survivor of the host's filters ("
                << d.size() << " survive)";
}

struct Shape {
  int32_t vocab;
  int32_t rows;
};

RowSampling random_row(std::mt19937& rng, int32_t vocab, int kind) {
  RowSampling r;
  r.seed = rng();
  r.counter = rng() % 1000;
  r.temperature = kind == 0 ? 0.f : std::uniform_real_distribution<float>(0.3f, 1.5f)(rng);
  switch (kind % 5) {
    case 1:  // the mix
      r.top_k = 50, r.top_p = 0.95f, r.repetition_penalty = 1.1f, r.logprobs = 5;
      break;
    case 2:  // top-p alone: the whole-row path
      r.top_p = 0.8f, r.min_p = 0.01f, r.presence_penalty = 0.5f, r.frequency_penalty = 0.3f;
      break;
    case 3:  // top-k past the candidate bound, and min-p
      r.top_k = std::min(vocab - 1, 3000), r.min_p = 0.05f, r.logprobs = 20;
      break;
    case 4:  // no filter
      r.logprobs = 0;
      break;
    default:
      r.logprobs = 2;
      break;
  }
  return r;
}

// values: 0 random normal (scaled), 1 few distinct values (ties everywhere), 2 flat, 3 peaked.
std::vector<float> random_logits(std::mt19937& rng, size_t n, int values) {
  std::normal_distribution<float> nd(0.f, 2.f);
  std::vector<float> x(n);
  for (float& v : x) {
    switch (values) {
      case 1: v = float(int(rng() % 7)) * 0.5f; break;
      case 2: v = 0.25f; break;
      case 3: v = nd(rng) * 4.f; break;
      default: v = nd(rng); break;
    }
  }
  return x;
}

TEST(SamplingCuda, MatchesTheHostTwinOnRandomRows) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(1234);
  const Shape shapes[] = {{50, 3}, {1000, 17}, {32000, 9}, {128256, 8}, {151936, 5}};
  int checked = 0, equal = 0;
  for (const Shape& sh : shapes) {
    for (int values = 0; values < 4; ++values) {
      SamplePlan plan;
      std::vector<float> logits;
      for (int32_t i = 0; i < sh.rows; ++i) {
        const std::vector<float> row = random_logits(rng, size_t(sh.vocab), values);
        logits.insert(logits.end(), row.begin(), row.end());
        RowSampling r = random_row(rng, sh.vocab, i % 6);
        r.edit_begin = int32_t(plan.edits.size());
        std::map<int32_t, int> seen;
        // Some rows with more edits than the two-pass path takes; biases that lift a token into
        // the top ones or ban one.
        const int num_edits = i % 7 == 6 ? 1500 : int(rng() % 40);
        const float biases[] = {0.f, 0.f, 3.f, 10.f, -100.f};
        for (int e = 0; e < num_edits; ++e) {
          const int32_t t = int32_t(rng() % uint32_t(sh.vocab));
          if (seen.count(t)) continue;
          seen[t] = 1;
          plan.edits.push_back(
              LogitEdit{t, int32_t(rng() % 3), biases[rng() % 5], int32_t(rng() % 2)});
        }
        r.edit_end = int32_t(plan.edits.size());
        plan.rows.push_back(r);
      }
      std::vector<float> after;
      const std::vector<TokenLogprobs> dev = run_device(logits, sh.vocab, plan, &after);
      ASSERT_EQ(after, logits) << "the logits were not given back (vocab " << sh.vocab << ")";
      const std::vector<TokenLogprobs> host = sample_rows(logits.data(), sh.rows, sh.vocab, plan);
      for (int32_t i = 0; i < sh.rows; ++i) {
        const RowSampling& r = plan.rows[size_t(i)];
        const std::span<const float> raw(logits.data() + size_t(i) * size_t(sh.vocab),
                                         size_t(sh.vocab));
        const std::span<const LogitEdit> edits(plan.edits.data() + r.edit_begin,
                                               size_t(r.edit_end - r.edit_begin));
        const std::string what = "vocab " + std::to_string(sh.vocab) + " values " +
                                 std::to_string(values) + " row " + std::to_string(i);
        ++checked;
        equal += dev[size_t(i)].token == host[size_t(i)].token;
        if (r.temperature == 0.f)
          EXPECT_EQ(dev[size_t(i)].token, host[size_t(i)].token) << what;
        else
          expect_consistent_draw(raw, r, edits, dev[size_t(i)].token, what.c_str());
        if (r.logprobs < 0) continue;
        const TokenLogprobs want = token_logprobs(raw, dev[size_t(i)].token, r.logprobs);
        EXPECT_NEAR(dev[size_t(i)].logprob, want.logprob, 1e-4) << what;
        ASSERT_EQ(dev[size_t(i)].top.size(), want.top.size()) << what;
        for (size_t j = 0; j < want.top.size(); ++j) {
          EXPECT_EQ(dev[size_t(i)].top[j].first, want.top[j].first) << what << " top " << j;
          EXPECT_NEAR(dev[size_t(i)].top[j].second, want.top[j].second, 1e-4) << what;
        }
      }
    }
  }
  // The same u and the same rules: the tokens differ only where rounding moves a boundary.
  EXPECT_GE(equal, checked * 98 / 100) << equal << " of " << checked << " rows equal";
}

// A random plan of `rows` rows of every kind, with edits (some rows past the two-pass path's).
SamplePlan random_plan(std::mt19937& rng, int32_t vocab, int32_t rows) {
  SamplePlan plan;
  for (int32_t i = 0; i < rows; ++i) {
    RowSampling r = random_row(rng, vocab, i % 6);
    r.edit_begin = int32_t(plan.edits.size());
    std::map<int32_t, int> seen;
    const int num_edits = i % 7 == 6 ? 1500 : int(rng() % 600);
    for (int e = 0; e < num_edits; ++e) {
      const int32_t t = int32_t(rng() % uint32_t(vocab));
      if (seen.count(t)) continue;
      seen[t] = 1;
      plan.edits.push_back(LogitEdit{t, int32_t(rng() % 3), rng() % 4 ? 0.f : 5.f, 1});
    }
    r.edit_end = int32_t(plan.edits.size());
    plan.rows.push_back(r);
  }
  return plan;
}

// A top-k row split over a cluster of CTAs (pass 1 and 2 each over a share of the row, the lists
// gathered into the first CTA) against one CTA a row: the same tokens and top ids, log-probabilities
// within rounding, the logits given back; shares of every size, empty ones included (vocab 50
// over 8 CTAs).
TEST(SamplingCuda, RowsSplitOverAClusterMatchOneCta) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(77);
  const Shape shapes[] = {{50, 7}, {1000, 13}, {32001, 13}, {128256, 13}};
  for (const Shape& sh : shapes) {
    for (int values = 0; values < 4; ++values) {
      std::vector<float> logits;
      for (int32_t i = 0; i < sh.rows; ++i) {
        const std::vector<float> row = random_logits(rng, size_t(sh.vocab), values);
        logits.insert(logits.end(), row.begin(), row.end());
      }
      const SamplePlan plan = random_plan(rng, sh.vocab, sh.rows);
      const std::vector<TokenLogprobs> one = run_device(logits, sh.vocab, plan, nullptr, 1);
      for (int32_t cluster : {2, 3, 8}) {
        std::vector<float> after;
        const auto split = run_device(logits, sh.vocab, plan, &after, cluster);
        const std::string what = "vocab " + std::to_string(sh.vocab) + " values " +
                                 std::to_string(values) + " cluster " + std::to_string(cluster);
        ASSERT_EQ(after, logits) << "the logits were not given back: " << what;
        for (size_t i = 0; i < one.size(); ++i) {
          EXPECT_EQ(split[i].token, one[i].token) << what << " row " << i;
          EXPECT_NEAR(split[i].logprob, one[i].logprob, 1e-5) << what << " row " << i;
          ASSERT_EQ(split[i].top.size(), one[i].top.size()) << what << " row " << i;
          for (size_t j = 0; j < one[i].top.size(); ++j) {
            EXPECT_EQ(split[i].top[j].first, one[i].top[j].first) << what << " row " << i;
            EXPECT_NEAR(split[i].top[j].second, one[i].top[j].second, 1e-5) << what;
          }
        }
      }
    }
  }
}

// A row's token depends on its (seed, counter) and logits only: alone, batched, or run twice.
TEST(SamplingCuda, SameTokenAloneOrBatched) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937 rng(5);
  const int32_t vocab = 32000;
  SamplePlan plan;
  std::vector<float> logits;
  for (int i = 0; i < 24; ++i) {
    const std::vector<float> row = random_logits(rng, size_t(vocab), 0);
    logits.insert(logits.end(), row.begin(), row.end());
    plan.rows.push_back(random_row(rng, vocab, 1 + i % 4));
  }
  const auto batched = run_device(logits, vocab, plan);
  EXPECT_EQ(run_device(logits, vocab, plan)[7].token, batched[7].token);
  for (int i = 0; i < 24; ++i) {
    SamplePlan one;
    one.rows = {plan.rows[size_t(i)]};
    const std::vector<float> row(logits.begin() + int64_t(i) * vocab,
                                 logits.begin() + int64_t(i + 1) * vocab);
    EXPECT_EQ(run_device(row, vocab, one)[0].token, batched[size_t(i)].token) << "row " << i;
  }
}

// Many draws of one row (each its own counter) against the host's distribution: a chi-square test
// per filter setting (p < 1e-4 of failing by chance).
TEST(SamplingCuda, FrequenciesFollowTheHostDistribution) {
  PA_SKIP_WITHOUT_GPU();
  const int32_t vocab = 64, draws = 40000;
  std::vector<float> row(vocab);
  for (int32_t i = 0; i < vocab; ++i) row[size_t(i)] = float(std::sin(0.7 * i)) * 2.f;
  RowSampling settings[4];
  settings[0].temperature = 1.f;
  settings[1].temperature = 0.7f, settings[1].top_k = 10;
  settings[2].temperature = 1.2f, settings[2].top_p = 0.6f;
  settings[3].temperature = 0.9f, settings[3].top_k = 20, settings[3].top_p = 0.9f,
  settings[3].min_p = 0.1f;
  for (const RowSampling& base : settings) {
    SamplePlan plan;
    std::vector<float> logits;
    for (int32_t i = 0; i < draws; ++i) {
      RowSampling r = base;
      r.seed = 99;
      r.counter = uint64_t(i);
      plan.rows.push_back(r);
      logits.insert(logits.end(), row.begin(), row.end());
    }
    const auto dev = run_device(logits, vocab, plan);
    std::map<int32_t, int> counts;
    for (const TokenLogprobs& t : dev) ++counts[t.token];
    const auto dist = filtered_distribution(row, base.temperature, base.top_k, base.top_p,
                                            base.min_p);
    double chi2 = 0;
    int64_t in_support = 0;
    for (const TokenProb& t : dist) {
      const double expect = t.prob * draws;
      const double got = counts.count(t.token) ? counts[t.token] : 0;
      in_support += int64_t(got);
      chi2 += (got - expect) * (got - expect) / expect;
    }
    EXPECT_EQ(in_support, draws) << "tokens outside the host's survivors";
    // Critical value of chi-square at p = 1e-4 for df = k - 1 (Wilson-Hilferty).
    const double df = double(dist.size() - 1), z = 3.719;
    const double crit = df * std::pow(1 - 2 / (9 * df) + z * std::sqrt(2 / (9 * df)), 3);
    EXPECT_LT(chi2, crit) << dist.size() << " survivors, top_k " << base.top_k << " top_p "
                          << base.top_p;
  }
}

}  // namespace

#endif  // PAGEDATTN_HAVE_CUDA
