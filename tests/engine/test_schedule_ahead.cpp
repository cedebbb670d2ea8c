// Scheduling ahead (EngineConfig::schedule_ahead): the engine begins the next greedy decode step
// before it reads the running one's ids, the next step's tokens standing in for them
// (chained_token), and drops the rows of sequences that the running step ends. The oracle: the
// same requests with scheduling ahead off, and the fake model's cache-free greedy continuation;
// the fake model also checks every K/V position it reads back through the batch's pages, so a page
// freed or hashed too early changes the output or throws.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <set>
#include <string>
#include <vector>

#include "fake_model.h"
#include "model/step_batch.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "tiny_models.h"

namespace pagedattn {
namespace {

using fakes::FakeModel;

EngineConfig config(int32_t ahead, int64_t kv_tokens = 2048) {
  EngineConfig c;
  c.kv_cache_tokens = kv_tokens;
  c.page_size = 4;
  c.max_num_batched_tokens = 32;
  c.max_num_seqs = 16;
  c.log_startup = false;
  c.schedule_ahead = ahead;
  return c;
}

std::vector<int32_t> prompt(int32_t len, int32_t seed) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(1 + (seed * 131 + i * 17 + i * i) % 127);
  return p;
}

Request greedy(std::vector<int32_t> ids, int32_t max_tokens) {
  Request r;
  r.prompt = std::move(ids);
  r.sampling.temperature = 0.f;
  r.max_tokens = max_tokens;
  return r;
}

struct Out {
  std::vector<int32_t> tokens;
  std::string text;
  FinishReason finish = FinishReason::none;
  bool finished = false;
};

void gather(std::map<RequestId, Out>& res, const std::vector<RequestOutput>& outs) {
  for (const RequestOutput& o : outs) {
    Out& r = res[o.id];
    for (const SequenceOutput& s : o.seqs) {
      r.tokens.insert(r.tokens.end(), s.new_tokens.begin(), s.new_tokens.end());
      r.text += s.new_text;
      if (s.finish != FinishReason::none) r.finish = s.finish;
    }
    r.finished = r.finished || o.finished;
  }
}

std::map<RequestId, Out> run(Engine& e, std::map<RequestId, Out> res = {}) {
  for (int32_t i = 0; i < 10000 && e.has_work(); ++i) gather(res, e.step());
  EXPECT_FALSE(e.has_work());
  return res;
}

// Requests that end every way a greedy request can: EOS (the model prefers it at every 9th
// position), max_tokens, a stop token id, a stop string, and ignore_eos to max_tokens.
std::vector<Request> mixed_requests(const FakeModel& fake) {
  std::vector<Request> reqs;
  for (int32_t i = 0; i < 6; ++i) reqs.push_back(greedy(prompt(3 + 5 * i, i), 10 + 7 * i));
  Request ig = greedy(prompt(6, 9), 23);
  ig.ignore_eos = true;
  reqs.push_back(ig);
  const std::vector<int32_t> expect = fake.greedy_oracle(prompt(11, 10), 40);
  Request st = greedy(prompt(11, 10), 40);
  st.sampling.stop_token_ids = {expect[2]};
  reqs.push_back(st);
  Request ss = greedy(prompt(11, 10), 40);
  ss.sampling.stop = {fakes::fake_decode({expect[3], expect[4]})};
  reqs.push_back(ss);
  return reqs;
}

TEST(ScheduleAhead, SameTokensTextAndFinishAsWithout) {
  std::map<RequestId, Out> res[2];
  int64_t chained[2] = {0, 0};
  for (int32_t ahead : {0, 1}) {
    auto model = std::make_unique<FakeModel>(128, std::vector<int32_t>{0});
    model->eos_every = 9;
    const FakeModel& fake = *model;
    Engine e(std::move(model), config(ahead), fakes::fake_decode);
    std::vector<Request> reqs = mixed_requests(fake);
    for (const Request& r : reqs) e.add_request(r);
    res[ahead] = run(e);
    chained[ahead] = fake.num_chained_passes;
    EXPECT_EQ(e.cache().stats().pages_used, 0) << "ahead " << ahead;
    EXPECT_EQ(e.metrics().requests_finished, int64_t(reqs.size())) << "ahead " << ahead;
    // The first request against the model's own greedy continuation (it ends on EOS).
    const std::vector<int32_t> oracle = fake.greedy_oracle(reqs[0].prompt, reqs[0].max_tokens);
    EXPECT_EQ(res[ahead].begin()->second.tokens, oracle) << "ahead " << ahead;
  }
  EXPECT_EQ(chained[0], 0);
  EXPECT_GT(chained[1], 10);  // the decode steps of the run, less those that end a request
  ASSERT_EQ(res[0].size(), res[1].size());
  std::set<FinishReason> reasons;
  for (const auto& [id, a] : res[0]) {
    const Out& b = res[1].at(id);
    EXPECT_EQ(b.tokens, a.tokens) << "request " << id;
    EXPECT_EQ(b.text, a.text) << "request " << id;
    EXPECT_EQ(b.finish, a.finish) << "request " << id;
    EXPECT_TRUE(a.finished && b.finished) << "request " << id;
    reasons.insert(a.finish);
  }
  EXPECT_EQ(reasons, (std::set<FinishReason>{FinishReason::stop, FinishReason::length}));
}

// Sampled requests (temperature, top-k/p, min-p, penalties, logit bias, seeds, logprobs) are
// scheduled ahead too: the plan of a step is built while its pass runs, its picking enqueued, then
// the next step begun with stand-ins for the picks. The same tokens and log-probabilities as
// without.
TEST(ScheduleAhead, SampledRequestsSameAsWithout) {
  std::map<RequestId, Out> res[2];
  std::map<RequestId, std::vector<TokenLogprobs>> lps[2];
  int64_t chained_sampled = 0;
  for (int32_t ahead : {0, 1}) {
    auto model = std::make_unique<FakeModel>(128, std::vector<int32_t>{0});
    model->eos_every = 11;
    const FakeModel& fake = *model;
    Engine e(std::move(model), config(ahead), fakes::fake_decode);
    for (int32_t i = 0; i < 6; ++i) {
      Request r = greedy(prompt(4 + 3 * i, 30 + i), 14 + 3 * i);
      r.seed = uint64_t(100 + i);
      r.sampling.temperature = 0.7f + 0.2f * float(i % 3);
      if (i % 2 == 0) r.sampling.top_k = 20;
      if (i % 3 == 1) r.sampling.top_p = 0.9f;
      if (i == 2) r.sampling.min_p = 0.05f;
      if (i == 3) r.sampling.repetition_penalty = 1.3f;
      if (i == 4) r.sampling.presence_penalty = 0.5f;
      if (i == 5) r.sampling.logit_bias = {{7, 3.f}};
      r.sampling.logprobs = i % 2 == 0 ? 3 : -1;
      e.add_request(r);
    }
    while (e.has_work()) {
      const std::vector<RequestOutput> outs = e.step();
      gather(res[ahead], outs);
      for (const RequestOutput& o : outs)
        for (const SequenceOutput& so : o.seqs)
          lps[ahead][o.id].insert(lps[ahead][o.id].end(), so.logprobs.begin(), so.logprobs.end());
    }
    EXPECT_EQ(e.cache().stats().pages_used, 0);
    if (ahead == 1) chained_sampled = fake.num_chained_sampled_passes;
  }
  EXPECT_GT(chained_sampled, 5);  // (EOS and the last tokens of each request break the chain)
  ASSERT_EQ(res[0].size(), 6u);
  for (const auto& [id, a] : res[0]) {
    EXPECT_EQ(res[1][id].tokens, a.tokens) << "request " << id;
    EXPECT_EQ(res[1][id].finish, a.finish) << "request " << id;
    const auto& la = lps[0][id];
    const auto& lb = lps[1][id];
    ASSERT_EQ(la.size(), lb.size()) << "request " << id;
    for (size_t k = 0; k < la.size(); ++k) {
      EXPECT_EQ(lb[k].token, la[k].token);
      EXPECT_EQ(lb[k].logprob, la[k].logprob);
      EXPECT_EQ(lb[k].top, la[k].top);
    }
  }
}

// A request cancelled while the step begun ahead holds a row of it: that row is dropped, its pages
// are free at once, the others go on unchanged.
TEST(ScheduleAhead, CancelWhileTheStepAheadRuns) {
  auto model = std::make_unique<FakeModel>(128);
  const FakeModel& fake = *model;
  Engine e(std::move(model), config(1));
  std::vector<RequestId> ids;
  for (int32_t i = 0; i < 4; ++i) ids.push_back(e.add_request(greedy(prompt(5 + i, i), 30)));
  std::map<RequestId, Out> res;
  for (int32_t i = 0; i < 6; ++i) gather(res, e.step());
  ASSERT_GT(fake.num_chained_passes, 0);
  const size_t before = res[ids[1]].tokens.size();
  e.cancel(ids[1]);
  res = run(e, res);
  EXPECT_EQ(res[ids[1]].finish, FinishReason::cancelled);
  EXPECT_TRUE(res[ids[1]].finished);
  EXPECT_EQ(res[ids[1]].tokens.size(), before);  // nothing after the cancel
  for (size_t i : {0u, 2u, 3u})
    EXPECT_EQ(res[ids[i]].tokens, fake.greedy_oracle(prompt(5 + int32_t(i), int32_t(i)), 30))
        << "request " << i;
  EXPECT_EQ(e.cache().stats().pages_used, 0);
  EXPECT_EQ(e.metrics().requests_cancelled, 1);
}

// Pages get their hashes only once the step that writes them has run: a request whose prompt is an
// earlier request's prompt and output finds them in the prefix cache, and the fake model reads
// every cached position back.
TEST(ScheduleAhead, PrefixCacheKeepsOnlyWrittenPages) {
  auto model = std::make_unique<FakeModel>(128);
  const FakeModel& fake = *model;
  EngineConfig c = config(1);
  c.enable_prefix_cache = true;
  Engine e(std::move(model), c);
  const std::vector<int32_t> p = prompt(7, 3);
  const RequestId a = e.add_request(greedy(p, 21));
  const std::vector<int32_t> first = run(e)[a].tokens;
  ASSERT_EQ(first, fake.greedy_oracle(p, 21));
  std::vector<int32_t> longer = p;
  longer.insert(longer.end(), first.begin(), first.end());
  const RequestId b = e.add_request(greedy(longer, 9));
  std::map<RequestId, Out> res;
  gather(res, e.step());
  const int64_t hits = e.cache().stats().prefix_hits;
  res = run(e, res);
  EXPECT_GE(hits, 24);  // the pages of 28 tokens, 24 of them before the last token's page
  EXPECT_EQ(res[b].tokens, fake.greedy_oracle(longer, 9));
  EXPECT_GT(fake.num_chained_passes, 0);
}

// Requests arriving mid-run (plain greedy ones may be admitted into the step begun ahead; sampled
// ones waiting keep the engine on the usual path until they run), in a roomy cache and in
// one where the pages would not fit a step ahead: the tokens of the same run without scheduling
// ahead, the greedy ones the oracle's.
TEST(ScheduleAhead, ArrivalsAndTightCachesGiveTheSameTokens) {
  for (int64_t kv_tokens : {int64_t(2048), int64_t(96)}) {
    SCOPED_TRACE(::testing::Message() << "kv_tokens " << kv_tokens);
    std::map<RequestId, Out> res[2];
    int64_t chained = 0;
    std::map<RequestId, std::vector<int32_t>> greedy_prompts;
    for (int32_t ahead : {0, 1}) {
      auto model = std::make_unique<FakeModel>(128);
      const FakeModel& fake = *model;
      Engine e(std::move(model), config(ahead, kv_tokens));
      for (int32_t i = 0; i < 8; ++i) {
        const std::vector<int32_t> p = prompt(4 + 3 * i, 20 + i);
        Request r = greedy(p, 12);
        const bool sampled = i % 3 == 2;  // (nearly flat at this temperature: not the argmax)
        if (sampled) {
          r.sampling.temperature = 20.f;
          r.seed = uint64_t(4 + i);
        }
        const RequestId id = e.add_request(r);
        if (!sampled && ahead == 1) greedy_prompts[id] = p;
        for (int32_t s = 0; s < 3 && e.has_work(); ++s) gather(res[ahead], e.step());
      }
      res[ahead] = run(e, res[ahead]);
      EXPECT_EQ(e.cache().stats().pages_used, 0);
      if (ahead == 1) {
        chained = fake.num_chained_passes;
        for (const auto& [id, p] : greedy_prompts)
          EXPECT_EQ(res[1][id].tokens, fake.greedy_oracle(p, 12)) << "request " << id;
      }
    }
    EXPECT_GT(chained, 0);
    ASSERT_EQ(res[0].size(), 8u);
    for (const auto& [id, a] : res[0]) EXPECT_EQ(res[1][id].tokens, a.tokens) << "request " << id;
  }
}

// Prompts longer than a step's token budget (32 here) run in chunks. A chunk before a prompt's last
// has no logit row, and the next chunk's tokens are known: it is begun while the chunk before runs,
// alone or beside other requests' decode rows. The same tokens as without, the oracle's, and a
// repeated prompt finds the chunks' pages in the prefix cache.
TEST(ScheduleAhead, PromptChunksAreBegunAhead) {
  std::map<RequestId, Out> res[2];
  std::vector<FakeModel::BegunPass> begun[2];
  int64_t hits[2] = {0, 0};
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 4; ++i) prompts.push_back(prompt(70 + 23 * i, 50 + i));
  for (int32_t ahead : {0, 1}) {
    auto model = std::make_unique<FakeModel>(128);
    const FakeModel& fake = *model;
    EngineConfig c = config(ahead);
    c.enable_prefix_cache = true;
    Engine e(std::move(model), c);
    const RequestId first = e.add_request(greedy(prompts[0], 6));  // 70 tokens: 32 + 32 + 6
    res[ahead] = run(e);
    EXPECT_EQ(res[ahead][first].tokens, fake.greedy_oracle(prompts[0], 6));
    begun[ahead] = fake.begun;
    // The others arrive while the ones before decode; the last repeats the first prompt.
    std::map<RequestId, std::vector<int32_t>> asked;
    for (int32_t i = 1; i <= 4; ++i) {
      const std::vector<int32_t>& p = prompts[size_t(i % 4)];
      asked[e.add_request(greedy(p, 9))] = p;
      for (int32_t k = 0; k < 2 && e.has_work(); ++k) gather(res[ahead], e.step());
    }
    res[ahead] = run(e, res[ahead]);
    hits[ahead] = e.cache().stats().prefix_hits;
    for (const auto& [id, p] : asked)
      EXPECT_EQ(res[ahead][id].tokens, fake.greedy_oracle(p, 9)) << "ahead " << ahead << " request "
                                                                 << id;
    EXPECT_EQ(e.cache().stats().pages_used, 0);
    if (ahead == 1) {
      int32_t chunks_ahead = 0;
      for (const FakeModel::BegunPass& b : fake.begun)
        if (b.rows_without_logits > 0 && b.ahead) ++chunks_ahead;
      EXPECT_GE(chunks_ahead, 4) << "prompt chunks begun while a pass ran";
    }
  }
  // The first request alone: its three chunks, then its decode steps.
  ASSERT_GE(begun[1].size(), 3u);
  EXPECT_EQ(begun[1][0].tokens, 32);
  EXPECT_EQ(begun[1][0].rows_without_logits, 1);
  EXPECT_FALSE(begun[1][0].ahead);
  EXPECT_EQ(begun[1][1].tokens, 32);
  EXPECT_TRUE(begun[1][1].ahead);  // the second chunk, begun while the first ran
  EXPECT_EQ(begun[1][2].tokens, 6);
  EXPECT_TRUE(begun[1][2].ahead);  // the last chunk (it has the logit row)
  EXPECT_TRUE(begun[0].empty());   // without: one pass at a time (forward_greedy)
  EXPECT_GE(hits[1], 64);          // the repeated 70-token prompt's whole pages, written
  EXPECT_EQ(hits[1], hits[0]);
  ASSERT_EQ(res[0].size(), res[1].size());
  for (const auto& [id, a] : res[0]) EXPECT_EQ(res[1][id].tokens, a.tokens) << "request " << id;
}

// Long prompts in a cache that holds about two of them, admitted on the pages they need now: chunks
// begun ahead only where the rest of their prompt fits (else the step is read first), preemptions
// in between. The same tokens as without, the oracle's, and nothing leaked.
TEST(ScheduleAhead, PromptChunksInATightCacheGiveTheSameTokens) {
  std::map<RequestId, Out> res[2];
  std::map<RequestId, std::vector<int32_t>> asked;
  int64_t preemptions[2] = {0, 0};
  int32_t chunks_ahead = 0;
  for (int32_t ahead : {0, 1}) {
    auto model = std::make_unique<FakeModel>(128);
    const FakeModel& fake = *model;
    EngineConfig c = config(ahead, 256);
    c.admission = AdmissionPolicy::immediate;  // admitted on today's pages: preemptions follow
    Engine e(std::move(model), c);
    for (int32_t i = 0; i < 5; ++i) {
      const std::vector<int32_t> p = prompt(60 + 17 * i, 70 + i);
      const RequestId id = e.add_request(greedy(p, 24));
      if (ahead == 1) asked[id] = p;
      gather(res[ahead], e.step());
    }
    res[ahead] = run(e, res[ahead]);
    preemptions[ahead] = e.metrics().preemptions;
    EXPECT_EQ(e.cache().stats().pages_used, 0) << "ahead " << ahead;
    if (ahead == 1) {
      for (const auto& [id, p] : asked)
        EXPECT_EQ(res[1][id].tokens, fake.greedy_oracle(p, 24)) << "request " << id;
      for (const FakeModel::BegunPass& b : fake.begun)
        chunks_ahead += b.ahead && b.rows_without_logits > 0;
    }
  }
  EXPECT_GT(preemptions[0], 0);  // the cache is tight
  EXPECT_GT(preemptions[1], 0);
  EXPECT_GT(chunks_ahead, 0);
  ASSERT_EQ(res[0].size(), 5u);
  for (const auto& [id, a] : res[0]) EXPECT_EQ(res[1][id].tokens, a.tokens) << "request " << id;
}

// A pass that fails while the next one is begun (the model's error from finish_greedy drops both):
// the requests of the step end with the error, nothing is leaked, and the engine serves the next
// requests with the oracle's tokens.
TEST(ScheduleAhead, AFailedPassEndsItsRequestsAndLeaksNothing) {
  auto model = std::make_unique<FakeModel>(128);
  FakeModel& fake = *model;
  Engine e(std::move(model), config(1));
  std::vector<RequestId> ids;
  for (int32_t i = 0; i < 3; ++i) ids.push_back(e.add_request(greedy(prompt(5 + i, i), 20)));
  std::map<RequestId, Out> res;
  for (int32_t i = 0; i < 5; ++i) gather(res, e.step());
  ASSERT_GT(fake.num_chained_passes, 0);
  fake.fail_on_forward = fake.num_forward_calls + 1;
  std::vector<RequestOutput> outs = e.step();
  gather(res, outs);
  ASSERT_EQ(outs.size(), 3u);
  for (const RequestOutput& o : outs) {
    EXPECT_TRUE(o.finished);
    EXPECT_NE(o.error.find("injected"), std::string::npos) << o.error;
  }
  EXPECT_FALSE(e.has_work());
  EXPECT_EQ(e.cache().stats().pages_used, 0);
  EXPECT_EQ(e.metrics().requests_cancelled, 3);
  for (RequestId id : ids) {  // what came out before the failure is the oracle's beginning
    const std::vector<int32_t>& got = res[id].tokens;
    const std::vector<int32_t> want =
        fake.greedy_oracle(prompt(5 + int32_t(id - ids[0]), int32_t(id - ids[0])), 20);
    ASSERT_LE(got.size(), want.size());
    EXPECT_EQ(got, std::vector<int32_t>(want.begin(), want.begin() + int64_t(got.size())));
  }
  const std::vector<int32_t> p = prompt(9, 7);
  const RequestId after = e.add_request(greedy(p, 15));
  EXPECT_EQ(run(e)[after].tokens, fake.greedy_oracle(p, 15));
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

// The CPU runner's default is not to schedule ahead (its passes do not overlap the host's work, and
// a dropped row would cost a whole row of compute).
TEST(ScheduleAhead, OffByDefaultWhereTheRunnerDoesNotOverlap) {
  auto model = std::make_unique<FakeModel>(128);
  const FakeModel& fake = *model;
  ASSERT_FALSE(fake.overlaps_passes());
  Engine e(std::move(model), config(-1));
  for (int32_t i = 0; i < 3; ++i) e.add_request(greedy(prompt(5, i), 10));
  run(e);
  EXPECT_EQ(fake.num_chained_passes, 0);
  EXPECT_GT(fake.num_greedy_calls, 0);
  EngineConfig bad = config(2);
  EXPECT_THROW(Engine(std::make_unique<FakeModel>(), bad), Error);
}

// Model's two-call greedy step on its own: the ids of two passes begun back to back, the second's
// tokens standing in for the first's ids, equal forward_greedy's one pass after the other; misuse
// is an error that names it.
TEST(ScheduleAhead, ModelDefaultChainsTwoPasses) {
  FakeModel plain(128), chained(128);
  const KvCacheConfig kc = pagedattn::testing::model_kv_config(plain.config(), 16, 4);
  KvCache c1(kc), c2(kc);
  const std::vector<int32_t> p = prompt(6, 1);
  auto batch_of = [](KvCache& cache, SeqId s, const std::vector<int32_t>& toks) {
    return make_step_batch(cache, {s}, {toks});
  };
  // One pass after the other.
  const SeqId s1 = c1.create_sequence();
  const std::vector<int32_t> a1 = plain.forward_greedy(batch_of(c1, s1, p), c1);
  const std::vector<int32_t> b1 = plain.forward_greedy(batch_of(c1, s1, {a1[0]}), c1);
  // Chained: the second pass begun before the first's ids are read.
  const SeqId s2 = c2.create_sequence();
  chained.begin_greedy(batch_of(c2, s2, p), c2);
  ForwardBatch next = batch_of(c2, s2, {chained_token(0)});
  chained.begin_greedy(next, c2);
  EXPECT_THROW(chained.begin_greedy(next, c2), Error);  // a third open pass
  EXPECT_EQ(chained.finish_greedy(), a1);
  EXPECT_EQ(chained.finish_greedy(), b1);
  EXPECT_THROW(chained.finish_greedy(), Error);  // none open
  // A stand-in with no pass before it, or naming a row that pass does not have (fresh sequences:
  // a pass refused leaves its reserved position unwritten).
  try {
    chained.begin_greedy(batch_of(c2, c2.create_sequence(), {chained_token(0)}), c2);
    ADD_FAILURE() << "a stand-in with no pass before it was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos) << e.what();
  }
  chained.begin_greedy(batch_of(c2, c2.create_sequence(), {3}), c2);
  EXPECT_THROW(chained.begin_greedy(batch_of(c2, c2.create_sequence(), {chained_token(1)}), c2),
               Error);
  EXPECT_EQ(chained.finish_greedy().size(), 1u);
  // A sampled pass's picks may be named only once its plan is given.
  chained.begin_sample(batch_of(c2, c2.create_sequence(), {5}), c2);
  EXPECT_THROW(chained.begin_greedy(batch_of(c2, c2.create_sequence(), {chained_token(0)}), c2),
               Error);
  SamplePlan plan;
  plan.rows.assign(1, RowSampling{});
  chained.pick_sampled(plan);
  const SeqId s3 = c2.create_sequence();
  chained.begin_greedy(batch_of(c2, s3, {chained_token(0)}), c2);
  const std::vector<TokenLogprobs> picked = chained.take_sampled();
  ASSERT_EQ(picked.size(), 1u);
  EXPECT_EQ(chained.finish_greedy().size(), 1u);
  EXPECT_EQ(c2.tokens(s3)[0], chained_token(0));  // the cache keeps what it was given
}

}  // namespace
}  // namespace pagedattn
