// LlamaModel with reduced-precision KV caches (bf16, fp8 with calibrated scales) and the
// make_step_batch test helper.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <random>

#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"
#include "step_batch.h"
#include "test_llama_oracle.h"
#include "tiny_models.h"

using namespace pagedattn;

namespace {

// Qwen2's q/k/v biases (the K bias shifts what the cache holds).
ModelConfig small_config() { return pagedattn::testing::tiny_config("qwen2"); }

KvCacheConfig cache_config(const ModelConfig& c, DType dtype, int32_t pages) {
  KvCacheConfig k = pagedattn::testing::model_kv_config(c, pages, 8);
  k.dtype = dtype;
  return k;
}

std::vector<int32_t> tokens(int n, uint64_t seed) {
  return pagedattn::testing::random_tokens(n, small_config().vocab_size, seed);
}

// Prefill `toks` through a cache of `dtype`; max relative error of every row against the oracle.
double prefill_error(LlamaModel& model, const ModelFile& file, KvCache& cache,
                     const std::vector<int32_t>& toks) {
  const SeqId s = cache.create_sequence();
  Tensor l = model.forward(make_step_batch(cache, {s}, {toks}, true), cache);
  const auto want = test::NaiveLlama(file).logits(toks);
  double worst = 0.0;
  for (size_t r = 0; r < want.size(); ++r) {
    double err = 0.0, scale = 1.0;
    for (size_t i = 0; i < want[r].size(); ++i) {
      err =
          std::max(err, std::abs(double(l.data_as<float>()[r * want[r].size() + i]) - want[r][i]));
      scale = std::max(scale, std::abs(want[r][i]));
    }
    worst = std::max(worst, err / scale);
  }
  return worst;
}

TEST(LlamaKv, StepBatchHelperLaysOutRaggedSteps) {
  const ModelConfig cfg = small_config();
  KvCache cache(cache_config(cfg, DType::f32, 8));
  const SeqId a = cache.create_sequence(), b = cache.create_sequence();
  ForwardBatch first = make_step_batch(cache, {a, b}, {{1, 2, 3}, {4}});
  EXPECT_EQ(first.q_indptr, (std::vector<int32_t>{0, 3, 4}));
  EXPECT_EQ(first.positions, (std::vector<int32_t>{0, 1, 2, 0}));
  EXPECT_EQ(first.logit_rows, (std::vector<int32_t>{2, 3}));
  EXPECT_EQ(cache.kv_len(a), 3);
  ForwardBatch next = make_step_batch(cache, {b, a}, {{5, 6}, {7}}, true);
  EXPECT_EQ(next.positions, (std::vector<int32_t>{1, 2, 3}));
  EXPECT_EQ(next.logit_rows, (std::vector<int32_t>{0, 1, 2}));
  const auto table = cache.block_table(a);
  EXPECT_EQ(next.slots[2], table[0] * 8 + 3);
  // Too many pages: Error, and nothing reserved for either sequence.
  std::vector<int32_t> big(8 * 7, 1);
  EXPECT_THROW(make_step_batch(cache, {a, b}, {{1}, big}), Error);
  EXPECT_EQ(cache.kv_len(a), 4);
  EXPECT_EQ(cache.kv_len(b), 3);
  EXPECT_THROW(make_step_batch(cache, {a}, {}), Error);
}

TEST(LlamaKv, Bf16CacheStaysCloseToOracle) {
  const ModelConfig cfg = small_config();
  const ModelFile file = make_synthetic_model_file(cfg, 4);
  LlamaModel model(file);
  KvCache cache(cache_config(cfg, DType::bf16, 16));
  EXPECT_LT(prefill_error(model, file, cache, tokens(40, 1)), 2e-2);
}

TEST(LlamaKv, CalibrationMeasuresAbsMaxOfStoredKv) {
  const ModelConfig cfg = small_config();
  const ModelFile file = make_synthetic_model_file(cfg, 4);
  LlamaModel model(file);
  const std::vector<int32_t> toks = tokens(30, 2);
  const Model::KvAbsMax m = model.kv_absmax(toks);
  ASSERT_EQ(m.k.size(), 4u);
  // The same numbers read back from an f32 cache after a prefill.
  KvCache cache(cache_config(cfg, DType::f32, 8));
  const SeqId s = cache.create_sequence();
  model.forward(make_step_batch(cache, {s}, {toks}), cache);
  const auto table = cache.block_table(s);
  for (int32_t l = 0; l < 2; ++l) {
    const PagedKVView v = cache.layer_view(l);
    for (int32_t h = 0; h < 2; ++h) {
      float km = 0, vm = 0;
      for (int32_t p = 0; p < 30; ++p) {
        const int64_t off = v.offset(table[size_t(p / 8)], h, p % 8);
        for (int32_t d = 0; d < 16; ++d) {
          km = std::max(km, std::abs(static_cast<const float*>(v.k_pages)[off + d]));
          vm = std::max(vm, std::abs(static_cast<const float*>(v.v_pages)[off + d]));
        }
      }
      EXPECT_EQ(m.k[size_t(l * 2 + h)], km) << "layer " << l << " head " << h;
      EXPECT_EQ(m.v[size_t(l * 2 + h)], vm) << "layer " << l << " head " << h;
      EXPECT_GT(km, 0.f);
    }
  }
}

TEST(LlamaKv, Fp8CacheWithCalibratedScales) {
  const ModelConfig cfg = small_config();
  const ModelFile file = make_synthetic_model_file(cfg, 4);
  LlamaModel model(file);
  KvCache cache(cache_config(cfg, DType::fp8_e4m3, 16));
  const std::vector<int32_t> toks = tokens(40, 3);
  // Calibrating on the same text: every stored value is within the representable range.
  calibrate_kv_scales(model, cache, toks);
  EXPECT_TRUE(cache.scales_set());
  const Model::KvAbsMax m = model.kv_absmax(toks);
  const PagedKVView v = cache.layer_view(1);
  EXPECT_FLOAT_EQ(v.k_scale[1], m.k[3] * 1.25f / 448.f);
  EXPECT_FLOAT_EQ(v.v_scale[0], m.v[2] * 1.25f / 448.f);
  // e4m3 keeps 3 mantissa bits: a few percent, not garbage.
  const double err = prefill_error(model, file, cache, toks);
  EXPECT_LT(err, 0.15);
  EXPECT_GT(err, 1e-4);  // it really went through fp8
}

TEST(LlamaKv, CalibrationRejectsNonFp8Cache) {
  const ModelConfig cfg = small_config();
  LlamaModel model(make_synthetic_model_file(cfg, 4));
  KvCache cache(cache_config(cfg, DType::f32, 4));
  EXPECT_THROW(calibrate_kv_scales(model, cache, tokens(5, 1)), Error);
  EXPECT_THROW(model.kv_absmax({}), Error);
}

}  // namespace
