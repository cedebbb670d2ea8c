// LlamaModelCuda built from a config and a seed (weights generated on the device): finite logits,
// the same logits from two builds with the same seed, the same weights as the host file of hashed
// values (bit-identical logits) and the CPU model on that file within bf16 tolerance; logits
// returned from reused page-locked buffers are never overwritten while the caller holds them.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <string>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/llama_cuda.h"
#include "pagedattn/synthetic_model.h"
#include "gpu_skip.h"

using namespace pagedattn;

namespace {

ModelConfig tiny_config(const std::string& variant) {
  ModelConfig c;
  c.architecture = "llama";
  c.vocab_size = 300;
  c.hidden_size = 256;
  c.intermediate_size = 512;
  c.num_layers = 2;
  c.num_q_heads = 4;
  c.num_kv_heads = 2;
  c.head_dim = 64;
  c.rope_theta = 500000.f;
  if (variant == "qwen2") {  // q/k/v biases, tied embeddings
    c.architecture = "qwen2";
    c.attention_bias = true;
    c.tie_word_embeddings = true;
  } else if (variant == "qwen3") {  // q/k norms, head_dim 128 != hidden / heads
    c.architecture = "qwen3";
    c.qk_norm = true;
    c.head_dim = 128;
  }
  return c;
}

KvCacheConfig cache_config(const ModelConfig& c, Device device) {
  KvCacheConfig k;
  k.num_layers = c.num_layers;
  k.num_kv_heads = c.num_kv_heads;
  k.head_dim = c.head_dim;
  k.page_size = 16;
  k.num_pages = 32;
  k.dtype = device == Device::cuda ? DType::bf16 : DType::f32;
  k.device = device;
  k.enable_prefix_cache = false;
  return k;
}

// A ragged prefill of three sequences, then three decode steps of fixed tokens, on a fresh cache
// (on the model's device): the logits of every step, rows concatenated.
std::vector<float> run(Model& m) {
  KvCache cache(cache_config(m.config(), m.device()));
  std::vector<SeqId> seqs;
  std::vector<std::vector<int32_t>> toks;
  const std::vector<int> lens = {7, 20, 1};
  for (size_t s = 0; s < lens.size(); ++s) {
    seqs.push_back(cache.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < lens[s]; ++i) t.push_back(int32_t((i * 31 + int(s) * 7 + 3) % 300));
    toks.push_back(t);
  }
  std::vector<float> out;
  for (int step = 0; step < 4; ++step) {
    const Tensor l = m.forward(make_forward_batch(cache, seqs, toks), cache);
    EXPECT_EQ(l.shape(), (std::vector<int64_t>{3, m.config().vocab_size}));
    out.insert(out.end(), l.data_as<float>(), l.data_as<float>() + l.numel());
    for (SeqId s : seqs) cache.commit(s);
    for (size_t s = 0; s < toks.size(); ++s) toks[s] = {int32_t((step * 13 + int(s)) % 300)};
  }
  return out;
}

double rel_err(const std::vector<float>& ref, const std::vector<float>& got) {
  double num = 0, den = 0;
  for (size_t i = 0; i < ref.size(); ++i) {
    num += double(ref[i] - got[i]) * (ref[i] - got[i]);
    den += double(ref[i]) * ref[i];
  }
  return std::sqrt(num / std::max(den, 1e-30));
}

class LlamaCudaSynthetic : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCudaSynthetic, FiniteRepeatableAndEqualToTheHashedFile) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config(GetParam());
  LlamaModelCuda a(cfg, 5), b(cfg, 5), other(cfg, 6);
  const std::vector<float> la = run(a), lb = run(b), lo = run(other);
  ASSERT_EQ(la.size(), 4u * 3 * 300);
  for (size_t i = 0; i < la.size(); ++i) ASSERT_TRUE(std::isfinite(la[i])) << "logit " << i;
  EXPECT_EQ(std::memcmp(la.data(), lb.data(), la.size() * 4), 0) << "same seed, other logits";
  EXPECT_GT(rel_err(la, lo), 0.1) << "seeds 5 and 6 gave (nearly) the same model";

  // The device fill is the host hash rounded to bf16: the same weights as the file's.
  const ModelFile file = make_hashed_synthetic_model_file(cfg, 5);
  LlamaModelCuda from_file(file);
  EXPECT_EQ(from_file.weight_bytes(), a.weight_bytes());
  const std::vector<float> lf = run(from_file);
  EXPECT_EQ(std::memcmp(la.data(), lf.data(), la.size() * 4), 0) << "device fill != host hash";
  LlamaModel cpu(file);
  const std::vector<float> lc = run(cpu);
  const double err = rel_err(lc, la);
  std::printf("%s: relative error against the CPU model %.2e\n", GetParam().c_str(), err);
  EXPECT_LT(err, 2e-2);
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaCudaSynthetic,
                         ::testing::Values("llama", "qwen2", "qwen3"));

TEST(LlamaCudaSynthetic, StepWeightBytesLeaveOutAnUntiedEmbedding) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig untied = tiny_config("llama"), tied = tiny_config("qwen2");
  const LlamaModelCuda u(untied, 1), t(tied, 1);
  const size_t embed = size_t(untied.vocab_size) * size_t(untied.hidden_size) * 2;
  EXPECT_EQ(u.step_weight_bytes(), u.weight_bytes() - embed);
  EXPECT_EQ(t.step_weight_bytes(), t.weight_bytes());
  // bf16 matrices: embed, lm_head, per layer qkv (256 + 2 * 128 rows), o, gate/up, down; f32 norms.
  const size_t layer = (512 * 256 + 256 * 256 + 2 * 512 * 256 + 256 * 512) * 2 + 2 * 256 * 4;
  EXPECT_EQ(u.weight_bytes(), 2 * embed + 2 * layer + 256 * 4);
}

// Logits come back in page-locked buffers that are reused: one the caller still holds must not
// be written by the next step.
TEST(LlamaCudaSynthetic, HeldLogitsAreNotOverwritten) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config("llama");
  LlamaModelCuda m(cfg, 3);
  KvCache cache(cache_config(cfg, Device::cuda));
  const SeqId s = cache.create_sequence();
  std::vector<Tensor> held;
  std::vector<std::vector<float>> copies;
  std::vector<std::vector<int32_t>> toks = {{1, 2, 3, 4}};
  for (int step = 0; step < 6; ++step) {  // more steps than there are pinned buffers
    held.push_back(m.forward(make_forward_batch(cache, {s}, toks), cache));
    cache.commit(s);
    copies.emplace_back(held.back().data_as<float>(), held.back().data_as<float>() + 300);
    toks = {{int32_t(10 + step)}};
  }
  for (size_t i = 0; i < held.size(); ++i) {
    EXPECT_EQ(std::memcmp(held[i].data(), copies[i].data(), 300 * 4), 0) << "step " << i;
    if (i > 0) {
      EXPECT_NE(held[i].data(), held[i - 1].data());
    }
  }
  held.clear();  // every buffer free again: the next result reuses one
  EXPECT_EQ(m.forward(make_forward_batch(cache, {s}, toks), cache).dim(0), 1);
}

TEST(LlamaCudaSynthetic, SmolLM2PresetRunsOnTheDevice) {
  PA_SKIP_WITHOUT_GPU();
  const std::unique_ptr<Model> m = create_synthetic_model("synthetic:smollm2-135m", Device::cuda);
  ASSERT_EQ(m->device(), Device::cuda);
  const ModelConfig& c = m->config();
  EXPECT_EQ(c.num_layers, 30);
  KvCache cache(cache_config(c, Device::cuda));
  const SeqId s = cache.create_sequence();
  std::vector<int32_t> prompt(40);
  for (size_t i = 0; i < prompt.size(); ++i) prompt[i] = int32_t(i * 997 % 49152);
  const Tensor l = m->forward(make_forward_batch(cache, {s}, {prompt}), cache);
  ASSERT_EQ(l.shape(), (std::vector<int64_t>{1, 49152}));
  for (int64_t i = 0; i < l.numel(); ++i) ASSERT_TRUE(std::isfinite(l.data_as<float>()[i]));
}

TEST(LlamaCudaSynthetic, WithoutDeviceTheConstructorRaises) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  try {
    LlamaModelCuda m(tiny_config("llama"), 1);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("LlamaModelCuda: ", 0), 0u) << e.what();
  }
  EXPECT_THROW(create_synthetic_model("synthetic:llama3-8b", Device::cuda), Error);
}

TEST(LlamaCudaSynthetic, BadConfigRaisesBeforeTouchingTheDevice) {
  ModelConfig c = tiny_config("llama");
  c.num_kv_heads = 3;  // 4 query heads
  try {
    LlamaModelCuda m(c, 1);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("LlamaModelCuda: num_q_heads (4) is not a multiple of "
                                         "num_kv_heads (3)"),
              std::string::npos)
        << e.what();
  }
}

}  // namespace
