// Engine tests with the default model (SmolLM2-135M-Instruct, Q4_1 GGUF) on the CPU: batching (16
// concurrent requests against the same requests one by one), prefix caching and preemption must
// not change greedy outputs; n = 4 shares the prompt's pages. Skipped when the model file has not
// been fetched (scripts/fetch-default-model.sh).
#include <gtest/gtest.h>

#include <filesystem>
#include <map>
#include <memory>
#include <set>
#include <vector>

#include "default_model.h"
#include "pagedattn/engine.h"
#include "pagedattn/model.h"
#include "pagedattn/tokenizer.h"

using namespace pagedattn;

namespace {

// PAGEDATTN_MODEL or the default model.
std::string default_model_path() { return pagedattn::testing::model_path_from_env(); }

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

std::unique_ptr<Engine> make_engine(int64_t kv_tokens, int32_t budget, bool prefix,
                                    AdmissionPolicy admission = AdmissionPolicy::lookahead) {
  EngineConfig c;
  c.admission = admission;
  c.kv_cache_tokens = kv_tokens;
  c.page_size = 16;
  c.max_num_batched_tokens = budget;
  c.enable_prefix_cache = prefix;
  c.watermark_pages = 0;
  c.log_startup = false;
  return std::make_unique<Engine>(create_model(*loaded().file, Device::cpu), c);
}

// Steps the engine until it is idle; the tokens of every request (sequences concatenated) and,
// when asked, the most sequences running at once.
std::map<RequestId, std::vector<int32_t>> run(Engine& e, int32_t* max_running = nullptr) {
  std::map<RequestId, std::vector<int32_t>> out;
  for (int i = 0; i < 10000 && e.has_work(); ++i) {
    for (const RequestOutput& o : e.step())
      for (const SequenceOutput& s : o.seqs)
        out[o.id].insert(out[o.id].end(), s.new_tokens.begin(), s.new_tokens.end());
    if (max_running) *max_running = std::max(*max_running, e.metrics().num_running);
  }
  EXPECT_FALSE(e.has_work());
  return out;
}

// Per sequence index: the tokens of one step's outputs added to tokens.
void gather(std::vector<std::vector<int32_t>>& tokens, const std::vector<RequestOutput>& outs) {
  for (const RequestOutput& o : outs)
    for (const SequenceOutput& s : o.seqs) {
      if (tokens.size() <= size_t(s.index)) tokens.resize(size_t(s.index) + 1);
      tokens[size_t(s.index)].insert(tokens[size_t(s.index)].end(), s.new_tokens.begin(),
                                     s.new_tokens.end());
    }
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
    // NOTE: admission on current use, so that the tight cache below really preempts.
    auto e = make_engine(kv_tokens, 64, prefix, AdmissionPolicy::immediate);
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

TEST_F(EngineLlama, SixteenConcurrentRequestsEqualOneByOne) {
  // Prompts of 1 to 32 tokens, 6 to 8 new tokens each: many cross a 16-token page boundary.
  const std::vector<std::string> texts = {
      "Hi",
      "The capital of France is",
      "Water boils at a temperature of",
      "def add(a, b):\n    return",
      "List three primary colours:",
      "The quick brown fox jumps over the lazy dog. The quick brown fox",
      "In 1969, the first humans to walk on the Moon were",
      "Translate to French: good morning, my friend. Answer:",
      "1, 2, 3, 4, 5, 6,",
      "A haiku about autumn leaves falling gently on a quiet pond at dusk:",
      "SELECT name FROM users WHERE",
      "The mitochondria is the powerhouse of the",
      "Once upon a time, in a kingdom far away, there lived a young princess who loved to read "
      "books about dragons, knights and distant lands. One day,",
      "Q: What is the largest planet in the solar system?\nA:",
      "<|im_start|>user\nWhat is two plus two?<|im_end|>\n<|im_start|>assistant\n",
      "Paged attention keeps the key-value cache of every sequence in fixed-size pages, so that",
  };
  ASSERT_EQ(texts.size(), 16u);
  std::vector<std::vector<int32_t>> ps;
  for (const auto& t : texts) ps.push_back(loaded().tok->encode(t, true, true));
  auto max_tokens = [](size_t i) { return int32_t(6 + i % 3); };

  // One by one: each request alone in the engine, the next added when the last has finished.
  std::vector<std::vector<int32_t>> alone;
  {
    auto e = make_engine(4096, 64, false);
    for (size_t i = 0; i < ps.size(); ++i) {
      const RequestId id = e->add_request(greedy(ps[i], max_tokens(i)));
      alone.push_back(run(*e)[id]);
      ASSERT_EQ(alone.back().size(), size_t(max_tokens(i))) << texts[i];
    }
  }
  // All 16 at once, with a budget small enough that prefill chunks share steps with decodes.
  auto e = make_engine(4096, 48, false);
  std::vector<RequestId> ids;
  for (size_t i = 0; i < ps.size(); ++i)
    ids.push_back(e->add_request(greedy(ps[i], max_tokens(i))));
  int32_t max_running = 0;
  auto out = run(*e, &max_running);
  EXPECT_GE(max_running, 8);  // really batched
  for (size_t i = 0; i < ps.size(); ++i)
    EXPECT_EQ(out[ids[i]], alone[i]) << "request " << i << ": " << texts[i];
  EXPECT_EQ(e->cache().stats().pages_used, 0);
}

TEST_F(EngineLlama, ParallelSamplingSharesPromptPages) {
  const std::vector<int32_t> text = loaded().tok->encode(
      "Paged attention keeps the key-value cache of every sequence in fixed-size pages, so that "
      "sequences can share the pages of a common prompt and grow one page at a time, copying a "
      "shared page only when one of them writes into it.",
      true, false);
  ASSERT_GE(text.size(), 40u);
  auto request = [&](size_t prompt_len, int32_t n, float temperature) {
    Request r = greedy(std::vector<int32_t>(text.begin(), text.begin() + long(prompt_len)), 8);
    r.n = n;
    r.seed = 1234;
    r.sampling.temperature = temperature;
    return r;
  };
  // n = 4: the tokens of every sequence, and the pages in use after the first and second steps.
  auto parallel = [&](size_t prompt_len, float temperature, std::vector<int32_t>& pages) {
    auto e = make_engine(2048, 256, false);
    e->add_request(request(prompt_len, 4, temperature));
    std::vector<std::vector<int32_t>> seqs;
    gather(seqs, e->step());  // prefill, fork, the first token of every sequence
    EXPECT_EQ(e->cache().stats().num_sequences, 4);
    pages.push_back(e->cache().stats().pages_used);
    gather(seqs, e->step());  // every sequence writes the position after the prompt
    pages.push_back(e->cache().stats().pages_used);
    for (int i = 0; i < 100 && e->has_work(); ++i) gather(seqs, e->step());
    EXPECT_FALSE(e->has_work());
    EXPECT_EQ(e->cache().stats().pages_used, 0);
    return seqs;
  };
  auto single = [&](size_t prompt_len, float temperature) {
    auto e = make_engine(2048, 256, false);
    const RequestId id = e->add_request(request(prompt_len, 1, temperature));
    return run(*e)[id];
  };

  // Sampled, a prompt of exactly two pages: one copy of them for the four sequences, then a page
  // of their own for each.
  std::vector<int32_t> pages;
  const auto sampled = parallel(32, 1.0f, pages);
  EXPECT_EQ(pages, (std::vector<int32_t>{2, 2 + 4}));
  ASSERT_EQ(sampled.size(), 4u);
  for (const auto& t : sampled) EXPECT_EQ(t.size(), 8u);
  EXPECT_GE(std::set<std::vector<int32_t>>(sampled.begin(), sampled.end()).size(), 2u);
  // Sequence i draws from stream (seed, i): sequence 0 is the n = 1 request with the same seed,
  // which it can only be if the shared pages hold what its own prefill would have written.
  EXPECT_EQ(sampled[0], single(32, 1.0f));
  std::vector<int32_t> pages_again;
  EXPECT_EQ(parallel(32, 1.0f, pages_again), sampled);  // same seed, same samples

  // Greedy, a prompt of two full pages and a tail of 8: the full pages stay shared, the tail is
  // copied for at most the three other sequences, and every sequence equals the lone request.
  pages.clear();
  const auto greedy4 = parallel(40, 0.f, pages);
  ASSERT_EQ(pages.size(), 2u);
  EXPECT_EQ(pages[0], 3);
  EXPECT_GE(pages[1], 3 + 2);
  EXPECT_LE(pages[1], 3 + 3);
  const auto alone = single(40, 0.f);
  ASSERT_EQ(alone.size(), 8u);
  ASSERT_EQ(greedy4.size(), 4u);
  for (const auto& t : greedy4) EXPECT_EQ(t, alone);
}
