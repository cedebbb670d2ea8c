// Sampling: each filter's support checked by drawing many times, against probabilities computed
// here.
#include <gtest/gtest.h>

#include <cmath>
#include <map>
#include <random>
#include <set>

#include "pagedattn/error.h"
#include "pagedattn/sample_plan.h"
#include "pagedattn/sampling.h"

using namespace pagedattn;

namespace {

// Logits whose softmax (temperature 1) is exactly `probs`.
std::vector<float> logits_for(const std::vector<double>& probs) {
  std::vector<float> l;
  for (double p : probs) l.push_back(float(std::log(p)));
  return l;
}

// Draw n tokens, each from its own seed (a sequence's draws with one history share one u);
// counts per token.
std::map<int32_t, int> draw(SamplingParams p, const std::vector<float>& logits, int n,
                            std::vector<int32_t> history = {}) {
  std::map<int32_t, int> counts;
  const uint64_t seed = p.seed;
  for (int i = 0; i < n; ++i) {
    p.seed = seed * 1000003u + uint64_t(i);
    ++counts[Sampler(p).sample(logits, history)];
  }
  return counts;
}

std::set<int32_t> support(const std::map<int32_t, int>& counts) {
  std::set<int32_t> s;
  for (auto [t, c] : counts) s.insert(t);
  return s;
}

// Each observed frequency within 5 standard deviations of the expected probability.
void expect_frequencies(const std::map<int32_t, int>& counts, const std::map<int32_t, double>& want,
                        int n) {
  for (auto [t, p] : want) {
    const double sd = std::sqrt(p * (1 - p) / n);
    const double got = counts.count(t) ? double(counts.at(t)) / n : 0.0;
    EXPECT_NEAR(got, p, 5 * sd + 1e-9) << "token " << t;
  }
}

const std::vector<double> kProbs = {0.05, 0.4, 0.1, 0.25, 0.2};  // order: 1, 3, 4, 2, 0

// argmax against the plain loop it replaced, on random rows with ties, NaNs (also at x[0]),
// signed zeros and infinities, of every length around the vector width.
TEST(Sampling, ArgmaxMatchesThePlainLoop) {
  auto plain = [](std::span<const float> x) {
    int32_t best = 0;
    for (size_t i = 1; i < x.size(); ++i) {
      if (x[i] > x[size_t(best)]) best = int32_t(i);
    }
    return best;
  };
  std::mt19937 rng(5);
  for (int t = 0; t < 4000; ++t) {
    std::vector<float> x(1 + rng() % 200);
    for (float& v : x) v = float(int(rng() % 9)) - 4.f;
    if (rng() % 4 == 0) x[rng() % x.size()] = std::nanf("");
    if (rng() % 6 == 0) x[0] = std::nanf("");
    if (rng() % 5 == 0) x[rng() % x.size()] = -0.f;
    if (rng() % 7 == 0) x[rng() % x.size()] = INFINITY;
    if (rng() % 7 == 0) x[rng() % x.size()] = -INFINITY;
    ASSERT_EQ(argmax(x), plain(x)) << "trial " << t << ", length " << x.size();
  }
  EXPECT_EQ(argmax(std::span<const float>()), 0);
  std::vector<float> big(128256, -1.f);
  big[128255] = 3.f;
  big[70000] = 3.f;
  EXPECT_EQ(argmax(big), 70000);
}

TEST(Sampling, GreedyIsArgmaxLowestIdOnTies) {
  SamplingParams p;
  p.temperature = 0.f;
  Sampler s(p);
  EXPECT_EQ(s.sample(logits_for(kProbs), {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{1.f, 3.f, 3.f, -2.f}, {}), 1);
  EXPECT_EQ(s.sample(std::vector<float>{-5.f, -7.f, -1.f}, {}), 2);
  const auto d = sampling_distribution(logits_for(kProbs), p, {});
  ASSERT_EQ(d.size(), 1u);
  EXPECT_EQ(d[0].token, 1);
  EXPECT_EQ(d[0].prob, 1.0);
}

TEST(Sampling, TemperatureOneFollowsSoftmax) {
  SamplingParams p;
  p.seed = 1;
  const int n = 40000;
  std::map<int32_t, double> want;
  for (size_t i = 0; i < kProbs.size(); ++i) want[int32_t(i)] = kProbs[i];
  expect_frequencies(draw(p, logits_for(kProbs), n), want, n);
}

TEST(Sampling, TemperatureSharpensAndFlattens) {
  SamplingParams p;
  p.temperature = 0.5f;  // p_i^2 renormalised
  auto d = sampling_distribution(logits_for(kProbs), p, {});
  double z = 0;
  for (double q : kProbs) z += q * q;
  for (const TokenProb& t : d)
    EXPECT_NEAR(t.prob, kProbs[size_t(t.token)] * kProbs[size_t(t.token)] / z, 1e-6);
  p.temperature = 100.f;  // nearly uniform
  d = sampling_distribution(logits_for(kProbs), p, {});
  for (const TokenProb& t : d) EXPECT_NEAR(t.prob, 0.2, 0.01);
}

TEST(Sampling, TopKRestrictsSupport) {
  SamplingParams p;
  p.top_k = 3;
  p.seed = 2;
  const int n = 30000;
  const auto c = draw(p, logits_for(kProbs), n);
  EXPECT_EQ(support(c), (std::set<int32_t>{1, 3, 4}));
  expect_frequencies(c, {{1, 0.4 / 0.85}, {3, 0.25 / 0.85}, {4, 0.2 / 0.85}}, n);
}

TEST(Sampling, TopPKeepsSmallestSetReachingP) {
  SamplingParams p;
  p.seed = 3;
  const int n = 30000;
  p.top_p = 0.6f;  // 0.4 < 0.6 <= 0.65: tokens 1 and 3
  auto c = draw(p, logits_for(kProbs), n);
  EXPECT_EQ(support(c), (std::set<int32_t>{1, 3}));
  expect_frequencies(c, {{1, 0.4 / 0.65}, {3, 0.25 / 0.65}}, n);
  p.top_p = 0.9f;  // 0.85 < 0.9 <= 0.95: four tokens
  EXPECT_EQ(support(draw(p, logits_for(kProbs), n)), (std::set<int32_t>{1, 3, 4, 2}));
  p.top_p = 0.1f;  // the top token alone
  EXPECT_EQ(support(draw(p, logits_for(kProbs), 1000)), (std::set<int32_t>{1}));
}

TEST(Sampling, TopPAppliesAfterTopK) {
  SamplingParams p;
  p.top_k = 2;     // {1: 0.4, 3: 0.25} -> renormalised {0.615, 0.385}
  p.top_p = 0.6f;  // 0.615 >= 0.6: token 1 alone
  EXPECT_EQ(support(draw(p, logits_for(kProbs), 2000)), (std::set<int32_t>{1}));
}

TEST(Sampling, MinPDropsTokensBelowFractionOfMax) {
  SamplingParams p;
  p.seed = 4;
  p.min_p = 0.55f;  // threshold 0.22: tokens 1 (0.4) and 3 (0.25)
  const int n = 30000;
  const auto c = draw(p, logits_for(kProbs), n);
  EXPECT_EQ(support(c), (std::set<int32_t>{1, 3}));
  expect_frequencies(c, {{1, 0.4 / 0.65}, {3, 0.25 / 0.65}}, n);
  p.min_p = 0.2f;  // threshold 0.08: all but token 0
  EXPECT_EQ(support(draw(p, logits_for(kProbs), n)), (std::set<int32_t>{1, 2, 3, 4}));
}

TEST(Sampling, SameSeedSameTokensOtherSeedOtherTokens) {
  std::vector<float> logits(1000);
  for (size_t i = 0; i < logits.size(); ++i) logits[i] = float(std::sin(double(i)));
  SamplingParams p;
  p.seed = 1234;
  p.top_p = 0.95f;
  auto run = [&](uint64_t seed) {
    p.seed = seed;
    Sampler s(p);
    std::vector<int32_t> out, history;  // generated token n draws with counter n
    for (int i = 0; i < 64; ++i) {
      out.push_back(s.sample(logits, history));
      history.push_back(out.back());
    }
    return out;
  };
  EXPECT_EQ(run(1234), run(1234));
  EXPECT_NE(run(1234), run(1235));
}

TEST(Sampling, RepetitionPenaltyMath) {
  std::vector<float> l = {2.f, -2.f, 1.f, 0.5f};
  apply_repetition_penalty(l, std::vector<int32_t>{0, 1, 0, 1, 1}, 2.f);  // each token once
  EXPECT_EQ(l, (std::vector<float>{1.f, -4.f, 1.f, 0.5f}));
  // Greedy with the penalty: token 0 (2.0) falls to 2.0 / 1.5 = 1.33 < 1.5.
  SamplingParams p;
  p.temperature = 0.f;
  p.repetition_penalty = 1.5f;
  Sampler s(p);
  const std::vector<float> logits = {2.f, 1.5f, 0.f};
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{}), 0);
  EXPECT_EQ(s.sample(logits, std::vector<int32_t>{0}), 1);
  EXPECT_THROW(apply_repetition_penalty(l, std::vector<int32_t>{4}, 2.f), Error);
}

TEST(Sampling, StopTokens) {
  SamplingParams p;
  p.stop_token_ids = {2, 7};
  Sampler s(p);
  EXPECT_TRUE(s.is_stop_token(7));
  EXPECT_FALSE(s.is_stop_token(3));
}

TEST(Sampling, RejectsBadParams) {
  auto expect = [](SamplingParams p, const std::string& field) {
    try {
      Sampler s(p);
      ADD_FAILURE() << "no Error for " << field;
    } catch (const Error& e) {
      EXPECT_EQ(std::string(e.what()).rfind("sampling: " + field, 0), 0u) << e.what();
    }
  };
  SamplingParams p;
  p.temperature = -1.f;
  expect(p, "temperature");
  p = {};
  p.top_p = 0.f;
  expect(p, "top_p");
  p = {};
  p.top_p = 1.5f;
  expect(p, "top_p");
  p = {};
  p.min_p = 2.f;
  expect(p, "min_p");
  p = {};
  p.repetition_penalty = 0.f;
  expect(p, "repetition_penalty");
  p = {};
  p.stop = {"ok", ""};
  expect(p, "stop[1]");
}

TEST(StopStrings, TrimsAtTheStopStringAcrossPieces) {
  StopStringMatcher m({"o w"});
  std::string out = m.feed("Hel");
  out += m.feed("lo");  // "o" could start "o w": held back
  EXPECT_EQ(out, "Hell");
  out += m.feed(" wor");
  EXPECT_TRUE(m.stopped());
  EXPECT_EQ(out, "Hell");
  EXPECT_EQ(m.feed("ld"), "");
  EXPECT_EQ(m.flush(), "");
}

TEST(StopStrings, HeldTextIsReleasedWhenItCannotMatch) {
  StopStringMatcher m({"END", "\n\n"});
  EXPECT_EQ(m.feed("abcE"), "abc");
  EXPECT_EQ(m.feed("N"), "");
  EXPECT_EQ(m.feed("X\n"), "ENX");
  EXPECT_FALSE(m.stopped());
  EXPECT_EQ(m.flush(), "\n");
}

TEST(StopStrings, EarliestStopWins) {
  StopStringMatcher m({"cd", "b"});
  EXPECT_EQ(m.feed("abcd"), "a");
  EXPECT_TRUE(m.stopped());
  StopStringMatcher none({});
  EXPECT_EQ(none.feed("anything"), "anything");
}

// Philox4x32-10 against the published known answer (Random123's kat_vectors: counter 0, key 0
// gives 6627e8d5 e169c58d ...): the draw is the top 53 bits of the first two words.
TEST(Philox, KnownAnswerAndUniformity) {
  const uint64_t bits = ((uint64_t(0x6627e8d5u) << 32) | 0xe169c58du) >> 11;
  EXPECT_EQ(philox_uniform(0, 0), double(bits) * 0x1.0p-53);
  double sum = 0;
  std::set<double> seen;
  for (uint64_t i = 0; i < 10000; ++i) {
    const double u = philox_uniform(42, i);
    ASSERT_GE(u, 0.0);
    ASSERT_LT(u, 1.0);
    sum += u;
    seen.insert(u);
  }
  EXPECT_NEAR(sum / 10000, 0.5, 0.02);
  EXPECT_EQ(seen.size(), 10000u);
  EXPECT_NE(philox_uniform(42, 7), philox_uniform(43, 7));
  EXPECT_NE(philox_uniform(42, 7), philox_uniform(42, uint64_t(7) << 32));
}

// The plan's edits change a row exactly as the penalties and bias of Sampler's path do, kept up
// to date token by token.
TEST(SamplePlan, EditsMatchThePenaltyFunctions) {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> val(-4.f, 4.f);
  std::vector<float> logits(300);
  for (float& x : logits) x = val(rng);
  SamplingParams p;
  p.repetition_penalty = 1.3f;
  p.presence_penalty = 0.4f;
  p.frequency_penalty = -0.3f;
  p.logit_bias = {{5, 2.5f}, {17, -100.f}, {40, 1.f}};
  const std::vector<int32_t> prompt = {1, 2, 3, 5, 2};
  LogitEditor editor(p, prompt);
  std::vector<int32_t> history = prompt;
  for (int step = 0; step < 40; ++step) {
    std::vector<float> want = logits;
    apply_repetition_penalty(want, history, p.repetition_penalty);
    apply_openai_penalties(want, p, std::span<const int32_t>(history).subspan(prompt.size()));
    std::vector<float> got = logits;
    apply_logit_edits(got, row_sampling(p, 0, -1), editor.edits());
    ASSERT_EQ(got, want) << "step " << step;
    std::set<int32_t> distinct;
    for (const LogitEdit& e : editor.edits()) ASSERT_TRUE(distinct.insert(e.token).second);
    const int32_t t = int32_t(rng() % 60);
    history.push_back(t);
    editor.add_output(t);
  }
}

// sample_row (the plan's host twin, with the editor's edits) and Sampler draw the token that
// sampling_distribution (the penalty functions over the whole history) and the same u give;
// draw_in_id_order walks the survivors in ascending id order.
TEST(SamplePlan, HostTwinMatchesTheReferenceDistribution) {
  std::mt19937 rng(9);
  std::uniform_real_distribution<float> val(-3.f, 3.f);
  std::vector<float> logits(500);
  for (float& x : logits) x = val(rng);
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_k = 50;
  p.top_p = 0.9f;
  p.repetition_penalty = 1.1f;
  p.seed = 77;
  const std::vector<int32_t> prompt = {4, 8, 15, 16, 23, 42};
  std::vector<int32_t> history = prompt;
  LogitEditor editor(p, prompt);
  const Sampler sampler(p);
  for (int g = 0; g < 50; ++g) {
    const TokenLogprobs t = sample_row(logits, row_sampling(p, uint64_t(g), -1), editor.edits());
    const int32_t want = draw_in_id_order(sampling_distribution(logits, p, history, prompt.size()),
                                          philox_uniform(p.seed, uint64_t(g)));
    ASSERT_EQ(t.token, want) << "token " << g;
    ASSERT_EQ(sampler.sample(logits, history, prompt.size()), want) << "token " << g;
    history.push_back(t.token);
    editor.add_output(t.token);
  }
  const std::vector<TokenProb> dist = {{7, 0.5}, {2, 0.3}, {9, 0.2}};  // id order: 2, 7, 9
  EXPECT_EQ(draw_in_id_order(dist, 0.0), 2);
  EXPECT_EQ(draw_in_id_order(dist, 0.29), 2);
  EXPECT_EQ(draw_in_id_order(dist, 0.31), 7);
  EXPECT_EQ(draw_in_id_order(dist, 0.81), 9);
  EXPECT_EQ(draw_in_id_order(dist, 0.9999999), 9);
}

// Logprobs are the raw row's log-softmax (not the penalised or filtered one); top-N most likely
// first with ties to the lower id.
TEST(SamplePlan, LogprobsOfTheRawRow) {
  const std::vector<float> logits = {1.f, 3.f, 2.f, 3.f, -1.f};
  double z = 0;
  for (float x : logits) z += std::exp(double(x));
  RowSampling r;
  r.temperature = 0.f;
  r.repetition_penalty = 2.f;
  r.logprobs = 3;
  const std::vector<LogitEdit> edits = {{1, 1, 0.f, 1}, {3, 0, -10.f, 0}};  // 3 -> 1.5, 3 -> -7
  const TokenLogprobs t = sample_row(logits, r, edits);
  EXPECT_EQ(t.token, 2);  // the edited row's argmax
  EXPECT_NEAR(t.logprob, 2.0 - std::log(z), 1e-6);
  ASSERT_EQ(t.top.size(), 3u);
  EXPECT_EQ(t.top[0].first, 1);
  EXPECT_EQ(t.top[1].first, 3);
  EXPECT_EQ(t.top[2].first, 2);
  EXPECT_NEAR(t.top[1].second, 3.0 - std::log(z), 1e-6);
  r.logprobs = -1;
  EXPECT_TRUE(sample_row(logits, r, edits).top.empty());
}

TEST(SamplePlan, RejectsAPlanThatDoesNotFit) {
  SamplePlan plan;
  plan.rows.resize(2);
  EXPECT_THROW(check_sample_plan(plan, 3, 100, "op"), Error);
  check_sample_plan(plan, 2, 100, "op");
  plan.rows[1].edit_end = 1;
  EXPECT_THROW(check_sample_plan(plan, 2, 100, "op"), Error);
  plan.edits.push_back(LogitEdit{100, 0, 0.f, 0});
  EXPECT_THROW(check_sample_plan(plan, 2, 100, "op"), Error);
  plan.edits[0].token = 99;
  check_sample_plan(plan, 2, 100, "op");
  // The first bad edit among many is named, with what is wrong with it.
  plan.edits.resize(3000, LogitEdit{7, 1, 0.f, 1});
  plan.rows[1].edit_end = 3000;
  check_sample_plan(plan, 2, 100, "op");
  auto message = [&] {
    try {
      check_sample_plan(plan, 2, 100, "op");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string("no error");
  };
  plan.edits[2500].count = -1;
  EXPECT_NE(message().find("edit 2500 has a negative count"), std::string::npos) << message();
  plan.edits[1700].token = -3;
  EXPECT_NE(message().find("edit 1700 names token -3 outside"), std::string::npos) << message();
  plan.edits.resize(1);
  plan.rows[1].edit_end = 1;
  plan.rows[0].logprobs = 21;
  EXPECT_THROW(check_sample_plan(plan, 2, 100, "op"), Error);
  plan.rows[0].logprobs = 0;
  plan.rows[0].top_p = 0.f;
  EXPECT_THROW(check_sample_plan(plan, 2, 100, "op"), Error);
}

}  // namespace

// OpenAI's penalties: logit[t] -= c[t] * frequency + (c[t] > 0) * presence, c counting generated
// tokens only; logit_bias added. Checked against the softmax of logits adjusted here in double.
TEST(Sampling, PresenceFrequencyPenaltiesAndLogitBiasMath) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f};
  SamplingParams p;
  p.presence_penalty = 0.7f;
  p.frequency_penalty = 0.3f;
  p.logit_bias = {{3, 2.5f}, {0, -1.0f}};
  // Prompt [4, 4, 1] (not counted), output [1, 1, 2, 1].
  const std::vector<int32_t> history = {4, 4, 1, 1, 1, 2, 1};
  const auto dist = sampling_distribution(logits, p, history, 3);
  std::vector<double> adj(logits.begin(), logits.end());
  adj[1] -= 3 * 0.3 + 0.7;
  adj[2] -= 1 * 0.3 + 0.7;
  adj[3] += 2.5;
  adj[0] -= 1.0;
  double mx = -INFINITY, sum = 0;
  for (double x : adj) mx = std::max(mx, x);
  for (double x : adj) sum += std::exp(x - mx);
  ASSERT_EQ(dist.size(), 5u);
  for (const TokenProb& t : dist)
    EXPECT_NEAR(t.prob, std::exp(adj[size_t(t.token)] - mx) / sum, 1e-6) << "token " << t.token;
  // Negative penalties encourage repetition: greedy picks the most repeated token.
  SamplingParams g;
  g.temperature = 0;
  g.frequency_penalty = -2.f;
  Sampler s(g);
  EXPECT_EQ(s.sample(logits, history, 3), 1);               // 2 - 3 * (-2) = 8 beats 3
  EXPECT_EQ(s.sample(logits, history, history.size()), 4);  // no output yet: no penalty
}

TEST(Sampling, LogitBiasBansAndForces) {
  const std::vector<float> logits = {1.0f, 2.0f, 0.5f, -1.0f, 3.0f};
  SamplingParams p;
  p.temperature = 0;
  p.logit_bias = {{4, -100.f}};
  EXPECT_EQ(Sampler(p).sample(logits, {}), 1);
  p.logit_bias = {{3, 100.f}};
  EXPECT_EQ(Sampler(p).sample(logits, {}), 3);
  p.temperature = 1;
  for (const auto& [t, c] : draw(p, logits, 2000)) EXPECT_EQ(t, 3) << c;
  // Out of the vocabulary: an error naming it.
  p.logit_bias = {{5, 1.f}};
  EXPECT_THROW(sampling_distribution(logits, p, {}), Error);
}

TEST(Sampling, RejectsBadOpenAiParams) {
  for (float v : {2.5f, -2.01f, NAN}) {
    SamplingParams p;
    p.presence_penalty = v;
    EXPECT_THROW(validate_sampling_params(p), Error) << v;
    p = SamplingParams();
    p.frequency_penalty = v;
    EXPECT_THROW(validate_sampling_params(p), Error) << v;
  }
  SamplingParams p;
  p.logit_bias = {{1, 100.5f}};
  EXPECT_THROW(validate_sampling_params(p), Error);
  p.logit_bias = {{-1, 1.f}};
  EXPECT_THROW(validate_sampling_params(p), Error);
  p.logit_bias = {{1, -100.f}, {2, 100.f}};
  EXPECT_NO_THROW(validate_sampling_params(p));
}
