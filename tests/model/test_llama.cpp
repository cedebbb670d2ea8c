// LlamaModel against the naive double-precision oracle (test_llama_oracle.h) on random weights.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>

#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"
#include "test_llama_oracle.h"
#include "tiny_models.h"

using namespace pagedattn;

namespace {

using pagedattn::testing::tiny_config;

KvCacheConfig cache_config(const ModelConfig& c, int32_t num_pages, int32_t page_size = 4) {
  return pagedattn::testing::model_kv_config(c, num_pages, page_size);
}

using pagedattn::testing::random_tokens;

// One step: sequence seqs[b] gets new tokens work[b]. Returns logits for every new token row
// (all_rows) or each sequence's last row.
Tensor step(Model& model, KvCache& cache, const std::vector<SeqId>& seqs,
            const std::vector<std::vector<int32_t>>& work, bool all_rows) {
  ForwardBatch b;
  b.seqs = seqs;
  b.q_indptr.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int32_t start = cache.kv_len(seqs[s]);
    const std::vector<int32_t> slots = cache.append_slots(seqs[s], work[s]);
    for (size_t j = 0; j < work[s].size(); ++j) {
      if (all_rows || j + 1 == work[s].size()) b.logit_rows.push_back(int32_t(b.tokens.size()));
      b.tokens.push_back(work[s][j]);
      b.positions.push_back(start + int32_t(j));
      b.slots.push_back(slots[j]);
    }
    b.q_indptr.push_back(int32_t(b.tokens.size()));
  }
  set_attention_layout(b, cache);
  Tensor logits = model.forward(b, cache);
  for (SeqId s : seqs) cache.commit(s);
  return logits;
}

// max |got - want| relative to max(1, max |want|) over one row.
double row_error(const float* got, const std::vector<double>& want) {
  double err = 0.0, scale = 1.0;
  for (size_t i = 0; i < want.size(); ++i) {
    err = std::max(err, std::abs(double(got[i]) - want[i]));
    scale = std::max(scale, std::abs(want[i]));
  }
  return err / scale;
}

int32_t argmax_row(const float* row, int32_t n) {
  return int32_t(std::max_element(row, row + n) - row);
}

class LlamaVsOracle : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaVsOracle, RaggedPrefillThenBatchedDecode) {
  const ModelConfig cfg = tiny_config(GetParam());
  const ModelFile file = make_synthetic_model_file(cfg, 7);
  LlamaModel model(file);
  KvCache cache(cache_config(cfg, 256));
  const std::vector<int> lens = {5, 17, 1, 33};
  std::vector<SeqId> seqs;
  std::vector<std::vector<int32_t>> toks;
  for (size_t s = 0; s < lens.size(); ++s) {
    seqs.push_back(cache.create_sequence());
    toks.push_back(random_tokens(lens[s], cfg.vocab_size, 100 + s));
  }
  // Prefill all four together, logits for every row.
  std::vector<std::vector<std::vector<float>>> got(lens.size());
  Tensor pre = step(model, cache, seqs, toks, true);
  ASSERT_EQ(pre.dim(0), 5 + 17 + 1 + 33);
  ASSERT_EQ(pre.dim(1), cfg.vocab_size);
  int row = 0;
  for (size_t s = 0; s < lens.size(); ++s) {
    for (int j = 0; j < lens[s]; ++j, ++row) {
      const float* r = pre.data_as<float>() + int64_t(row) * cfg.vocab_size;
      got[s].emplace_back(r, r + cfg.vocab_size);
    }
  }
  // Ten greedy decode steps, batched.
  for (int it = 0; it < 10; ++it) {
    std::vector<std::vector<int32_t>> next;
    for (size_t s = 0; s < lens.size(); ++s) {
      next.push_back({argmax_row(got[s].back().data(), cfg.vocab_size)});
      toks[s].push_back(next.back()[0]);
    }
    Tensor dec = step(model, cache, seqs, next, false);
    ASSERT_EQ(dec.dim(0), int64_t(lens.size()));
    for (size_t s = 0; s < lens.size(); ++s) {
      const float* r = dec.data_as<float>() + int64_t(s) * cfg.vocab_size;
      got[s].emplace_back(r, r + cfg.vocab_size);
    }
  }
  const test::NaiveLlama oracle(file);
  for (size_t s = 0; s < lens.size(); ++s) {
    EXPECT_EQ(cache.kv_len(seqs[s]), int32_t(toks[s].size()));
    const auto want = oracle.logits(toks[s]);
    ASSERT_EQ(want.size(), got[s].size());
    for (size_t p = 0; p < want.size(); ++p) {
      EXPECT_LT(row_error(got[s][p].data(), want[p]), 1e-4)
          << GetParam() << " sequence " << s << " position " << p;
    }
  }
}

INSTANTIATE_TEST_SUITE_P(Configs, LlamaVsOracle,
                         ::testing::Values("llama", "qwen2", "qwen3", "llama3", "mistral"));

TEST(Llama, TiedEmbeddingsUseEmbedTokens) {
  ModelConfig cfg = tiny_config("llama");
  cfg.tie_word_embeddings = true;
  const ModelFile file = make_synthetic_model_file(cfg, 3);
  ASSERT_EQ(file.tensors.count("lm_head.weight"), 0u);
  LlamaModel model(file);
  KvCache cache(cache_config(cfg, 16));
  const SeqId s = cache.create_sequence();
  const std::vector<int32_t> toks = random_tokens(6, cfg.vocab_size, 1);
  Tensor out = step(model, cache, {s}, {toks}, false);
  const auto want = test::NaiveLlama(file).logits(toks);
  EXPECT_LT(row_error(out.data_as<float>(), want.back()), 1e-4);
}

TEST(Llama, ChunkedPrefillEqualsFullPrefill) {
  const ModelConfig cfg = tiny_config("qwen3");
  const ModelFile file = make_synthetic_model_file(cfg, 11);
  LlamaModel model(file);
  KvCache cache(cache_config(cfg, 64));
  const std::vector<int32_t> toks = random_tokens(41, cfg.vocab_size, 5);
  const SeqId full = cache.create_sequence(), chunked = cache.create_sequence();
  Tensor want = step(model, cache, {full}, {toks}, true);
  std::vector<float> got;
  for (size_t i = 0; i < toks.size(); i += 7) {
    std::vector<int32_t> chunk(toks.begin() + ptrdiff_t(i),
                               toks.begin() + ptrdiff_t(std::min(toks.size(), i + 7)));
    Tensor part = step(model, cache, {chunked}, {chunk}, true);
    got.insert(got.end(), part.data_as<float>(), part.data_as<float>() + part.numel());
  }
  ASSERT_EQ(int64_t(got.size()), want.numel());
  for (int64_t i = 0; i < want.numel(); ++i) {
    ASSERT_NEAR(got[size_t(i)], want.data_as<float>()[i], 1e-4) << "element " << i;
  }
}

// Greedy continuations of 8 sequences: each alone, then all 8 in one batch (ragged prefill, then
// batched decode). The tokens must be the same.
TEST(Llama, GreedyOutputsAreBatchInvariant) {
  const ModelConfig cfg = tiny_config("llama");
  const ModelFile file = make_synthetic_model_file(cfg, 21);
  LlamaModel model(file);
  constexpr int kSeqs = 8, kSteps = 12;
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < kSeqs; ++s)
    prompts.push_back(random_tokens(3 + 5 * s, cfg.vocab_size, 50 + s));

  auto generate = [&](KvCache& cache, const std::vector<int>& which) {
    std::vector<SeqId> seqs;
    std::vector<std::vector<int32_t>> work, out(which.size());
    for (int w : which) {
      seqs.push_back(cache.create_sequence());
      work.push_back(prompts[size_t(w)]);
    }
    for (int it = 0; it < kSteps; ++it) {
      Tensor l = step(model, cache, seqs, work, false);
      for (size_t s = 0; s < which.size(); ++s) {
        const int32_t t =
            argmax_row(l.data_as<float>() + int64_t(s) * cfg.vocab_size, cfg.vocab_size);
        out[s].push_back(t);
        work[s] = {t};
      }
    }
    return out;
  };
  KvCache batch_cache(cache_config(cfg, 256));
  const auto together = generate(batch_cache, {0, 1, 2, 3, 4, 5, 6, 7});
  for (int s = 0; s < kSeqs; ++s) {
    KvCache alone_cache(cache_config(cfg, 64));
    EXPECT_EQ(generate(alone_cache, {s})[0], together[size_t(s)]) << "sequence " << s;
  }
}

TEST(Llama, EmptyBatchAndDecodeOnlyRows) {
  const ModelConfig cfg = tiny_config("llama");
  LlamaModel model(make_synthetic_model_file(cfg, 1));
  KvCache cache(cache_config(cfg, 8));
  ForwardBatch empty;
  empty.q_indptr = {0};
  Tensor l = model.forward(empty, cache);
  EXPECT_EQ(l.dim(0), 0);
  EXPECT_EQ(l.dim(1), cfg.vocab_size);
}

// ---- bad input: Error naming the argument, nothing written ----

struct BadBatchFixture : ::testing::Test {
  ModelConfig cfg = tiny_config("llama");
  ModelFile file = make_synthetic_model_file(cfg, 2);
  LlamaModel model{file};
  KvCache cache{cache_config(cfg, 8)};
  SeqId seq = cache.create_sequence();
  ForwardBatch b;

  void SetUp() override {
    const std::vector<int32_t> toks = {1, 2, 3};
    b.seqs = {seq};
    b.q_indptr = {0, 3};
    b.tokens = toks;
    b.positions = {0, 1, 2};
    b.slots = cache.append_slots(seq, toks);
    b.logit_rows = {2};
    set_attention_layout(b, cache);
  }
  // Pool bytes of layer 0 (K then V).
  std::vector<uint8_t> pool() const {
    const PagedKVView v = cache.layer_view(0);
    const size_t n = size_t(v.page_stride() * v.num_pages) * dtype_size(v.dtype);
    std::vector<uint8_t> out(2 * n);
    std::memcpy(out.data(), v.k_pages, n);
    std::memcpy(out.data() + n, v.v_pages, n);
    return out;
  }
  void expect_error(const std::string& needle) {
    const auto before = pool();
    try {
      model.forward(b, cache);
      ADD_FAILURE() << "no Error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
      EXPECT_EQ(std::string(e.what()).rfind("LlamaModel::forward", 0), 0u) << e.what();
    }
    EXPECT_EQ(pool(), before) << "a rejected batch wrote to the cache";
  }
};

TEST_F(BadBatchFixture, GoodBatchRuns) { EXPECT_NO_THROW(model.forward(b, cache)); }
TEST_F(BadBatchFixture, TokenOutsideVocab) {
  b.tokens[1] = cfg.vocab_size;
  expect_error("batch.tokens[1]");
}
TEST_F(BadBatchFixture, NegativeToken) {
  b.tokens[0] = -1;
  expect_error("batch.tokens[0]");
}
TEST_F(BadBatchFixture, PositionsDisagreeWithCache) {
  b.positions[2] = 5;
  expect_error("batch.positions[2]");
}
TEST_F(BadBatchFixture, SlotNotInBlockTable) {
  b.slots[1] = b.slots[1] + 1;
  expect_error("batch.slots[1]");
}
TEST_F(BadBatchFixture, IndptrWrongLength) {
  b.q_indptr = {0, 1, 3};
  expect_error("batch.q_indptr");
}
TEST_F(BadBatchFixture, IndptrEndsWrong) {
  b.q_indptr = {0, 2};
  expect_error("batch.q_indptr");
}
TEST_F(BadBatchFixture, UnknownSequence) {
  b.seqs = {seq + 1000};
  try {
    set_attention_layout(b, cache);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("batch.seqs[0] = " + std::to_string(seq + 1000) +
                                         " is not in the cache"),
              std::string::npos)
        << e.what();
  }
}
TEST_F(BadBatchFixture, DuplicateSequence) {
  b.seqs = {seq, seq};
  b.q_indptr = {0, 3, 3};
  set_attention_layout(b, cache);
  expect_error("appears twice");
}
TEST_F(BadBatchFixture, NoAttentionLayout) {
  b.kv_len.clear();
  expect_error("set_attention_layout builds it");
}
TEST_F(BadBatchFixture, PageOutsideThePool) {
  b.block_table[0] = 8;  // the pool has pages 0..7
  expect_error("outside the pool of 8 pages");
}
TEST_F(BadBatchFixture, LogitRowOutOfRange) {
  b.logit_rows = {3};
  expect_error("batch.logit_rows[0]");
}
TEST_F(BadBatchFixture, MoreTokensThanReserved) {
  b.tokens.push_back(4);
  b.positions.push_back(3);
  b.slots.push_back(b.slots.back() + 1);
  b.q_indptr = {0, 4};
  expect_error("append_slots");
}
TEST_F(BadBatchFixture, CacheShapeMismatch) {
  KvCacheConfig kc = cache_config(cfg, 8);
  kc.num_layers = 3;
  KvCache other(kc);
  ForwardBatch e;
  e.q_indptr = {0};
  try {
    model.forward(e, other);
    ADD_FAILURE() << "no Error";
  } catch (const Error& err) {
    EXPECT_NE(std::string(err.what()).find("cache has 3 layers"), std::string::npos) << err.what();
  }
}

TEST(LlamaLoad, RejectsBadFiles) {
  const ModelConfig cfg = tiny_config("qwen2");
  auto expect = [](const ModelFile& f, const std::string& needle) {
    try {
      LlamaModel m(f);
      ADD_FAILURE() << "no Error for " << needle;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  ModelFile f = make_synthetic_model_file(cfg, 1);
  f.tensors.erase("model.layers.1.self_attn.k_proj.bias");
  expect(f, "model.layers.1.self_attn.k_proj.bias is missing");
  f = make_synthetic_model_file(cfg, 1);
  f.tensors["model.layers.0.mlp.up_proj.weight"] = Tensor::zeros({3, 4}, DType::f32);
  expect(f, "model.layers.0.mlp.up_proj.weight has shape [3, 4], expected [160, 64]");
  f = make_synthetic_model_file(cfg, 1);
  f.tensors["model.norm.weight"] = Tensor::zeros({64}, DType::bf16);
  expect(f, "model.norm.weight has dtype bf16");
  f = make_synthetic_model_file(cfg, 1);
  f.config.architecture = "gpt2";
  expect(f, "architecture 'gpt2'");
  f = make_synthetic_model_file(cfg, 1);
  f.config.num_kv_heads = 3;
  expect(f, "num_kv_heads");
  f = make_synthetic_model_file(cfg, 1);
  f.config.rope_scaling.type = "longrope";
  expect(f, "rope_scaling type 'longrope'");
}

TEST(LlamaLoad, CudaRunnerNotYetAvailable) {
  if (cuda_device_count() > 0)
    GTEST_SKIP() << "a CUDA device is present (test_llama_cuda.cpp covers it)";
  const ModelFile f = make_synthetic_model_file(tiny_config("llama"), 1);
  EXPECT_NE(create_model(f, Device::cpu), nullptr);
  try {
    create_model(f, Device::cuda);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("create_model: device cuda", 0), 0u) << e.what();
  }
}

TEST(LlamaSynthetic, SameSeedSameWeights) {
  const ModelConfig cfg = tiny_config("qwen3");
  const ModelFile a = make_synthetic_model_file(cfg, 9), b = make_synthetic_model_file(cfg, 9),
                  c = make_synthetic_model_file(cfg, 10);
  const Tensor& ta = a.tensors.at("model.layers.1.self_attn.q_norm.weight");
  const Tensor& tb = b.tensors.at("model.layers.1.self_attn.q_norm.weight");
  const Tensor& tc = c.tensors.at("model.layers.1.self_attn.q_norm.weight");
  EXPECT_EQ(std::memcmp(ta.data(), tb.data(), ta.nbytes()), 0);
  EXPECT_NE(std::memcmp(ta.data(), tc.data(), ta.nbytes()), 0);
  EXPECT_EQ(a.config.head_dim, 32);
}

}  // namespace
