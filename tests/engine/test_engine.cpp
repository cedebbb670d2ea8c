// Engine tests with the fake model: outputs against an independent greedy
// oracle, batching, preemption, prefix caching, parallel sampling, stop
// conditions, cancellation, bad input.
#include <gtest/gtest.h>

#include <atomic>
#include <cmath>
#include <condition_variable>
#include <limits>
#include <map>
#include <memory>
#include <set>
#include <thread>
#include <vector>

#include "fake_model.h"
#include "pagedattn/async_engine.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"

using namespace pagedattn;
using pagedattn::fakes::FakeModel;


namespace {

struct Result {
  std::vector<std::vector<int32_t>> tokens;  // per sequence
  std::vector<std::string> text;
  std::vector<FinishReason> finish;
  RequestOutput last;
};

// Every test runs twice: with the engine's default (the fake model does not overlap its passes,
// so steps are read before the next is scheduled) and with scheduling ahead forced on
// (EngineConfig::schedule_ahead = 1: each greedy or sampled pass begun one step before the picks
// of the step before it are read, through Model's two-call defaults); every oracle must hold.
int32_t schedule_ahead = -1;  // small_config's, set by the fixtures
class EngineTest : public ::testing::TestWithParam<int32_t> {
 protected:
  void SetUp() override { schedule_ahead = GetParam(); }
};
class AsyncEngineTest : public EngineTest {};

EngineConfig small_config(int64_t kv_tokens, int32_t block = 4, int32_t budget = 32) {
  EngineConfig c;
  c.kv_cache_tokens = kv_tokens;
  c.page_size = block;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 16;
  c.log_startup = false;
  c.schedule_ahead = schedule_ahead;
  return c;
}

std::vector<int32_t> make_prompt(int32_t len, int32_t seed, int32_t vocab = 64) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(int32_t((seed * 131 + i * 17 + i * i) % vocab));
  return p;
}

Request greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.f;
  r.max_tokens = max_tokens;
  return r;
}

void gather(std::map<RequestId, Result>& res, const std::vector<RequestOutput>& outs) {
  for (const RequestOutput& o : outs) {
    Result& r = res[o.id];
    for (const SequenceOutput& s : o.seqs) {
      if (r.tokens.size() <= size_t(s.index)) {
        r.tokens.resize(size_t(s.index) + 1);
        r.text.resize(size_t(s.index) + 1);
        r.finish.resize(size_t(s.index) + 1, FinishReason::none);
      }
      auto& t = r.tokens[size_t(s.index)];
      t.insert(t.end(), s.new_tokens.begin(), s.new_tokens.end());
      r.text[size_t(s.index)] += s.new_text;
      if (s.finish != FinishReason::none) r.finish[size_t(s.index)] = s.finish;
    }
    r.last = o;
  }
}

// Runs the engine until every request finished (bounded), gathering outputs by
// request.
std::map<RequestId, Result> run_all(Engine& e, std::map<RequestId, Result> res = {},
                                    int32_t max_steps = 100000) {
  for (int32_t step = 0; e.has_work(); ++step) {
    if (step >= max_steps) ADD_FAILURE() << "engine did not finish in " << max_steps << " steps";
    if (step >= max_steps) break;
    gather(res, e.step());
  }
  return res;
}

// Six greedy requests growing to ~50 tokens each in 16 pages of 4, admitted on current use: growth
// preempts.
std::vector<std::vector<int32_t>> preempting_prompts() {
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 6; ++i) prompts.push_back(make_prompt(10 + i, 40 + i));
  return prompts;
}

EngineConfig preempting_config() {
  EngineConfig cfg = small_config(64, 4, 64);
  cfg.watermark_pages = 0;
  cfg.admission = AdmissionPolicy::immediate;
  return cfg;
}

}  // namespace

TEST_P(EngineTest, GreedyMatchesOracle) {
  auto model = std::make_unique<FakeModel>();
  const FakeModel& fake = *model;
  Engine e(std::move(model), small_config(1024));
  auto prompt = make_prompt(11, 3);
  RequestId id = e.add_request(greedy(prompt, 20));
  auto res = run_all(e);
  ASSERT_EQ(res[id].tokens.size(), 1u);
  EXPECT_EQ(res[id].tokens[0], fake.greedy_oracle(prompt, 20));
  EXPECT_EQ(res[id].finish[0], FinishReason::length);
  EXPECT_TRUE(res[id].last.finished);
  EXPECT_EQ(res[id].last.prompt_tokens, 11);
  EXPECT_EQ(res[id].last.completion_tokens, 20);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST_P(EngineTest, SixteenConcurrentRequestsEqualOneByOne) {
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 16; ++i) prompts.push_back(make_prompt(5 + 3 * i, i));
  std::vector<std::vector<int32_t>> alone;
  for (int32_t i = 0; i < 16; ++i) {
    Engine e(std::make_unique<FakeModel>(), small_config(4096));
    RequestId id = e.add_request(greedy(prompts[size_t(i)], 12 + i));
    alone.push_back(run_all(e)[id].tokens.at(0));
  }
  auto model = std::make_unique<FakeModel>();
  FakeModel& fake = *model;
  Engine e(std::move(model), small_config(4096, 4, 24));  // small budget: chunked, mixed batches
  std::vector<RequestId> ids;
  for (int32_t i = 0; i < 16; ++i) ids.push_back(e.add_request(greedy(prompts[size_t(i)], 12 + i)));
  auto res = run_all(e);
  int32_t max_seqs = 0;
  for (int32_t s : fake.batch_seqs) max_seqs = std::max(max_seqs, s);
  EXPECT_GE(max_seqs, 8);  // really batched
  for (int32_t i = 0; i < 16; ++i) {
    EXPECT_EQ(res[ids[size_t(i)]].tokens.at(0), alone[size_t(i)]) << "request " << i;
    EXPECT_EQ(alone[size_t(i)], fake.greedy_oracle(prompts[size_t(i)], 12 + i));
  }
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST_P(EngineTest, PreemptionAndRecomputeGiveIdenticalOutput) {
  const auto prompts = preempting_prompts();
  const EngineConfig cfg = preempting_config();
  auto model = std::make_unique<FakeModel>();
  const FakeModel& fake = *model;
  Engine e(std::move(model), cfg);
  std::vector<RequestId> ids;
  for (auto& p : prompts) ids.push_back(e.add_request(greedy(p, 40)));
  auto res = run_all(e);
  const EngineMetrics m = e.metrics();
  EXPECT_GT(m.preemptions, 0);
  EXPECT_EQ(m.preemptions_recompute, m.preemptions);
  EXPECT_GT(m.recomputed_tokens, 0);
  EXPECT_EQ(m.recomputed_tokens,
            m.preempted_computed_tokens - m.resumed_prefix_hit_tokens);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(res[ids[i]].tokens.at(0), fake.greedy_oracle(prompts[i], 40)) << "request " << i;
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST_P(EngineTest, PreemptionBySwapGivesIdenticalOutputAndRecomputesNothing) {
  // The workload above with swap space: the preempted sequences' pages go to host memory and come
  // back (the fake model reads every position back through the block table, so a page restored
  // wrong changes the output or throws). auto picks swap too: on the CPU a copy of the pages costs
  // far less than computing the tokens again.
  for (PreemptionMode mode : {PreemptionMode::swap, PreemptionMode::cheaper}) {
    const auto prompts = preempting_prompts();
    EngineConfig cfg = preempting_config();
    cfg.preemption = mode;
    cfg.swap_space_mib = 1;
    auto model = std::make_unique<FakeModel>();
    const FakeModel& fake = *model;
    Engine e(std::move(model), cfg);
    std::vector<RequestId> ids;
    for (auto& p : prompts) ids.push_back(e.add_request(greedy(p, 40)));
    int32_t most_swapped = 0;
    std::map<RequestId, Result> res;
    for (int32_t step = 0; e.has_work() && step < 10000; ++step) {
      gather(res, e.step());
      most_swapped = std::max(most_swapped, e.metrics().num_swapped);
    }
    const EngineMetrics m = e.metrics();
    EXPECT_GT(m.preemptions, 0);
    EXPECT_EQ(m.preemptions_swap, m.preemptions);
    EXPECT_EQ(m.preemptions_recompute, 0);
    EXPECT_EQ(m.recomputed_tokens, 0);
    EXPECT_EQ(m.swapped_tokens, m.preempted_computed_tokens);
    EXPECT_GT(m.swap_out_bytes, 0);
    EXPECT_GE(most_swapped, 1);
    // Everything came back: the bytes in equal the bytes out, nothing is left in host memory.
    EXPECT_EQ(m.swap_in_bytes, m.swap_out_bytes);
    EXPECT_EQ(m.num_swapped, 0);
    EXPECT_EQ(m.swap_used_bytes, 0);
    EXPECT_EQ(m.swap_space_bytes, 1 << 20);
    for (size_t i = 0; i < prompts.size(); ++i)
      EXPECT_EQ(res[ids[i]].tokens.at(0), fake.greedy_oracle(prompts[i], 40)) << "request " << i;
    EXPECT_EQ(e.cache().stats().pages_used, 0);
  }
}

TEST_P(EngineTest, SwapSpaceTooSmallForASequenceRecomputesIt) {
  // 600 bytes of swap space: a sequence of 10+ tokens takes 3 pages x 2 layers x K, V x 64 bytes
  // = 768, so every preemption falls back to recompute; outputs stay the oracle's.
  const auto prompts = preempting_prompts();
  EngineConfig cfg = preempting_config();
  cfg.preemption = PreemptionMode::swap;
  cfg.swap_space_mib = 600.0 / (1 << 20);
  auto model = std::make_unique<FakeModel>();
  const FakeModel& fake = *model;
  Engine e(std::move(model), cfg);
  std::vector<RequestId> ids;
  for (auto& p : prompts) ids.push_back(e.add_request(greedy(p, 40)));
  auto res = run_all(e);
  const EngineMetrics m = e.metrics();
  EXPECT_GT(m.preemptions, 0);
  EXPECT_EQ(m.preemptions_swap, 0);
  EXPECT_EQ(m.preemptions_recompute, m.preemptions);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(res[ids[i]].tokens.at(0), fake.greedy_oracle(prompts[i], 40)) << "request " << i;
}

TEST_P(EngineTest, CancellingASwappedRequestFreesItsHostMemory) {
  const auto prompts = preempting_prompts();
  EngineConfig cfg = preempting_config();
  cfg.preemption = PreemptionMode::swap;
  cfg.swap_space_mib = 1;
  Engine e(std::make_unique<FakeModel>(), cfg);
  std::vector<RequestId> ids;
  for (auto& p : prompts) ids.push_back(e.add_request(greedy(p, 40)));
  for (int32_t step = 0; e.has_work() && e.metrics().num_swapped == 0 && step < 1000; ++step)
    e.step();
  ASSERT_GT(e.metrics().num_swapped, 0) << "nothing was swapped out";
  EXPECT_GT(e.metrics().swap_used_bytes, 0);
  for (RequestId id : ids) e.cancel(id);
  for (int32_t step = 0; e.has_work() && step < 100; ++step) e.step();
  EXPECT_FALSE(e.has_work());
  EXPECT_EQ(e.metrics().num_swapped, 0);
  EXPECT_EQ(e.metrics().swap_used_bytes, 0);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST_P(EngineTest, SwapSpaceIsValidated) {
  for (double bad : {-2.0, std::nan(""), std::numeric_limits<double>::infinity()}) {
    EngineConfig cfg = small_config(64);
    cfg.swap_space_mib = bad;
    try {
      Engine e(std::make_unique<FakeModel>(), cfg);
      ADD_FAILURE() << "swap_space_mib " << bad << " was accepted";
    } catch (const Error& err) {
      EXPECT_NE(std::string(err.what()).find("swap_space_mib"), std::string::npos) << err.what();
    }
  }
  // The default: none on the CPU.
  Engine e(std::make_unique<FakeModel>(), small_config(64));
  EXPECT_EQ(e.metrics().swap_space_bytes, 0);
  EXPECT_THROW(parse_preemption_mode("sometimes"), Error);
  EXPECT_EQ(parse_preemption_mode("auto"), PreemptionMode::cheaper);
}

TEST_P(EngineTest, LookaheadAdmissionAvoidsPreemptionWhenLengthsAreKnown) {
  // The workload above with EOS ignored (each request ends exactly at max_tokens): the default
  // admission foresees the growth and never preempts; outputs stay the oracle's.
  std::vector<std::vector<int32_t>> prompts;
  for (int32_t i = 0; i < 6; ++i) prompts.push_back(make_prompt(10 + i, 40 + i));
  auto model = std::make_unique<FakeModel>();
  FakeModel& fake = *model;
  Engine e(std::move(model), small_config(128, 4, 64));  // 32 pages: two at a time
  std::vector<RequestId> ids;
  for (auto& p : prompts) {
    Request r = greedy(p, 40);
    r.ignore_eos = true;
    ids.push_back(e.add_request(r));
  }
  auto res = run_all(e);
  const EngineMetrics m = e.metrics();
  EXPECT_EQ(m.preemptions, 0);
  EXPECT_EQ(m.recomputed_tokens, 0);
  EXPECT_GT(m.admission_stalls, 0);
  int32_t max_seqs = 0;
  for (int32_t s : fake.batch_seqs) max_seqs = std::max(max_seqs, s);
  // 13 or 14 pages each at the end: two run together in 32 pages, the others wait their turn.
  EXPECT_GE(max_seqs, 2);
  for (size_t i = 0; i < prompts.size(); ++i)
    EXPECT_EQ(res[ids[i]].tokens.at(0), fake.greedy_oracle(prompts[i], 40)) << "request " << i;
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST_P(EngineTest, PrefixCacheOnAndOffGiveTheSameOutput) {
  std::vector<int32_t> shared = make_prompt(40, 7);
  auto run = [&](bool prefix) {
    EngineConfig cfg = small_config(2048);
    cfg.enable_prefix_cache = prefix;
    Engine e(std::make_unique<FakeModel>(), cfg);
    std::vector<std::vector<int32_t>> outs;
    for (int32_t round = 0; round < 2; ++round) {
      std::vector<RequestId> ids;
      for (int32_t i = 0; i < 4; ++i) {
        auto p = shared;
        for (int32_t j = 0; j <= i; ++j) p.push_back((i * 5 + j) % 64);
        ids.push_back(e.add_request(greedy(p, 10)));
      }
      auto res = run_all(e);
      for (RequestId id : ids) outs.push_back(res[id].tokens.at(0));
    }
    EXPECT_EQ(e.cache().stats().pages_used, 0);
    return std::make_pair(outs, e.metrics());
  };
  auto [with, m_with] = run(true);
  auto [without, m_without] = run(false);
  EXPECT_EQ(with, without);
  EXPECT_GT(m_with.prefix_hit_tokens, 0);
  EXPECT_EQ(m_without.prefix_hit_tokens, 0);
  EXPECT_GT(m_with.prefix_hit_rate(), 0.5);
}

TEST_P(EngineTest, CacheSaltSeparatesTenants) {
  Engine e(std::make_unique<FakeModel>(), small_config(2048));
  auto p = make_prompt(33, 9);
  Request a = greedy(p, 4);
  a.cache_salt = "tenant-a";
  RequestId ia = e.add_request(a);
  auto r1 = run_all(e);
  Request b = greedy(p, 4);
  b.cache_salt = "tenant-b";
  RequestId ib = e.add_request(b);
  auto r2 = run_all(e);
  EXPECT_EQ(r2[ib].last.cached_tokens, 0);
  EXPECT_EQ(r1[ia].tokens, r2[ib].tokens);
  Request c = greedy(p, 4);
  c.cache_salt = "tenant-a";
  RequestId ic = e.add_request(c);
  auto r3 = run_all(e);
  EXPECT_EQ(r3[ic].last.cached_tokens, 32);
  EXPECT_EQ(r3[ic].tokens, r1[ia].tokens);
}

TEST_P(EngineTest, ParallelSamplingSharesPromptPages) {
  EngineConfig cfg = small_config(4096, 16, 256);
  Engine e(std::make_unique<FakeModel>(), cfg);
  Request r;
  r.prompt = make_prompt(32, 5);  // exactly 2 pages
  r.n = 4;
  r.seed = 1234;
  r.max_tokens = 8;
  RequestId id = e.add_request(r);
  std::map<RequestId, Result> res;
  gather(res, e.step());                       // prefill + fork + first token of each sequence
  EXPECT_EQ(e.cache().stats().pages_used, 2);  // shared, not copied
  EXPECT_EQ(e.cache().stats().num_sequences, 4);
  gather(res, e.step());  // each sequence writes position 32: one new page each
  EXPECT_EQ(e.cache().stats().pages_used, 2 + 4);
  res = run_all(e, res);
  ASSERT_EQ(res[id].tokens.size(), 4u);
  std::set<std::vector<int32_t>> distinct;
  for (auto& t : res[id].tokens) {
    EXPECT_EQ(t.size(), 8u);
    distinct.insert(t);
  }
  EXPECT_GE(distinct.size(), 2u);  // independent samples
  EXPECT_EQ(res[id].last.completion_tokens, 4 * 8);
  EXPECT_EQ(e.cache().stats().pages_used, 0);

  // Same seed, same samples.
  Engine e2(std::make_unique<FakeModel>(), cfg);
  RequestId id2 = e2.add_request(r);
  EXPECT_EQ(run_all(e2)[id2].tokens, res[id].tokens);
}

TEST_P(EngineTest, ParallelSamplingWithPartialTailPageCopiesOnlyTheTail) {
  Engine e(std::make_unique<FakeModel>(), small_config(4096, 16, 256));
  Request r;
  r.prompt = make_prompt(40, 6);  // 2 full pages + a tail of 8
  r.n = 4;
  r.seed = 1;
  r.max_tokens = 4;
  e.add_request(r);
  e.step();
  EXPECT_EQ(e.cache().stats().pages_used, 3);
  e.step();
  // The full pages stay shared; at most one tail copy per extra sequence.
  EXPECT_LE(e.cache().stats().pages_used, 3 + 3);
  EXPECT_GE(e.cache().stats().pages_used, 3 + 2);
  run_all(e);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST_P(EngineTest, StopsOnEosStopTokenAndStopString) {
  auto model = std::make_unique<FakeModel>(128, std::vector<int32_t>{0});
  model->eos_every = 9;  // the 9th position of every history prefers EOS
  const FakeModel& fake = *model;
  Engine e(std::move(model), small_config(2048), fakes::fake_decode);
  auto prompt = make_prompt(5, 2, 128);
  for (auto& t : prompt) t = 1 + t % 127;
  RequestId a = e.add_request(greedy(prompt, 50));
  auto res = run_all(e);
  auto expect = fake.greedy_oracle(prompt, 50);
  ASSERT_EQ(expect.back(), 0);
  EXPECT_EQ(res[a].tokens[0], expect);
  EXPECT_EQ(res[a].finish[0], FinishReason::stop);
  // The EOS token is not part of the text.
  auto text_ids = expect;
  text_ids.pop_back();
  EXPECT_EQ(res[a].text[0], fakes::fake_decode(text_ids));

  // ignore_eos runs to max_tokens.
  Request b = greedy(prompt, 12);
  b.ignore_eos = true;
  RequestId ib = e.add_request(b);
  res = run_all(e);
  EXPECT_EQ(res[ib].tokens[0].size(), 12u);
  EXPECT_EQ(res[ib].finish[0], FinishReason::length);

  // A stop token id.
  Request c = greedy(prompt, 50);
  c.sampling.stop_token_ids = {expect[1]};
  RequestId ic = e.add_request(c);
  res = run_all(e);
  EXPECT_EQ(res[ic].tokens[0], std::vector<int32_t>(expect.begin(), expect.begin() + 2));
  EXPECT_EQ(res[ic].finish[0], FinishReason::stop);

  // A stop string: two characters of the expected text; the output ends before
  // it.
  const std::string full = fakes::fake_decode(text_ids);
  Request d = greedy(prompt, 50);
  d.sampling.stop = {full.substr(3, 2)};
  RequestId id = e.add_request(d);
  res = run_all(e);
  const size_t cut = full.find(full.substr(3, 2));
  EXPECT_EQ(res[id].text[0], full.substr(0, cut));
  EXPECT_EQ(res[id].finish[0], FinishReason::stop);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
  // Every step was a greedy one (Model::forward_greedy): eos, stop ids and strings work there.
  EXPECT_EQ(fake.num_greedy_calls, fake.num_forward_calls);
}

// A step takes Model::forward_greedy only when every sequence it samples is plain greedy. Greedy
// requests batched with others (temperature, repetition penalty, n > 1, best_of, beam search) get
// the tokens they get alone, as do the others; the batch takes both paths as its mix changes.
TEST_P(EngineTest, GreedyAndSampledRequestsBatchedEqualAlone) {
  std::vector<Request> reqs;
  for (int32_t i = 0; i < 3; ++i) reqs.push_back(greedy(make_prompt(3 + 8 * i, i + 1), 20));
  const size_t num_greedy = reqs.size();
  Request t = greedy(make_prompt(9, 4), 6);
  t.sampling.temperature = 0.9f;
  t.seed = 11;
  reqs.push_back(t);
  Request rp = greedy(make_prompt(12, 5), 6);
  rp.sampling.repetition_penalty = 1.3f;
  reqs.push_back(rp);
  Request n2 = greedy(make_prompt(6, 6), 5);
  n2.n = 2;
  reqs.push_back(n2);
  Request bo = greedy(make_prompt(8, 7), 5);
  bo.sampling.temperature = 1.f;
  bo.best_of = 3;
  bo.seed = 3;
  reqs.push_back(bo);
  Request bs = greedy(make_prompt(10, 8), 5);
  bs.use_beam_search = true;
  bs.beam_width = 2;
  reqs.push_back(bs);

  std::vector<std::vector<std::vector<int32_t>>> alone;
  for (size_t i = 0; i < reqs.size(); ++i) {
    auto model = std::make_unique<FakeModel>();
    const FakeModel& fake = *model;
    Engine e(std::move(model), small_config(2048));
    const RequestId id = e.add_request(reqs[i]);
    alone.push_back(run_all(e)[id].tokens);
    if (i < num_greedy) {
      EXPECT_EQ(alone[i], std::vector<std::vector<int32_t>>{fake.greedy_oracle(reqs[i].prompt, 20)})
          << "request " << i;
      EXPECT_EQ(fake.num_greedy_calls, fake.num_forward_calls) << "request " << i;
    } else {  // every step samples this request, so none may skip its logits
      EXPECT_EQ(fake.num_greedy_calls, 0) << "request " << i;
    }
  }

  auto model = std::make_unique<FakeModel>();
  const FakeModel& fake = *model;
  Engine e(std::move(model), small_config(2048));
  std::vector<RequestId> ids;
  for (const Request& r : reqs) ids.push_back(e.add_request(r));
  auto res = run_all(e);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(res[ids[i]].tokens, alone[i]) << "request " << i;
  // Some steps sample only greedy sequences (the greedy requests outlive the others), some not.
  EXPECT_GT(fake.num_greedy_calls, 0);
  EXPECT_LT(fake.num_greedy_calls, fake.num_forward_calls);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST_P(EngineTest, CancelFreesPagesAtOnce) {
  Engine e(std::make_unique<FakeModel>(), small_config(2048));
  RequestId a = e.add_request(greedy(make_prompt(30, 1), 100));
  RequestId b = e.add_request(greedy(make_prompt(20, 2), 5));
  e.step();
  e.step();
  ASSERT_GT(e.cache().stats().pages_used, 0);
  e.cancel(a);
  e.cancel(b);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
  auto outs = e.step();
  ASSERT_EQ(outs.size(), 2u);
  for (auto& o : outs) {
    EXPECT_TRUE(o.finished);
    ASSERT_FALSE(o.seqs.empty());
    EXPECT_EQ(o.seqs.back().finish, FinishReason::cancelled);
  }
  EXPECT_FALSE(e.has_work());
  e.cancel(a);  // unknown by now: ignored
  EXPECT_FALSE(e.has_work());
  EXPECT_EQ(e.metrics().requests_cancelled, 2);
}

// A request of n sequences cancelled before it forks (queued, or in its prefill) reports every
// index finished, once: its siblings do not exist yet, and a client waits for each index.
TEST_P(EngineTest, CancelBeforeTheForkFinishesEveryIndex) {
  Engine e(std::make_unique<FakeModel>(), small_config(2048));
  Request r = greedy(make_prompt(40, 3), 50);
  r.n = 4;
  r.sampling.temperature = 1.f;
  RequestId prefilling = e.add_request(r);
  RequestId queued = e.add_request(r);
  RequestId forked = e.add_request(greedy(make_prompt(8, 4), 50));
  e.step();  // the 32-token budget: 32 of the first prompt's 40, the others still waiting
  e.cancel(prefilling);
  e.cancel(queued);
  std::map<RequestId, Result> res;
  std::map<RequestId, int> finishes;  // finish reports, counted over the outputs
  while (e.has_work()) {
    const std::vector<RequestOutput> outs = e.step();
    for (const RequestOutput& o : outs)
      for (const SequenceOutput& so : o.seqs) finishes[o.id] += so.finish != FinishReason::none;
    gather(res, outs);
    e.cancel(forked);
  }
  for (RequestId id : {prefilling, queued}) {
    ASSERT_EQ(res[id].finish.size(), 4u) << id;
    for (FinishReason f : res[id].finish) EXPECT_EQ(f, FinishReason::cancelled) << id;
    EXPECT_EQ(finishes[id], 4) << id;
    EXPECT_TRUE(res[id].last.finished);
  }
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

TEST_P(EngineTest, BadRequestsThrowAndQueueNothing) {
  Engine e(std::make_unique<FakeModel>(64, std::vector<int32_t>{}, 64), small_config(2048));
  auto expect_error = [&](Request r, const std::string& what) {
    try {
      e.add_request(std::move(r));
      ADD_FAILURE() << "expected Error containing " << what;
    } catch (const Error& err) {
      const std::string msg = err.what();
      EXPECT_NE(msg.find(what), std::string::npos) << msg;
    }
  };
  expect_error(greedy({}, 4), "add_request: prompt is empty");
  expect_error(greedy({1, 64}, 4), "prompt[1]");
  expect_error(greedy({1, -1}, 4), "prompt[1]");
  Request r = greedy({1, 2}, 4);
  r.n = 0;
  expect_error(r, "add_request: n");
  r.n = 17;
  expect_error(r, "add_request: n");
  expect_error(greedy({1, 2}, 0), "add_request: max_tokens");
  expect_error(greedy(make_prompt(64, 1), 4), "max_model_len");
  r = greedy({1, 2}, 4);
  r.sampling.top_p = 0.f;
  expect_error(r, "top_p");
  r = greedy({1, 2}, 4);
  r.sampling.stop = {"x"};
  expect_error(r, "stop strings need a tokenizer");
  EXPECT_FALSE(e.has_work());
  EXPECT_EQ(e.num_active_requests(), 0);
}

TEST_P(EngineTest, KvBudgetFromMemoryAndTokens) {
  ModelConfig mc = FakeModel().config();  // 2 layers x 2 heads x 4 dims: 128 bytes/token at f32
  EngineConfig c;
  c.page_size = 16;
  c.kv_cache_memory_mib = 1;
  EXPECT_EQ(kv_num_pages(c, mc, DType::f32), 1024 * 1024 / (128 * 16));
  EXPECT_EQ(kv_num_pages(c, mc, DType::f16), 2 * 1024 * 1024 / (128 * 16));
  c.kv_cache_tokens = 100;
  EXPECT_EQ(kv_num_pages(c, mc, DType::f32), 7);
  c.kv_cache_tokens = -1;
  EXPECT_THROW(kv_num_pages(c, mc, DType::f32), Error);
  c.kv_cache_tokens = 0;
  c.page_size = 0;
  EXPECT_THROW(kv_num_pages(c, mc, DType::f32), Error);
  EXPECT_THROW(resolve_kv_dtype("int3"), Error);
  EXPECT_EQ(resolve_kv_dtype("auto"), DType::f32);
  EngineConfig fp8 = small_config(64);
  fp8.kv_cache_dtype = "fp8";
  EXPECT_THROW(Engine(std::make_unique<FakeModel>(), fp8), Error);  // no calibration tokens
  fp8.kv_calibration_tokens = {1, 2, 3};
  EXPECT_THROW(Engine(std::make_unique<FakeModel>(), fp8), Error);  // the fake cannot calibrate
}

TEST_P(EngineTest, MetricsCountTokensAndLatencies) {
  Engine e(std::make_unique<FakeModel>(), small_config(2048));
  e.add_request(greedy(make_prompt(10, 1), 6));
  e.add_request(greedy(make_prompt(12, 2), 6));
  run_all(e);
  EngineMetrics m = e.metrics();
  EXPECT_EQ(m.prompt_tokens, 22);
  EXPECT_EQ(m.generation_tokens, 12);
  EXPECT_EQ(m.requests_finished, 2);
  EXPECT_EQ(m.ttft_s.count, 2);
  EXPECT_EQ(m.itl_s.count, 10);
  EXPECT_EQ(m.num_running + m.num_waiting, 0);
  EXPECT_EQ(m.pages_used, 0);
  EXPECT_EQ(m.pages_free + m.pages_cached, m.pages_total);
}

TEST_P(AsyncEngineTest, ConcurrentSubmittersGetOracleOutputs) {
  auto model = std::make_unique<FakeModel>();
  const FakeModel* fake = model.get();
  AsyncEngine ae(std::make_unique<Engine>(std::move(model), small_config(4096, 4, 32)));
  std::mutex mu;
  std::condition_variable cv;
  std::map<RequestId, std::vector<int32_t>> got;
  std::map<RequestId, std::vector<int32_t>> prompts;
  int32_t done = 0;
  std::vector<std::thread> threads;
  for (int32_t t = 0; t < 4; ++t) {
    threads.emplace_back([&, t] {
      for (int32_t i = 0; i < 4; ++i) {
        auto p = make_prompt(6 + t + i, t * 10 + i);
        RequestId id = ae.submit(greedy(p, 10), [&](const RequestOutput& o) {
          std::lock_guard<std::mutex> lk(mu);
          for (auto& s : o.seqs)
            got[o.id].insert(got[o.id].end(), s.new_tokens.begin(), s.new_tokens.end());
          if (o.finished) {
            ++done;
            cv.notify_all();
          }
        });
        std::lock_guard<std::mutex> lk(mu);
        prompts[id] = p;
      }
    });
  }
  for (auto& th : threads) th.join();
  {
    std::unique_lock<std::mutex> lk(mu);
    ASSERT_TRUE(cv.wait_for(lk, std::chrono::seconds(30), [&] { return done == 16; }));
  }
  for (auto& [id, p] : prompts) EXPECT_EQ(got[id], fake->greedy_oracle(p, 10));
  EXPECT_THROW(ae.submit(greedy({}, 3), nullptr), Error);
  // A long request is cancelled by stop(): its callback still gets a final
  // output.
  std::atomic<bool> final_seen{false};
  ae.submit(greedy(make_prompt(5, 1), 100000 / 100), [&](const RequestOutput& o) {
    if (o.finished) final_seen = true;
  });
  ae.stop();
  EXPECT_TRUE(final_seen.load());
  EXPECT_EQ(ae.engine().cache().stats().pages_used, 0);
  EXPECT_THROW(ae.submit(greedy({1}, 3), nullptr), Error);
}

TEST_P(EngineTest, LongRequestIsNotStarvedByAStreamOfShortOnes) {
  auto model = std::make_unique<FakeModel>();
  const FakeModel& fake = *model;
  EngineConfig cfg = small_config(256, 4, 16);  // 64 pages, 16 tokens per step
  Engine e(std::move(model), cfg);
  auto long_prompt = make_prompt(120, 77);
  RequestId long_id = e.add_request(greedy(long_prompt, 20));
  std::map<RequestId, Result> res;
  int32_t steps = 0;
  // Two new short requests every step, for as long as the long one runs.
  while (!res.count(long_id) || !res[long_id].last.finished) {
    for (int32_t k = 0; k < 2; ++k) e.add_request(greedy(make_prompt(6, steps * 2 + k), 3));
    gather(res, e.step());
    ASSERT_LT(++steps, 400) << "the long request starved";
  }
  EXPECT_EQ(res[long_id].tokens.at(0), fake.greedy_oracle(long_prompt, 20));
  run_all(e);
  EXPECT_EQ(e.cache().stats().pages_used, 0);
}

INSTANTIATE_TEST_SUITE_P(Default, EngineTest, ::testing::Values(-1));
INSTANTIATE_TEST_SUITE_P(ScheduledAhead, EngineTest, ::testing::Values(1));
INSTANTIATE_TEST_SUITE_P(Default, AsyncEngineTest, ::testing::Values(-1));
INSTANTIATE_TEST_SUITE_P(ScheduledAhead, AsyncEngineTest, ::testing::Values(1));
