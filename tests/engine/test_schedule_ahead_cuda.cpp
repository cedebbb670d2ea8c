// The engine on the CUDA runner, scheduling ahead (its default there) against not: the same tokens
// for greedy and seeded sampled requests that end on max_tokens, on stop token ids and by a
// cancel, with the prefix cache on and a second wave of requests that reuses the first wave's
// pages.
#include <gtest/gtest.h>

#include <map>
#include <memory>
#include <vector>

#include "gpu_skip.h"
#include "pagedattn/engine.h"
#include "pagedattn/llama_cuda.h"
#include "tiny_models.h"

using namespace pagedattn;

namespace {

struct Outcome {
  std::map<RequestId, std::vector<int32_t>> tokens;
  std::map<RequestId, FinishReason> finish;
  bool ahead = false;
  int64_t pages_used = -1;
};

// Two waves of greedy requests; request 2 of the first wave is cancelled after six steps. stop:
// per request of the first wave, a token that ends it (-1: none).
// budget > 0: the step's token budget (EngineConfig::max_num_batched_tokens), and prompts long
// enough to run in chunks of it.
Outcome run(int32_t ahead, const std::vector<int32_t>& stop, int32_t budget = 0) {
  const ModelConfig cfg =
      pagedattn::testing::tiny_config("llama", pagedattn::testing::TinySize::gpu);
  EngineConfig c;
  c.kv_cache_tokens = 2048;
  c.page_size = 16;
  c.log_startup = false;
  c.schedule_ahead = ahead;
  if (budget > 0) c.max_num_batched_tokens = budget;
  Engine e(std::make_unique<LlamaModelCuda>(cfg, 9), c);
  Outcome r;
  r.ahead = e.schedules_ahead();
  std::vector<std::vector<int32_t>> prompts;
  std::vector<RequestId> ids;
  for (int32_t i = 0; i < 6; ++i) {
    Request q;
    const int32_t len = budget > 0 ? 40 + 37 * i : 5 + 9 * i;
    for (int32_t j = 0; j < len; ++j) q.prompt.push_back((j * 31 + i * 7 + 3) % 300);
    q.sampling.temperature = 0.f;
    if (i % 2 == 1) {  // sampled on the device (the mix), seeded
      q.sampling.temperature = 0.8f;
      q.sampling.top_p = 0.95f;
      q.sampling.top_k = 50;
      q.sampling.repetition_penalty = 1.1f;
      q.sampling.logprobs = 3;
      q.seed = uint64_t(40 + i);
    }
    q.max_tokens = 12 + 5 * i;
    q.ignore_eos = true;
    if (stop[size_t(i)] >= 0) q.sampling.stop_token_ids = {stop[size_t(i)]};
    prompts.push_back(q.prompt);
    ids.push_back(e.add_request(q));
  }
  auto gather = [&](const std::vector<RequestOutput>& outs) {
    for (const RequestOutput& o : outs)
      for (const SequenceOutput& s : o.seqs) {
        auto& t = r.tokens[o.id];
        t.insert(t.end(), s.new_tokens.begin(), s.new_tokens.end());
        if (s.finish != FinishReason::none) r.finish[o.id] = s.finish;
      }
  };
  for (int step = 0; step < 6; ++step) gather(e.step());
  e.cancel(ids[2]);
  while (e.has_work()) gather(e.step());
  // The second wave: each first-wave prompt and output again, and more tokens after them.
  for (size_t i = 0; i < prompts.size(); ++i) {
    Request q;
    q.prompt = prompts[i];
    q.prompt.insert(q.prompt.end(), r.tokens[ids[i]].begin(), r.tokens[ids[i]].end());
    q.sampling.temperature = 0.f;
    q.max_tokens = 10;
    q.ignore_eos = true;
    e.add_request(q);
  }
  while (e.has_work()) gather(e.step());
  r.pages_used = e.cache().stats().pages_used;
  return r;
}

TEST(ScheduleAheadCuda, SameTokensAsWithout) {
  PA_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> none(6, -1);
  const Outcome first = run(0, none);
  ASSERT_FALSE(first.ahead);
  // Stop ids taken from the first run's outputs, so that they end requests 1 and 4 early.
  std::vector<int32_t> stop = none;
  for (size_t i : {size_t(1), size_t(4)}) stop[i] = first.tokens.at(RequestId(i + 1))[5];
  const Outcome off = run(0, stop), on = run(-1, stop);
  EXPECT_TRUE(on.ahead);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_EQ(on.finish, off.finish);
  EXPECT_EQ(on.pages_used, 0);
  EXPECT_EQ(off.finish.at(3), FinishReason::cancelled);
  EXPECT_EQ(off.finish.at(2), FinishReason::stop);
  EXPECT_EQ(off.tokens.size(), 12u);
}

// Prompts of 40-225 tokens in chunks of at most 48 tokens a step: each chunk before a prompt's
// last is begun while the step before runs (beside other requests' decode rows). The same tokens.
TEST(ScheduleAheadCuda, PromptChunksSameTokensAsWithout) {
  PA_SKIP_WITHOUT_GPU();
  const std::vector<int32_t> none(6, -1);
  const Outcome off = run(0, none, 48), on = run(-1, none, 48);
  EXPECT_TRUE(on.ahead);
  EXPECT_EQ(on.tokens, off.tokens);
  EXPECT_EQ(on.finish, off.finish);
  EXPECT_EQ(on.pages_used, 0);
  EXPECT_EQ(off.tokens.size(), 12u);
}

}  // namespace
