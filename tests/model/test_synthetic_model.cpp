// Synthetic models: the named presets and their parsing, the hashed weights (deterministic, in
// range, independent per tensor and seed, the same as the device fill's formula), and the CPU
// runner (small presets run, forward_greedy is the argmax of forward; Llama-3-8B is refused before
// anything is allocated).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <string>
#include <vector>

#include "default_model.h"
#include "model/synthetic_fill.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/sample_plan.h"
#include "pagedattn/sampling.h"
#include "pagedattn/synthetic_model.h"
#include "step_batch.h"

using namespace pagedattn;

namespace {

std::string error_of(void (*f)()) {
  try {
    f();
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

TEST(SyntheticPresets, Llama3_8bHasTheCheckpointsShapes) {
  const ModelConfig c = synthetic_model_config("synthetic:llama3-8b");
  EXPECT_EQ(c.architecture, "llama");
  EXPECT_EQ(c.num_layers, 32);
  EXPECT_EQ(c.hidden_size, 4096);
  EXPECT_EQ(c.num_q_heads, 32);
  EXPECT_EQ(c.num_kv_heads, 8);
  EXPECT_EQ(c.head_dim, 128);
  EXPECT_EQ(c.intermediate_size, 14336);
  EXPECT_EQ(c.vocab_size, 128256);
  EXPECT_FLOAT_EQ(c.rope_theta, 500000.f);
  EXPECT_EQ(c.rope_scaling.type, "");
  EXPECT_FALSE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  // Meta-Llama-3-8B has 8,030,261,248 parameters.
  EXPECT_EQ(synthetic_param_count(c), 8030261248);
}

TEST(SyntheticPresets, SmolLM2HasTheDefaultModelsShapes) {
  const ModelConfig c = synthetic_model_config("synthetic:smollm2-135m");
  EXPECT_EQ(c.num_layers, 30);
  EXPECT_EQ(c.hidden_size, 576);
  EXPECT_EQ(c.num_q_heads, 9);
  EXPECT_EQ(c.num_kv_heads, 3);
  EXPECT_EQ(c.head_dim, 64);
  EXPECT_EQ(c.intermediate_size, 1536);
  EXPECT_EQ(c.vocab_size, 49152);
  EXPECT_FLOAT_EQ(c.rope_theta, 100000.f);
  EXPECT_TRUE(c.tie_word_embeddings);
  EXPECT_EQ(c.max_position_embeddings, 8192);
  EXPECT_EQ(synthetic_param_count(c), 134515008);  // SmolLM2-135M
}

TEST(SyntheticPresets, EveryPresetIsAValidLlamaConfig) {
  ASSERT_GE(synthetic_presets().size(), 3u);
  for (const SyntheticPreset& p : synthetic_presets()) {
    ModelConfig c = synthetic_model_config(std::string(kSyntheticPrefix) + p.name);
    const int32_t head_dim = c.head_dim;
    EXPECT_NO_THROW(check_llama_config(c, "test")) << p.name;
    EXPECT_EQ(c.head_dim, head_dim) << p.name;
    EXPECT_FALSE(p.description.empty()) << p.name;
  }
}

TEST(SyntheticPresets, Llama3_70bHasItsParameterCount) {
  const ModelConfig c = synthetic_model_config("synthetic:llama3-70b");
  EXPECT_EQ(c.num_layers, 80);
  EXPECT_EQ(c.num_kv_heads, 8);
  // Meta-Llama-3-70B: 70,553,706,496 parameters (embeddings and lm_head untied).
  EXPECT_EQ(synthetic_param_count(c), 70553706496);
}

TEST(SyntheticPresets, NamesAreRecognisedByTheirPrefix) {
  EXPECT_TRUE(is_synthetic_model("synthetic:llama3-8b"));
  EXPECT_TRUE(is_synthetic_model("synthetic:whatever"));
  EXPECT_FALSE(is_synthetic_model(kDefaultModelPath));
  EXPECT_FALSE(is_synthetic_model("llama3-8b"));
  EXPECT_FALSE(is_synthetic_model("Synthetic:llama3-8b"));
}

TEST(SyntheticPresets, AnUnknownNameListsTheKnownOnes) {
  for (auto f :
       {+[] { synthetic_model_config("synthetic:llama3-405b"); },
        +[] { synthetic_model_config("synthetic:"); }, +[] { synthetic_model_config("llama3-8b"); },
        +[] { create_synthetic_model("synthetic:nope", Device::cpu); }}) {
    const std::string e = error_of(f);
    ASSERT_FALSE(e.empty()) << "no Error";
    for (const char* name : {"synthetic:llama3-8b", "synthetic:llama3-70b", "synthetic:smollm2-135m",
                             "synthetic:tiny"}) {
      EXPECT_NE(e.find(name), std::string::npos) << e;
    }
  }
  EXPECT_NE(error_of(+[] {
              synthetic_model_config("synthetic:llama3-405b");
            }).find("'synthetic:llama3-405b' is not a known preset"),
            std::string::npos);
}

TEST(SyntheticCpu, Llama3_8bIsRefusedWithAClearError) {
  const std::string e =
      error_of(+[] { create_synthetic_model("synthetic:llama3-8b", Device::cpu); });
  EXPECT_NE(e.find("synthetic:llama3-8b needs 29.9 GiB of f32 weights"), std::string::npos) << e;
  EXPECT_NE(e.find("use --device cuda"), std::string::npos) << e;
  EXPECT_FALSE(error_of(+[] { make_synthetic_preset_file("synthetic:llama3-8b"); }).empty());
}

// A CPU cache of num_pages 16-token pages for model m.
KvCacheConfig cpu_cache_config(const Model& m, int32_t num_pages) {
  KvCacheConfig kc;
  kc.num_layers = m.config().num_layers;
  kc.num_kv_heads = m.config().num_kv_heads;
  kc.head_dim = m.config().head_dim;
  kc.num_pages = num_pages;
  kc.page_size = 16;
  return kc;
}

TEST(SyntheticCpu, TinyPresetRunsAndRepeats) {
  const std::unique_ptr<Model> a = create_synthetic_model("synthetic:tiny", Device::cpu);
  const std::unique_ptr<Model> b = create_synthetic_model("synthetic:tiny", Device::cpu);
  ASSERT_EQ(a->device(), Device::cpu);
  EXPECT_EQ(a->config().num_layers, synthetic_model_config("synthetic:tiny").num_layers);
  std::vector<std::vector<float>> logits;
  for (Model* m : {a.get(), b.get()}) {
    KvCache cache(cpu_cache_config(*m, 8));
    const SeqId s = cache.create_sequence();
    const Tensor l = m->forward(make_step_batch(cache, {s}, {{1, 2, 3, 500}}), cache);
    ASSERT_EQ(l.shape(), (std::vector<int64_t>{1, 512}));
    logits.emplace_back(l.data_as<float>(), l.data_as<float>() + l.numel());
  }
  for (float v : logits[0]) ASSERT_TRUE(std::isfinite(v));
  EXPECT_EQ(logits[0], logits[1]);
  EXPECT_GT(*std::max_element(logits[0].begin(), logits[0].end()),
            *std::min_element(logits[0].begin(), logits[0].end()));
}

// Model::forward_greedy (the default: forward, then the host argmax) gives, per logit row, the
// argmax of forward's logits for the same batch: a ragged prefill with every row's logits, then
// greedy decode steps. Each batch runs twice on one cache; the second run rewrites the same K/V.
TEST(SyntheticCpu, ForwardGreedyIsTheArgmaxOfForward) {
  const std::unique_ptr<Model> m = create_synthetic_model("synthetic:tiny", Device::cpu);
  const int64_t V = m->config().vocab_size;
  KvCache cache(cpu_cache_config(*m, 16));
  std::vector<SeqId> seqs;
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < 3; ++s) {
    seqs.push_back(cache.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < 3 + 7 * s; ++i) t.push_back(int32_t((i * 53 + s * 19 + 2) % V));
    toks.push_back(t);
  }
  for (int step = 0; step < 4; ++step) {
    const ForwardBatch b = make_step_batch(cache, seqs, toks, /*all_logits=*/step == 0);
    const std::vector<int32_t> ids = m->forward_greedy(b, cache);
    const Tensor logits = m->forward(b, cache);
    ASSERT_EQ(ids.size(), b.logit_rows.size());
    ASSERT_EQ(logits.dim(0), int64_t(ids.size()));
    for (size_t r = 0; r < ids.size(); ++r) {
      const std::span<const float> row(logits.data_as<float>() + int64_t(r) * V, size_t(V));
      EXPECT_EQ(ids[r], argmax(row)) << "step " << step << " row " << r;
    }
    for (SeqId s : seqs) cache.commit(s);
    for (size_t s = 0; s < seqs.size(); ++s) {  // each sequence continues with its last row's id
      const auto it = std::find(b.logit_rows.begin(), b.logit_rows.end(), b.q_indptr[s + 1] - 1);
      ASSERT_NE(it, b.logit_rows.end());
      toks[s] = {ids[size_t(it - b.logit_rows.begin())]};
    }
  }
  ForwardBatch b = make_step_batch(cache, seqs, toks);
  b.logit_rows.clear();
  EXPECT_TRUE(m->forward_greedy(b, cache).empty());
}

// Model's default begin_sample / finish_sample: forward_sample in finish_sample (the same tokens
// and logprobs as a call of its own), and finish_sample without a begin_sample refused.
TEST(SyntheticCpu, BeginAndFinishSampleAreForwardSample) {
  const std::unique_ptr<Model> m = create_synthetic_model("synthetic:tiny", Device::cpu);
  const int32_t V = m->config().vocab_size;
  KvCache cache(cpu_cache_config(*m, 16));
  const SeqId s = cache.create_sequence();
  const ForwardBatch b = make_step_batch(cache, {s}, {{5, 9, 2, 7}});
  SamplingParams p;
  p.temperature = 0.9f, p.top_k = 20, p.repetition_penalty = 1.2f, p.logprobs = 3, p.seed = 4;
  LogitEditor editor(p, std::vector<int32_t>{5, 9, 2, 7});
  SamplePlan plan;
  plan.rows.push_back(row_sampling(p, 0, p.logprobs));
  plan.edits = editor.edits();
  plan.rows[0].edit_end = int32_t(plan.edits.size());
  EXPECT_THROW(m->finish_sample(plan), Error);
  const std::vector<TokenLogprobs> want = m->forward_sample(b, cache, plan);
  m->begin_sample(b, cache);
  const std::vector<TokenLogprobs> got = m->finish_sample(plan);
  ASSERT_EQ(got.size(), 1u);
  EXPECT_EQ(got[0].token, want[0].token);
  EXPECT_EQ(got[0].logprob, want[0].logprob);
  EXPECT_EQ(got[0].top, want[0].top);
  EXPECT_TRUE(got[0].token >= 0 && got[0].token < V);
  EXPECT_THROW(m->finish_sample(plan), Error);  // one finish for each begin
}

TEST(SyntheticCpu, SmolLM2PresetFileHasEveryTensorOfItsShape) {
  const ModelFile f = make_synthetic_preset_file("synthetic:smollm2-135m");
  EXPECT_EQ(f.path, "synthetic:smollm2-135m");
  EXPECT_EQ(f.tensors.count("lm_head.weight"), 0u);  // tied
  EXPECT_EQ(f.tensors.at("model.layers.29.mlp.down_proj.weight").shape(),
            (std::vector<int64_t>{576, 1536}));
  EXPECT_NO_THROW(LlamaModel m(f));
}

ModelConfig variant_config(bool bias, bool qk_norm, bool tied) {
  ModelConfig c;
  c.architecture = qk_norm ? "qwen3" : (bias ? "qwen2" : "llama");
  c.vocab_size = 64;
  c.hidden_size = 32;
  c.intermediate_size = 48;
  c.num_layers = 3;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.attention_bias = bias;
  c.qk_norm = qk_norm;
  c.tie_word_embeddings = tied;
  return c;
}

TEST(SyntheticTensors, IdsAreDistinctAndShapesMatchTheConfig) {
  ModelConfig c = variant_config(true, true, false);
  c.head_dim = 8;
  const std::vector<SyntheticTensor> ts = synthetic_tensors(c);
  // embed, norm, lm_head, then 14 per layer (9 + 3 biases + 2 norms).
  ASSERT_EQ(ts.size(), 3u + 3 * 14);
  std::vector<uint32_t> ids;
  for (const SyntheticTensor& t : ts) ids.push_back(t.id);
  std::sort(ids.begin(), ids.end());
  EXPECT_EQ(std::adjacent_find(ids.begin(), ids.end()), ids.end()) << "an id is used twice";
  ModelFile f = make_hashed_synthetic_model_file(c, 1);
  EXPECT_EQ(f.tensors.size(), ts.size());
  EXPECT_NO_THROW(LlamaModel m(f));
  c.head_dim = 0;
  EXPECT_THROW(synthetic_tensors(c), Error);
}

TEST(SyntheticTensors, HashedValuesFollowTheScaleRules) {
  const ModelConfig c = variant_config(true, true, false);
  const ModelFile f = make_hashed_synthetic_model_file(c, 42);
  EXPECT_EQ(f.config.head_dim, 8);  // resolved from hidden / heads
  for (const SyntheticTensor& t : synthetic_tensors(f.config)) {
    const Tensor& w = f.tensors.at(t.name);
    ASSERT_EQ(w.shape(), t.shape) << t.name;
    const float* p = w.data_as<float>();
    double sum = 0;
    const uint64_t key = synthetic::tensor_key(42, t.id);
    for (int64_t i = 0; i < w.numel(); ++i) {
      ASSERT_GE(p[i], t.center - t.half_width) << t.name;
      ASSERT_LE(p[i], t.center + t.half_width) << t.name;
      ASSERT_EQ(p[i], synthetic::value(key, uint64_t(i), t.center, t.half_width)) << t.name;
      sum += p[i];
    }
    if (w.numel() >= 1000) {  // the mean of n uniforms: within 5 standard errors of the center
      const double se = t.half_width / std::sqrt(3.0 * double(w.numel()));
      EXPECT_NEAR(sum / double(w.numel()), t.center, 5 * se) << t.name;
    }
  }
  for (const SyntheticTensor& t : synthetic_tensors(f.config)) {
    if (t.name == "model.embed_tokens.weight") {
      EXPECT_EQ(t.center, 0.f);
      EXPECT_EQ(t.half_width, 1.f);
    }
    if (t.name == "model.layers.0.self_attn.q_proj.weight") {
      EXPECT_EQ(t.half_width, float(std::sqrt(3.0 / 32)));  // 3 / in
    }
    if (t.name == "model.layers.0.mlp.down_proj.weight") {
      EXPECT_EQ(t.half_width, float(std::sqrt(3.0 / 48)));
    }
    if (t.name == "model.norm.weight") {
      EXPECT_EQ(t.center, 1.f);
      EXPECT_EQ(t.half_width, 0.2f);
    }
    if (t.name == "model.layers.2.self_attn.v_proj.bias") {
      EXPECT_EQ(t.center, 0.f);
      EXPECT_EQ(t.half_width, 0.5f);
    }
  }
}

TEST(SyntheticTensors, HashedWeightsAreDeterministicAndIndependent) {
  const ModelConfig c = variant_config(false, false, true);
  const ModelFile a = make_hashed_synthetic_model_file(c, 9),
                  b = make_hashed_synthetic_model_file(c, 9),
                  d = make_hashed_synthetic_model_file(c, 10);
  const std::string q0 = "model.layers.0.self_attn.q_proj.weight";
  const std::string q1 = "model.layers.1.self_attn.q_proj.weight";
  auto same = [](const Tensor& x, const Tensor& y) {
    return std::equal(x.data_as<float>(), x.data_as<float>() + x.numel(), y.data_as<float>());
  };
  for (const auto& [name, t] : a.tensors) EXPECT_TRUE(same(t, b.tensors.at(name))) << name;
  EXPECT_FALSE(same(a.tensors.at(q0), d.tensors.at(q0)));  // another seed
  EXPECT_FALSE(same(a.tensors.at(q0), a.tensors.at(q1)));  // another layer
  // The hash is counter-based: a value does not depend on the tensor's size.
  const uint64_t key = synthetic::tensor_key(9, 17);
  EXPECT_EQ(a.tensors.at(q0).data_as<float>()[100],
            synthetic::value(key, 100, 0.f, float(std::sqrt(3.0 / 32))));
}

}  // namespace
