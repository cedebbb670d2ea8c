// Engine tests with the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) on the CPU: batching,
// prefix caching and preemption must not change greedy outputs. Skipped when the model file has
// not been fetched (scripts/fetch-default-model.sh).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/model.h"
#include "pagedattn/tokenizer.h"

using namespace pagedattn;

namespace {

std::string default_model_path() {
  if (const char* env = std::getenv("PAGEDATTN_MODEL")) return env;
  return (std::filesystem::path(__FILE__).parent_path() /
          "../../models/SmolLM2-135M-Instruct.Q4_1.gguf")
      .lexically_normal()
      .string();
}

struct Loaded {
  std::shared_ptr<ModelFile> file;
  std::shared_ptr<Tokenizer> tok;
};

Loaded& loaded() {
  static Loaded l = [] {
    Loaded x;
    const std::string path = default_model_path();
    if (!std::filesystem::exists(path)) return x;
    x.file = std::make_shared<ModelFile>(load_model_file(path));
    x.tok = std::make_shared<Tokenizer>(load_tokenizer(path));
    return x;
  }();
  return l;
}

std::unique_ptr<Engine> make_engine(int64_t kv_tokens, int32_t budget, bool prefix) {
  EngineConfig c;
  c.kv_cache_tokens = kv_tokens;
  c.block_size = 16;
  c.max_num_batched_tokens = budget;
  c.enable_prefix_cache = prefix;
  c.watermark_pages = 0;
  c.log_startup = false;
  return std::make_unique<Engine>(create_model(*loaded().file, Device::cpu), c);
}

std::map<RequestId, std::vector<int32_t>> run(Engine& e) {
  std::map<RequestId, std::vector<int32_t>> out;
  for (int i = 0; i < 10000 && e.has_work(); ++i)
    for (const RequestOutput& o : e.step())
      for (const SequenceOutput& s : o.seqs)
        out[o.id].insert(out[o.id].end(), s.new_tokens.begin(), s.new_tokens.end());
  EXPECT_FALSE(e.has_work());
  return out;
}

Request greedy(std::vector<int32_t> prompt, int32_t max_tokens) {
  Request r;
  r.prompt = std::move(prompt);
  r.sampling.temperature = 0.f;
  r.max_tokens = max_tokens;
  r.ignore_eos = true;
  return r;
}

const std::vector<std::string> kPrompts = {
    "The capital of France is",
    "Paged attention stores the KV cache in",
    "def fibonacci(n):",
    "Once upon a time, in a small village by the sea,",
};

class EngineLlama : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!loaded().file) GTEST_SKIP() << "default model not fetched: " << default_model_path();
    for (const auto& p : kPrompts) prompts.push_back(loaded().tok->encode(p, true, false));
  }
  std::vector<std::vector<int32_t>> prompts;
  static constexpr int32_t kTokens = 8;
};

}  // namespace

TEST_F(EngineLlama, BatchedEqualsOneByOne) {
  std::vector<std::vector<int32_t>> alone;
  for (const auto& p : prompts) {
    auto e = make_engine(1024, 512, false);
    RequestId id = e->add_request(greedy(p, kTokens));
    alone.push_back(run(*e)[id]);
    ASSERT_EQ(alone.back().size(), size_t(kTokens));
  }
  auto e = make_engine(2048, 24, false);  // small budget: chunked prefills mixed with decodes
  std::vector<RequestId> ids;
  for (const auto& p : prompts) ids.push_back(e->add_request(greedy(p, kTokens)));
  auto out = run(*e);
  for (size_t i = 0; i < prompts.size(); ++i) EXPECT_EQ(out[ids[i]], alone[i]) << kPrompts[i];
  EXPECT_EQ(e->cache().stats().pages_used, 0);
}

TEST_F(EngineLlama, PrefixCacheAndPreemptionDoNotChangeOutput) {
  // The same shared-prefix workload three ways: no prefix cache, prefix cache (the first request
  // runs alone first so that its pages are cached), and a cache so small that sequences are
  // preempted and recomputed.
  const std::vector<int32_t> shared = loaded().tok->encode(
      "You are a helpful assistant. Answer every question briefly and precisely, in one short "
      "sentence, without any preamble, apology or repetition of the question. Question:",
      true, false);
  ASSERT_GE(shared.size(), 32u);
  std::vector<std::vector<int32_t>> ps;
  for (const char* q : {" What is two plus two?", " Name a colour.", " Where is Rome?"}) {
    auto p = shared;
    auto t = loaded().tok->encode(q, false, false);
    p.insert(p.end(), t.begin(), t.end());
    ps.push_back(p);
  }
  constexpr int32_t kLong = 16;  // crosses at least one page boundary
  auto go = [&](int64_t kv_tokens, bool prefix, bool first_alone, EngineMetrics* m) {
    auto e = make_engine(kv_tokens, 64, prefix);
    std::vector<RequestId> ids;
    std::map<RequestId, std::vector<int32_t>> out;
    for (size_t i = 0; i < ps.size(); ++i) {
      ids.push_back(e->add_request(greedy(ps[i], kLong)));
      if (i == 0 && first_alone) out = run(*e);
    }
    for (auto& [id, t] : run(*e)) out[id] = t;
    *m = e->metrics();
    std::vector<std::vector<int32_t>> v;
    for (RequestId id : ids) v.push_back(out[id]);
    EXPECT_EQ(e->cache().stats().pages_used, 0);
    return v;
  };
  EngineMetrics m;
  auto base = go(2048, false, true, &m);
  EXPECT_EQ(m.prefix_hit_tokens, 0);
  auto with_prefix = go(2048, true, true, &m);
  EXPECT_GE(m.prefix_hit_tokens, 2 * 32);
  EXPECT_EQ(with_prefix, base);
  // Room for exactly two prompts: their decodes outgrow the cache and one is preempted.
  int64_t pages = 0;
  for (const auto& p : ps) pages = std::max<int64_t>(pages, (int64_t(p.size()) + 15) / 16);
  auto preempted = go(2 * pages * 16, false, false, &m);
  EXPECT_GT(m.preemptions, 0);
  EXPECT_EQ(preempted, base);
}
