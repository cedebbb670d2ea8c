// Batch invariance of the CPU runner, bit for bit: a sequence's logits are the same alone, inside a
// ragged batch (at any place, with its prompt in chunks), after preemption (its tokens recomputed
// in one prefill) and with a prefix-cache hit. Checked on the small synthetic models of the parity
// tests (f32 weights) and on the default model (Q4_1 blocks read in place, int8 activations, and
// the exact path); the default model's tests skip when its file is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <memory>
#include <random>

#include "default_model.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"
#include "tiny_models.h"

using namespace pagedattn;

namespace {

using Rows = std::vector<std::vector<float>>;  // logits rows of the target sequence, in order

struct Runner {
  Model* model;
  int32_t page_size;
  int32_t vocab;
};

KvCacheConfig cache_config(const ModelConfig& c, int32_t pages, int32_t page_size, bool prefix) {
  return pagedattn::testing::model_kv_config(c, pages, page_size, Device::cpu, prefix);
}

using pagedattn::testing::random_tokens;

// One forward step; work[b] are seqs[b]'s new tokens. Returns each sequence's last-row logits.
Rows step(Model& model, KvCache& cache, const std::vector<SeqId>& seqs,
          const std::vector<std::vector<int32_t>>& work) {
  ForwardBatch b;
  b.seqs = seqs;
  b.q_indptr.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int32_t start = cache.kv_len(seqs[s]);
    const std::vector<int32_t> slots = cache.append_slots(seqs[s], work[s]);
    for (size_t j = 0; j < work[s].size(); ++j) {
      if (j + 1 == work[s].size()) b.logit_rows.push_back(int32_t(b.tokens.size()));
      b.tokens.push_back(work[s][j]);
      b.positions.push_back(start + int32_t(j));
      b.slots.push_back(slots[j]);
    }
    b.q_indptr.push_back(int32_t(b.tokens.size()));
  }
  set_attention_layout(b, cache);
  const Tensor l = model.forward(b, cache);
  for (SeqId s : seqs) cache.commit(s);
  const int64_t V = l.dim(1);
  Rows out;
  for (int64_t r = 0; r < l.dim(0); ++r)
    out.emplace_back(l.data_as<float>() + r * V, l.data_as<float>() + (r + 1) * V);
  return out;
}

int32_t argmax(const std::vector<float>& row) {
  return int32_t(std::max_element(row.begin(), row.end()) - row.begin());
}

// The reference: the prompt alone in one prefill, then `steps` greedy decode steps.
Rows alone(const Runner& s, const ModelConfig& c, const std::vector<int32_t>& prompt, int steps) {
  KvCache cache(cache_config(c, 64, s.page_size, false));
  const SeqId q = cache.create_sequence();
  Rows rows = step(*s.model, cache, {q}, {prompt});
  for (int i = 0; i < steps; ++i)
    rows.push_back(step(*s.model, cache, {q}, {{argmax(rows.back())}})[0]);
  return rows;
}

void expect_bit_equal(const Rows& want, const Rows& got, const char* what) {
  ASSERT_EQ(want.size(), got.size()) << what;
  for (size_t r = 0; r < want.size(); ++r) {
    ASSERT_EQ(want[r].size(), got[r].size()) << what;
    EXPECT_EQ(std::memcmp(want[r].data(), got[r].data(), want[r].size() * sizeof(float)), 0)
        << what << ": logits row " << r << " differ";
  }
}

// The target's prompt in two chunks inside a ragged batch (between two other sequences, one of
// them decoding), then batched decode steps.
Rows batched(const Runner& s, const ModelConfig& c, const std::vector<int32_t>& prompt, int steps) {
  KvCache cache(cache_config(c, 128, s.page_size, false));
  const SeqId b = cache.create_sequence(), a = cache.create_sequence(), d = cache.create_sequence();
  const auto pb = random_tokens(11, s.vocab, 7), pd = random_tokens(23, s.vocab, 8);
  const size_t half = prompt.size() / 2;
  const std::vector<int32_t> first(prompt.begin(), prompt.begin() + ptrdiff_t(half));
  const std::vector<int32_t> second(prompt.begin() + ptrdiff_t(half), prompt.end());
  Rows r1 = step(*s.model, cache, {b, a}, {pb, first});
  Rows r2 = step(*s.model, cache, {b, d, a}, {{argmax(r1[0])}, pd, second});
  Rows rows = {r2[2]};
  std::vector<int32_t> next = {argmax(r2[0]), argmax(r2[1]), argmax(r2[2])};
  for (int i = 0; i < steps; ++i) {
    // The target moves: first, middle, last in turn.
    std::vector<SeqId> seqs = {b, d};
    std::vector<std::vector<int32_t>> work = {{next[0]}, {next[1]}};
    const size_t at = size_t(i % 3);
    seqs.insert(seqs.begin() + ptrdiff_t(at), a);
    work.insert(work.begin() + ptrdiff_t(at), {next[2]});
    Rows r = step(*s.model, cache, seqs, work);
    rows.push_back(r[at]);
    r.erase(r.begin() + ptrdiff_t(at));
    next = {argmax(r[0]), argmax(r[1]), argmax(rows.back())};
  }
  return rows;
}

// Preempted after `steps / 2` decode steps: pages freed, prompt and generated tokens recomputed in
// one prefill, then decoding goes on.
Rows preempted(const Runner& s, const ModelConfig& c, const std::vector<int32_t>& prompt,
               int steps) {
  KvCache cache(cache_config(c, 64, s.page_size, false));
  SeqId q = cache.create_sequence();
  std::vector<int32_t> tokens = prompt;
  Rows rows = step(*s.model, cache, {q}, {prompt});
  const int before = steps / 2;
  for (int i = 0; i < before; ++i) {
    tokens.push_back(argmax(rows.back()));
    rows.push_back(step(*s.model, cache, {q}, {{tokens.back()}})[0]);
  }
  cache.free_sequence(q);
  q = cache.create_sequence();
  tokens.push_back(argmax(rows.back()));
  rows.push_back(step(*s.model, cache, {q}, {tokens})[0]);  // the recompute
  for (int i = before + 1; i < steps; ++i)
    rows.push_back(step(*s.model, cache, {q}, {{argmax(rows.back())}})[0]);
  return rows;
}

// A second request with the same prompt reuses the first one's cached full pages.
Rows prefix_hit(const Runner& s, const ModelConfig& c, const std::vector<int32_t>& prompt,
                int steps, int32_t* reused) {
  KvCache cache(cache_config(c, 64, s.page_size, true));
  const SeqId first = cache.create_sequence();
  step(*s.model, cache, {first}, {prompt});
  cache.free_sequence(first);
  const SeqId q = cache.create_sequence();
  *reused = cache.attach_prefix(q, prompt);
  const std::vector<int32_t> rest(prompt.begin() + *reused, prompt.end());
  Rows rows = step(*s.model, cache, {q}, {rest});
  for (int i = 0; i < steps; ++i)
    rows.push_back(step(*s.model, cache, {q}, {{argmax(rows.back())}})[0]);
  return rows;
}

void check_all(const Runner& s, const ModelConfig& c, const std::vector<int32_t>& prompt,
               int steps) {
  const Rows want = alone(s, c, prompt, steps);
  expect_bit_equal(want, batched(s, c, prompt, steps), "batched");
  expect_bit_equal(want, preempted(s, c, prompt, steps), "after preemption");
  int32_t reused = 0;
  expect_bit_equal(want, prefix_hit(s, c, prompt, steps, &reused), "prefix-cache hit");
  EXPECT_GT(reused, 0) << "the prefix cache reused nothing";
}

using pagedattn::testing::tiny_config;

class SmallModels : public ::testing::TestWithParam<std::string> {};

TEST_P(SmallModels, LogitsBitIdenticalAloneBatchedPreemptedPrefixHit) {
  const ModelConfig cfg = tiny_config(GetParam());
  LlamaModel model(make_synthetic_model_file(cfg, 5));
  const Runner s{&model, 4, cfg.vocab_size};
  check_all(s, cfg, random_tokens(19, cfg.vocab_size, 3), 6);
}

INSTANTIATE_TEST_SUITE_P(Configs, SmallModels, ::testing::Values("llama", "qwen2", "qwen3"));

using pagedattn::testing::default_model_path;

class DefaultModelInvariance : public ::testing::TestWithParam<bool> {};

TEST_P(DefaultModelInvariance, LogitsBitIdenticalAloneBatchedPreemptedPrefixHit) {
  if (!std::filesystem::exists(default_model_path()))
    GTEST_SKIP() << default_model_path() << " is absent (scripts/fetch-default-model.sh)";
  const ModelFile file = load_model_file(default_model_path(), WeightFormat::file);
  ASSERT_FALSE(file.weights.empty());
  LlamaModel model(file);
  model.set_exact_matmul(GetParam());
  const Runner s{&model, 16, file.config.vocab_size};
  // The exact path dequantises each weight tile per product: fewer steps keep it to seconds.
  check_all(s, file.config, random_tokens(37, 5000, 11), GetParam() ? 2 : 4);
}

INSTANTIATE_TEST_SUITE_P(Matmul, DefaultModelInvariance, ::testing::Values(false, true),
                         [](const auto& p) { return p.param ? "exact" : "int8"; });

}  // namespace
