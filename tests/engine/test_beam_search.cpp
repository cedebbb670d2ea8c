// best_of and beam search with the fake model: beam width 1 against the greedy oracle, wider
// beams against an exhaustive search over every sequence of a short length, best_of against its
// candidates' scores, the shared history's pages shared (never copied) and all freed afterwards.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <map>
#include <memory>
#include <vector>

#include "engine/beam_search.h"
#include "fake_model.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"

using namespace pagedattn;
using pagedattn::fakes::FakeModel;

namespace {

struct Seq {
  std::vector<int32_t> tokens;
  FinishReason finish = FinishReason::none;
  double cum_logprob = 0;
};

EngineConfig config(int64_t kv_tokens, int32_t block = 4) {
  EngineConfig c;
  c.kv_cache_tokens = kv_tokens;
  c.page_size = block;
  c.max_num_batched_tokens = 256;
  c.max_num_seqs = 32;
  c.log_startup = false;
  return c;
}

std::vector<int32_t> prompt_of(int32_t len, int32_t seed, int32_t vocab) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(int32_t((seed * 131 + i * 17 + i * i) % vocab));
  return p;
}

Request beam_request(std::vector<int32_t> prompt, int32_t width, int32_t n, int32_t max_tokens,
                     float length_penalty = 1.f) {
  Request r;
  r.prompt = std::move(prompt);
  r.use_beam_search = true;
  r.beam_width = width;
  r.n = n;
  r.max_tokens = max_tokens;
  r.length_penalty = length_penalty;
  return r;
}

// Steps the engine until it has no work; returns each request's sequences by index.
std::map<RequestId, std::vector<Seq>> run_all(Engine &e, int32_t max_steps = 10000) {
  std::map<RequestId, std::vector<Seq>> res;
  for (int32_t step = 0; e.has_work(); ++step) {
    if (step >= max_steps) {
      ADD_FAILURE() << "the engine did not finish in " << max_steps << " steps";
      break;
    }
    for (const RequestOutput &o : e.step()) {
      auto &seqs = res[o.id];
      for (const SequenceOutput &s : o.seqs) {
        if (seqs.size() <= size_t(s.index)) seqs.resize(size_t(s.index) + 1);
        Seq &q = seqs[size_t(s.index)];
        q.tokens.insert(q.tokens.end(), s.new_tokens.begin(), s.new_tokens.end());
        if (s.finish != FinishReason::none) q.finish = s.finish;
        q.cum_logprob = s.cumulative_logprob;
      }
    }
  }
  return res;
}

// log_softmax(logits)[token] after the history, in double, from the fake model's formula.
double oracle_logprob(const FakeModel &m, const std::vector<int32_t> &history, int32_t token) {
  std::vector<float> logits(size_t(m.config().vocab_size));
  m.logits_after(history, logits.data());
  double mx = -INFINITY, sum = 0;
  for (float x : logits) mx = std::max(mx, double(x));
  for (float x : logits) sum += std::exp(double(x) - mx);
  return double(logits[size_t(token)]) - mx - std::log(sum);
}

double oracle_cum_logprob(const FakeModel &m, std::vector<int32_t> history,
                          const std::vector<int32_t> &generated) {
  double cum = 0;
  for (int32_t t : generated) {
    cum += oracle_logprob(m, history, t);
    history.push_back(t);
  }
  return cum;
}

struct Scored {
  std::vector<int32_t> tokens;
  double cum = 0, score = 0;
};

// Every sequence of max_tokens tokens (or fewer, ending in eos), scored; best first.
std::vector<Scored> exhaustive(const FakeModel &m, const std::vector<int32_t> &prompt,
                               int32_t max_tokens, double length_penalty) {
  const auto &eos = m.config().eos_token_ids;
  std::vector<Scored> all;
  std::function<void(std::vector<int32_t> &, double)> walk = [&](std::vector<int32_t> &gen,
                                                                 double cum) {
    const bool ended = !gen.empty() && std::count(eos.begin(), eos.end(), gen.back()) > 0;
    if (ended || int32_t(gen.size()) == max_tokens) {
      all.push_back({gen, cum, cum / std::pow(double(gen.size()), length_penalty)});
      return;
    }
    std::vector<int32_t> history = prompt;
    history.insert(history.end(), gen.begin(), gen.end());
    for (int32_t t = 0; t < m.config().vocab_size; ++t) {
      gen.push_back(t);
      walk(gen, cum + oracle_logprob(m, history, t));
      gen.pop_back();
    }
  };
  std::vector<int32_t> gen;
  walk(gen, 0.0);
  std::stable_sort(all.begin(), all.end(),
                   [](const Scored &a, const Scored &b) { return a.score > b.score; });
  return all;
}

int32_t pages_with_refcount_at_least(const KvCache &c, int32_t r) {
  int32_t k = 0;
  for (int32_t p = 0; p < c.config().num_pages; ++p) k += c.refcount(p) >= r ? 1 : 0;
  return k;
}

}  // namespace

TEST(BeamSearch, LogprobHelpersMatchAHandComputation) {
  const std::vector<float> logits = {1.f, 3.f, 2.f, 3.f};
  const double lse = std::log(std::exp(1.0) + 2 * std::exp(3.0) + std::exp(2.0));
  EXPECT_NEAR(beam::token_logprob(logits, 2), 2.0 - lse, 1e-12);
  const auto top = beam::top_logprobs(logits, 3);
  ASSERT_EQ(top.size(), 3u);
  EXPECT_EQ(top[0].token, 1);  // ties: lower id first
  EXPECT_EQ(top[1].token, 3);
  EXPECT_EQ(top[2].token, 2);
  EXPECT_NEAR(top[2].logprob, 2.0 - lse, 1e-12);
  EXPECT_EQ(beam::top_logprobs(logits, 10).size(), 4u);
  EXPECT_THROW(beam::token_logprob(logits, 4), Error);
  EXPECT_NEAR(beam::score(-6.0, 3, 1.0), -2.0, 1e-12);
  EXPECT_NEAR(beam::score(-6.0, 4, 0.5), -3.0, 1e-12);
  EXPECT_NEAR(beam::score(-6.0, 3, 0.0), -6.0, 1e-12);
}

TEST(BeamSearch, SelectKeepsEndingCandidatesOnlyWithinTheWidth) {
  // Token 9 ends a sequence.
  auto ends = [](int32_t t) { return t == 9; };
  std::vector<beam::Candidate> c = {{0, 1, -1.0}, {0, 9, -0.5}, {1, 2, -2.0},
                                    {1, 3, -3.0}, {0, 4, -4.0}, {1, 9, -3.5}};
  auto kept = beam::select(c, 2, ends);
  // Ranks: (0,9) -0.5 ends, rank 0 -> finished; (0,1) -1 live; (1,2) -2 live: two live, done.
  ASSERT_EQ(kept.size(), 3u);
  EXPECT_EQ(kept[0].token, 9);
  EXPECT_EQ(kept[1].token, 1);
  EXPECT_EQ(kept[2].token, 2);
  // With width 1 the ending candidate at rank 0 finishes and one live beam continues.
  kept = beam::select(c, 1, ends);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[1].token, 1);
  // An ending candidate below the width's ranks is dropped.
  std::vector<beam::Candidate> d = {{0, 1, -1.0}, {0, 2, -2.0}, {0, 9, -3.0}};
  kept = beam::select(d, 2, ends);
  ASSERT_EQ(kept.size(), 2u);
  EXPECT_EQ(kept[1].token, 2);
}

TEST(BeamSearch, WidthOneEqualsGreedy) {
  auto model = std::make_unique<FakeModel>(64);
  const FakeModel &fake = *model;
  Engine e(std::move(model), config(2048));
  for (int32_t seed = 0; seed < 3; ++seed) {
    const auto prompt = prompt_of(9 + seed, seed, 64);
    const RequestId id = e.add_request(beam_request(prompt, 1, 1, 15));
    auto res = run_all(e);
    ASSERT_EQ(res[id].size(), 1u);
    EXPECT_EQ(res[id][0].tokens, fake.greedy_oracle(prompt, 15));
    EXPECT_EQ(res[id][0].finish, FinishReason::length);
    EXPECT_NEAR(res[id][0].cum_logprob, oracle_cum_logprob(fake, prompt, res[id][0].tokens), 1e-9);
  }
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

// Widths that keep every prefix alive (width >= vocab^(max_tokens - 1)), so beam search must find
// the exact best sequences.
TEST(BeamSearch, EqualsExhaustiveSearchOnShortSequences) {
  struct Case {
    int32_t vocab, width, n, max_tokens;
    float length_penalty;
  };
  for (const Case &c : {Case{8, 8, 3, 2, 1.f}, Case{2, 8, 8, 4, 1.f}, Case{3, 8, 5, 3, 0.f}}) {
    auto model = std::make_unique<FakeModel>(c.vocab);
    const FakeModel &fake = *model;
    Engine e(std::move(model), config(2048));
    const auto prompt = prompt_of(7, c.vocab, c.vocab);
    const RequestId id =
        e.add_request(beam_request(prompt, c.width, c.n, c.max_tokens, c.length_penalty));
    auto res = run_all(e);
    const auto best = exhaustive(fake, prompt, c.max_tokens, c.length_penalty);
    ASSERT_EQ(res[id].size(), size_t(c.n)) << "vocab " << c.vocab;
    for (int32_t i = 0; i < c.n; ++i) {
      EXPECT_EQ(res[id][size_t(i)].tokens, best[size_t(i)].tokens)
          << "vocab " << c.vocab << " rank " << i;
      EXPECT_NEAR(res[id][size_t(i)].cum_logprob, best[size_t(i)].cum, 1e-9);
    }
    EXPECT_EQ(e.cache().stats().pages_used, 0);
  }
}

// With a competitive eos, sequences end at different lengths and the length penalty matters.
TEST(BeamSearch, EqualsExhaustiveSearchWithEos) {
  for (float lp : {0.f, 1.f, 2.f}) {
    auto model = std::make_unique<FakeModel>(3, std::vector<int32_t>{0});
    model->eos_logit = 8.f;
    const FakeModel &fake = *model;
    Engine e(std::move(model), config(2048));
    const auto prompt = prompt_of(6, 2, 3);
    const RequestId id = e.add_request(beam_request(prompt, 8, 4, 3, lp));
    auto res = run_all(e);
    const auto best = exhaustive(fake, prompt, 3, lp);
    bool some_eos = false;
    ASSERT_EQ(res[id].size(), 4u);
    for (size_t i = 0; i < 4; ++i) {
      EXPECT_EQ(res[id][i].tokens, best[i].tokens) << "length_penalty " << lp << " rank " << i;
      EXPECT_EQ(res[id][i].finish,
                res[id][i].tokens.back() == 0 ? FinishReason::stop : FinishReason::length);
      some_eos = some_eos || res[id][i].tokens.size() < 3;
    }
    if (lp == 2.f) {
      EXPECT_TRUE(some_eos);
    }  // the penalty favours the longer ones otherwise
    EXPECT_EQ(e.cache().stats().pages_used, 0);
  }
}

TEST(BeamSearch, SharesHistoryPagesAndFreesEverything) {
  auto model = std::make_unique<FakeModel>(64);
  Engine e(std::move(model), config(4096, 16));
  const RequestId id = e.add_request(beam_request(prompt_of(32, 5, 64), 4, 2, 20));  // 2 pages
  e.step();  // prefill, then the first beam step forks 4 beams off the prompt
  EXPECT_EQ(e.cache().stats().num_sequences, 4);
  EXPECT_EQ(e.cache().stats().pages_used, 2);  // shared, not copied
  EXPECT_EQ(pages_with_refcount_at_least(e.cache(), 4), 2);
  e.step();  // each beam writes position 32 into a page of its own; beams not kept free theirs
  EXPECT_GE(e.cache().stats().pages_used, 2 + 1);
  EXPECT_LE(e.cache().stats().pages_used, 2 + 4);
  EXPECT_EQ(pages_with_refcount_at_least(e.cache(), 4), 2);
  int32_t max_used = 0, max_seqs = 0;
  std::map<RequestId, std::vector<Seq>> res;
  while (e.has_work()) {
    for (const RequestOutput &o : e.step())
      for (const SequenceOutput &s : o.seqs) {
        if (res[o.id].size() <= size_t(s.index)) res[o.id].resize(size_t(s.index) + 1);
        res[o.id][size_t(s.index)].tokens = s.new_tokens;
      }
    max_used = std::max(max_used, e.cache().stats().pages_used);
    max_seqs = std::max(max_seqs, e.cache().stats().num_sequences);
    if (e.has_work()) {
      EXPECT_GE(pages_with_refcount_at_least(e.cache(), 2), 2);  // the prompt's pages
    }
  }
  EXPECT_LE(max_seqs, 4);  // beams not kept are freed at once
  // Forked beams time their tokens from their parent's last one (no gap since the epoch).
  EXPECT_LT(e.metrics().itl_s.sum, 60.0);
  EXPECT_GT(e.metrics().itl_s.count, 0);
  // 4 beams of at most 52 tokens: 2 shared prompt pages + 2 pages each.
  EXPECT_LE(max_used, 2 + 4 * 2);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
  EXPECT_EQ(e.cache().stats().num_sequences, 0);
  ASSERT_EQ(res[id].size(), 2u);
  EXPECT_EQ(res[id][0].tokens.size(), 20u);
}

TEST(BeamSearch, BatchedWithOtherRequestsAndUnderPreemptionGivesTheSameBeams) {
  const auto prompt = prompt_of(13, 11, 64);
  auto solo = [&] {
    Engine e(std::make_unique<FakeModel>(64), config(4096));
    const RequestId id = e.add_request(beam_request(prompt, 3, 3, 12, 0.5f));
    return run_all(e)[id];
  }();
  for (const double swap_mib : {0.0, 1.0}) {  // preempted sequences recomputed, or swapped
  SCOPED_TRACE(swap_mib > 0 ? "swap" : "recompute");
  EngineConfig cfg = config(96, 4);  // 24 pages: the greedy requests force preemptions
  cfg.watermark_pages = 0;
  cfg.admission = AdmissionPolicy::immediate;  // on current use, so that growth preempts
  cfg.swap_space_mib = swap_mib;
  cfg.preemption = swap_mib > 0 ? PreemptionMode::swap : PreemptionMode::recompute;
  auto model = std::make_unique<FakeModel>(64);
  const FakeModel &fake = *model;
  Engine e(std::move(model), cfg);
  std::vector<std::pair<RequestId, std::vector<int32_t>>> greedy;
  for (int32_t i = 0; i < 4; ++i) {
    Request r;
    r.prompt = prompt_of(10 + i, 20 + i, 64);
    r.sampling.temperature = 0.f;
    r.max_tokens = 20;
    greedy.emplace_back(e.add_request(r), r.prompt);
  }
  const RequestId id = e.add_request(beam_request(prompt, 3, 3, 12, 0.5f));
  auto res = run_all(e);
  ASSERT_EQ(res[id].size(), 3u);
  for (size_t i = 0; i < 3; ++i) EXPECT_EQ(res[id][i].tokens, solo[i].tokens) << "beam " << i;
  for (auto &[gid, p] : greedy) EXPECT_EQ(res[gid].at(0).tokens, fake.greedy_oracle(p, 20));
  EXPECT_GT(e.metrics().preemptions, 0);
  EXPECT_EQ(e.metrics().preemptions_swap > 0, swap_mib > 0);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
  EXPECT_EQ(e.metrics().swap_used_bytes, 0);
  }
}

TEST(BestOf, ReturnsTheHighestScoringCandidates) {
  const auto prompt = prompt_of(32, 3, 64);
  Request all;
  all.prompt = prompt;
  all.n = 6;
  all.best_of = 6;
  all.seed = 77;
  all.max_tokens = 10;
  auto model = std::make_unique<FakeModel>(64);
  const FakeModel &fake = *model;
  Engine e(std::move(model), config(4096, 16));
  const RequestId id_all = e.add_request(all);
  auto cands = run_all(e)[id_all];
  ASSERT_EQ(cands.size(), 6u);
  for (const Seq &c : cands)
    EXPECT_NEAR(c.cum_logprob, oracle_cum_logprob(fake, prompt, c.tokens), 1e-9);

  // Same seed: the same six candidates; the best two come back, best first.
  Request best = all;
  best.n = 2;
  const RequestId id = e.add_request(best);
  e.step();  // prefill, then six candidates forked off the prompt's two pages
  EXPECT_EQ(e.cache().stats().num_sequences, 6);
  EXPECT_EQ(pages_with_refcount_at_least(e.cache(), 6), 2);
  auto res = run_all(e)[id];
  std::vector<Seq> ranked = cands;
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const Seq &a, const Seq &b) { return a.cum_logprob > b.cum_logprob; });
  ASSERT_EQ(res.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(res[i].tokens, ranked[i].tokens) << "rank " << i;
    EXPECT_DOUBLE_EQ(res[i].cum_logprob, ranked[i].cum_logprob);
  }
  EXPECT_GT(ranked[0].cum_logprob, ranked[5].cum_logprob);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST(BestOf, BadValuesThrowAndQueueNothing) {
  Engine e(std::make_unique<FakeModel>(64), config(2048));
  auto expect_error = [&](Request r, const std::string &what) {
    try {
      e.add_request(std::move(r));
      ADD_FAILURE() << "expected Error containing " << what;
    } catch (const Error &err) {
      EXPECT_NE(std::string(err.what()).find(what), std::string::npos) << err.what();
    }
  };
  Request r;
  r.prompt = {1, 2, 3};
  r.n = 3;
  r.best_of = 2;
  expect_error(r, "add_request: best_of");
  r.best_of = Request::kMaxSequences + 1;
  expect_error(r, "add_request: best_of");
  Request b = beam_request({1, 2, 3}, Request::kMaxBeamWidth + 1, 1, 4);
  expect_error(b, "add_request: beam_width");
  b = beam_request({1, 2, 3}, 2, 3, 4);
  expect_error(b, "add_request: beam_width");
  b = beam_request({1, 2, 3}, 2, 1, 4, NAN);
  expect_error(b, "add_request: length_penalty");
  EXPECT_FALSE(e.has_work());
  // best_of as the width (the legacy API) when beam_width is not set.
  b = beam_request({1, 2, 3}, 0, 2, 3);
  b.best_of = 4;
  e.add_request(b);
  e.step();
  EXPECT_EQ(e.cache().stats().num_sequences, 4);
  run_all(e);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

// Beams that outgrow the whole cache end (cut short by the cache, or failed with an error) instead
// of hanging, and free every page.
TEST(BeamSearch, BeamsLargerThanTheCacheDoNotHang) {
  EngineConfig cfg = config(48, 4);  // 12 pages; 8 beams of 40 tokens need far more
  cfg.watermark_pages = 0;
  Engine e(std::make_unique<FakeModel>(64), cfg);
  const RequestId id = e.add_request(beam_request(prompt_of(10, 1, 64), 8, 2, 30));
  RequestOutput last;
  bool finished = false;
  for (int32_t step = 0; e.has_work() && step < 5000; ++step)
    for (const RequestOutput &o : e.step())
      if (o.id == id && o.finished) {
        finished = true;
        last = o;
      }
  EXPECT_TRUE(finished);
  EXPECT_FALSE(e.has_work());
  EXPECT_EQ(e.cache().stats().pages_used, 0);
  if (last.error.empty()) {
    ASSERT_EQ(last.seqs.size(), 2u);
    for (const SequenceOutput &s : last.seqs) {
      EXPECT_EQ(s.finish, FinishReason::length);
      EXPECT_LT(s.new_tokens.size(), 30u);  // the cache cut them short
    }
  } else {
    EXPECT_NE(last.error.find("beam search:"), std::string::npos) << last.error;
  }
}
