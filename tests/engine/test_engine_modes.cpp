// The engine's offline and logits modes: Engine::generate, Request::return_logits with teacher
// forcing (forced_tokens), and the step policies that bench model uses (prefill_first,
// device_sampling off). The oracle: the same requests through the engine's default path.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <vector>

#include "fake_model.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"
#include "pagedattn/sample_plan.h"
#include "pagedattn/sampling.h"

namespace pagedattn {
namespace {

using fakes::FakeModel;

EngineConfig config(int64_t kv_tokens, int32_t budget = 32) {
  EngineConfig c;
  c.kv_cache_tokens = kv_tokens;
  c.page_size = 4;
  c.max_num_batched_tokens = budget;
  c.max_num_seqs = 16;
  c.log_startup = false;
  return c;
}

std::vector<int32_t> prompt(int32_t len, int32_t seed) {
  std::vector<int32_t> p;
  for (int32_t i = 0; i < len; ++i) p.push_back(int32_t((seed * 131 + i * 17 + i * i) % 64));
  return p;
}

Request greedy(std::vector<int32_t> ids, int32_t max_tokens) {
  Request r;
  r.prompt = std::move(ids);
  r.sampling.temperature = 0.f;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

TEST(EngineModes, GenerateReturnsWholeOutputsInOrder) {
  std::vector<Request> reqs;
  for (int32_t i = 0; i < 5; ++i) reqs.push_back(greedy(prompt(7 + 3 * i, i), 4 + i));
  std::vector<std::vector<int32_t>> alone;
  for (const Request& r : reqs) {
    Engine e(std::make_unique<FakeModel>(), config(1024));
    const RequestId id = e.add_request(r);
    std::vector<int32_t> toks;
    while (e.has_work())
      for (const RequestOutput& o : e.step())
        if (o.id == id)
          for (const SequenceOutput& s : o.seqs)
            toks.insert(toks.end(), s.new_tokens.begin(), s.new_tokens.end());
    alone.push_back(toks);
  }
  Engine e(std::make_unique<FakeModel>(), config(1024, 16));  // chunked, mixed steps
  const std::vector<RequestOutput> outs = e.generate(reqs);
  ASSERT_EQ(outs.size(), reqs.size());
  for (size_t i = 0; i < outs.size(); ++i) {
    EXPECT_TRUE(outs[i].finished);
    ASSERT_EQ(outs[i].seqs.size(), 1u);
    EXPECT_EQ(outs[i].seqs[0].new_tokens, alone[i]) << "request " << i;
    EXPECT_EQ(int32_t(outs[i].seqs[0].new_tokens.size()), reqs[i].max_tokens);
    EXPECT_EQ(outs[i].seqs[0].finish, FinishReason::length);
  }
  EXPECT_EQ(e.num_active_requests(), 0);
}

TEST(EngineModes, GenerateValidatesEveryRequestBeforeQueuingAny) {
  Engine e(std::make_unique<FakeModel>(), config(1024));
  std::vector<Request> reqs = {greedy(prompt(5, 1), 3), greedy({}, 3)};
  EXPECT_THROW(e.generate(reqs), Error);
  EXPECT_EQ(e.num_active_requests(), 0);
  EXPECT_FALSE(e.has_work());
  e.add_request(greedy(prompt(5, 1), 3));
  EXPECT_THROW(e.generate({greedy(prompt(5, 2), 3)}), Error);  // one in flight
}

TEST(EngineModes, ReturnLogitsGivesARowPerPositionWhateverTheChunks) {
  const std::vector<int32_t> p = prompt(13, 3);
  Request r = greedy(p, 5);
  r.return_logits = true;
  std::vector<std::vector<float>> runs;
  std::vector<int32_t> tokens;
  for (int32_t budget : {64, 5, 1}) {
    Engine e(std::make_unique<FakeModel>(), config(1024, budget));
    const std::vector<RequestOutput> outs = e.generate({r});
    ASSERT_EQ(outs.size(), 1u);
    const SequenceOutput& s = outs[0].seqs.at(0);
    // 13 prompt rows and one per generated token that was fed back (4 of the 5).
    ASSERT_EQ(s.logits.size(), size_t(13 + 4) * 64) << "budget " << budget;
    runs.push_back(s.logits);
    tokens = s.new_tokens;
  }
  EXPECT_EQ(runs[0], runs[1]);
  EXPECT_EQ(runs[0], runs[2]);
  // Each generated token is the argmax of the row before it (greedy).
  for (size_t i = 0; i < tokens.size(); ++i) {
    std::span<const float> row(runs[0].data() + (12 + i) * 64, 64);
    EXPECT_EQ(argmax(row), tokens[i]) << "token " << i;
  }
  // The same rows without return_logits give the same tokens (and the device-greedy path).
  Engine e(std::make_unique<FakeModel>(), config(1024));
  EXPECT_EQ(e.generate({greedy(p, 5)})[0].seqs.at(0).new_tokens, tokens);
}

TEST(EngineModes, ForcedTokensGiveTheRowsOfTheLongerPrompt) {
  const std::vector<int32_t> p = prompt(9, 4);
  const std::vector<int32_t> forced = {5, 17, 33};
  Request r = greedy(p, 4);
  r.return_logits = true;
  r.forced_tokens = forced;
  Engine e(std::make_unique<FakeModel>(), config(1024, 4));
  const SequenceOutput s = e.generate({r})[0].seqs.at(0);
  ASSERT_EQ(s.new_tokens.size(), 4u);
  EXPECT_EQ(std::vector<int32_t>(s.new_tokens.begin(), s.new_tokens.begin() + 3), forced);
  // Oracle: the prompt with the forced tokens appended, its prompt rows.
  std::vector<int32_t> longer = p;
  longer.insert(longer.end(), forced.begin(), forced.end());
  Request o = greedy(longer, 1);
  o.return_logits = true;
  Engine e2(std::make_unique<FakeModel>(), config(1024));
  const SequenceOutput want = e2.generate({o})[0].seqs.at(0);
  EXPECT_EQ(s.logits, want.logits);
  EXPECT_EQ(s.new_tokens.back(), want.new_tokens.at(0));
}

TEST(EngineModes, LogitsModeIsValidatedAtTheDoor) {
  Engine e(std::make_unique<FakeModel>(), config(1024));
  Request r = greedy(prompt(5, 1), 3);
  r.forced_tokens = {1};
  EXPECT_THROW(e.add_request(r), Error);  // forced without return_logits
  r.return_logits = true;
  r.forced_tokens = {64};
  EXPECT_THROW(e.add_request(r), Error);  // outside the vocabulary
  r.forced_tokens = {1};
  r.n = 2;
  EXPECT_THROW(e.add_request(r), Error);  // one sequence only
  EXPECT_EQ(e.num_active_requests(), 0);
  r.n = 1;
  EXPECT_NO_THROW(e.add_request(r));
}

TEST(EngineModes, PromptThatCanNeverFitIsRefusedAtTheDoor) {
  EngineConfig c = config(8);  // two pages of 4
  Engine e(std::make_unique<FakeModel>(), c);
  try {
    e.add_request(greedy(prompt(8, 1), 2));
    FAIL() << "expected RequestError";
  } catch (const RequestError& err) {
    EXPECT_EQ(std::string(err.what()).rfind("add_request: prompt of 8 tokens does not fit", 0), 0u)
        << err.what();
    EXPECT_EQ(err.param(), "prompt");
    EXPECT_EQ(err.code(), "context_length_exceeded");
  }
  EXPECT_EQ(e.num_active_requests(), 0);
  EXPECT_EQ(e.num_waiting(), 0);
  // The context: a model of 16 positions; a prompt that fills them leaves no room for output.
  Engine big(std::make_unique<FakeModel>(64, std::vector<int32_t>{}, 16), config(1024));
  try {
    big.add_request(greedy(prompt(16, 1), 2));
    FAIL() << "expected RequestError";
  } catch (const RequestError& err) {
    EXPECT_NE(std::string(err.what()).find("maximum context length is 16"), std::string::npos)
        << err.what();
    EXPECT_EQ(err.code(), "context_length_exceeded");
  }
  // A field's own error names it.
  Request bad = greedy(prompt(4, 1), 2);
  bad.sampling.top_p = 0.f;
  try {
    big.add_request(bad);
    FAIL() << "expected RequestError";
  } catch (const RequestError& err) {
    EXPECT_EQ(err.param(), "top_p") << err.what();
    EXPECT_EQ(err.code(), "invalid_value");
  }
}

TEST(EngineModes, PrefillFirstRunsPrefillsApartAndKeepsTheOutput) {
  std::vector<Request> reqs;
  for (int32_t i = 0; i < 6; ++i) reqs.push_back(greedy(prompt(10, i), 6));
  Engine plain(std::make_unique<FakeModel>(), config(1024, 24));
  const auto want = plain.generate(reqs);
  auto model = std::make_unique<FakeModel>();
  FakeModel* fake = model.get();
  EngineConfig c = config(1024, 24);
  c.prefill_first = true;
  c.device_sampling = false;
  Engine e(std::move(model), c);
  const auto got = e.generate(reqs);
  for (size_t i = 0; i < reqs.size(); ++i)
    EXPECT_EQ(got[i].seqs.at(0).new_tokens, want[i].seqs.at(0).new_tokens) << "request " << i;
  // 60 prompt tokens at 24 a step: three prefill steps (no decode in them), then five decode
  // steps of all six requests.
  ASSERT_GE(fake->batch_tokens.size(), 3u);
  EXPECT_EQ(fake->batch_tokens[0], 24);
  EXPECT_EQ(fake->batch_tokens[1], 24);
  EXPECT_EQ(fake->batch_tokens[2], 12);
  for (size_t i = 3; i < fake->batch_tokens.size(); ++i) EXPECT_EQ(fake->batch_tokens[i], 6);
  EXPECT_EQ(fake->batch_tokens.size(), 3u + 5u);
}

// Sampled requests (filters, penalties, bias, logprobs, forks) through Model::forward_sample and
// through downloaded logits give the same tokens and logprobs; with forward_sample the steps after
// the prompts never download logits.
TEST(EngineModes, SampledStepsAgreeOnEitherPath) {
  std::vector<Request> reqs;
  for (int32_t i = 0; i < 6; ++i) {
    Request r = greedy(prompt(9 + i, i), 12);
    r.seed = 100 + uint64_t(i);
    SamplingParams& p = r.sampling;
    p.temperature = i == 0 ? 0.f : 0.7f + 0.1f * float(i);
    p.top_k = i % 2 ? 8 : 0;
    p.top_p = i % 3 ? 0.9f : 1.f;
    p.min_p = i == 4 ? 0.05f : 0.f;
    p.repetition_penalty = 1.2f;
    p.presence_penalty = i == 2 ? 0.5f : 0.f;
    p.frequency_penalty = i == 3 ? 0.4f : 0.f;
    if (i == 5) p.logit_bias = {{3, 4.f}, {7, -100.f}};
    p.logprobs = i % 4;
    if (i == 1) r.n = 2;
    reqs.push_back(r);
  }
  auto run = [&](bool device) {
    auto model = std::make_unique<FakeModel>();
    FakeModel* fake = model.get();
    EngineConfig c = config(1024, 24);
    c.device_sampling = device;
    Engine e(std::move(model), c);
    auto out = e.generate(reqs);
    return std::make_pair(out, fake->num_sample_calls);
  };
  const auto [device, sample_calls] = run(true);
  const auto [host, host_sample_calls] = run(false);
  EXPECT_GT(sample_calls, 10);
  EXPECT_EQ(host_sample_calls, 0);
  for (size_t i = 0; i < reqs.size(); ++i) {
    ASSERT_EQ(device[i].seqs.size(), size_t(reqs[i].n));
    for (size_t k = 0; k < device[i].seqs.size(); ++k) {
      const SequenceOutput& d = device[i].seqs[k];
      const SequenceOutput& h = host[i].seqs[k];
      EXPECT_EQ(d.new_tokens, h.new_tokens) << "request " << i;
      ASSERT_EQ(d.logprobs.size(), d.new_tokens.size()) << "request " << i;
      ASSERT_EQ(h.logprobs.size(), d.logprobs.size());
      for (size_t t = 0; t < d.logprobs.size(); ++t) {
        EXPECT_EQ(d.logprobs[t].token, d.new_tokens[t]);
        EXPECT_EQ(d.logprobs[t].logprob, h.logprobs[t].logprob);
        EXPECT_EQ(d.logprobs[t].top, h.logprobs[t].top);
        EXPECT_EQ(d.logprobs[t].top.size(), size_t(reqs[i].sampling.logprobs));
      }
    }
  }
  // The 7 of request 5 is banned by its bias; the penalties change outputs at all.
  for (int32_t t : device[5].seqs[0].new_tokens) EXPECT_NE(t, 7);
}

// Logprobs are those of the model's raw logits: checked against the rows that return_logits hands
// back for the same positions (log-softmax in double here).
TEST(EngineModes, LogprobsAreTheRawLogSoftmax) {
  Request r = greedy(prompt(11, 3), 8);
  r.seed = 5;
  r.sampling.temperature = 0.9f;
  r.sampling.repetition_penalty = 1.5f;
  r.sampling.logprobs = 4;
  r.return_logits = true;
  Engine e(std::make_unique<FakeModel>(), config(1024));
  const auto out = e.generate({r});
  const SequenceOutput& s = out.at(0).seqs.at(0);
  const int32_t vocab = 64;
  ASSERT_EQ(s.logprobs.size(), s.new_tokens.size());
  const size_t first = r.prompt.size() - 1;  // the row that gave the first generated token
  for (size_t t = 0; t < s.new_tokens.size(); ++t) {
    const float* row = s.logits.data() + (first + t) * size_t(vocab);
    double mx = row[0], z = 0;
    for (int32_t v = 0; v < vocab; ++v) mx = std::max(mx, double(row[v]));
    for (int32_t v = 0; v < vocab; ++v) z += std::exp(double(row[v]) - mx);
    const double lse = mx + std::log(z);
    EXPECT_NEAR(s.logprobs[t].logprob, double(row[s.new_tokens[t]]) - lse, 1e-5) << t;
    ASSERT_EQ(s.logprobs[t].top.size(), 4u);
    for (const auto& [tok, lp] : s.logprobs[t].top) {
      EXPECT_NEAR(lp, double(row[tok]) - lse, 1e-5);
      EXPECT_GE(lp, s.logprobs[t].top.back().second);
    }
  }
}

TEST(EngineModes, LogprobsRefusedWithBeamSearch) {
  Engine e(std::make_unique<FakeModel>(), config(1024));
  Request r = greedy(prompt(5, 1), 4);
  r.use_beam_search = true;
  r.n = 2;
  r.sampling.logprobs = 1;
  try {
    e.add_request(r);
    FAIL() << "expected RequestError";
  } catch (const RequestError& err) {
    EXPECT_EQ(err.param(), "logprobs") << err.what();
  }
}

}  // namespace
}  // namespace pagedattn
