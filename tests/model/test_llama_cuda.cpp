// LlamaModelCuda (bf16, cuBLAS) against the CPU LlamaModel (fp32, the oracle) on synthetic
// weights: a ragged prefill then greedy decode steps, for each supported variant.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "model/step_batch.h"
#include "gpu_skip.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/llama_cuda.h"
#include "pagedattn/sampling.h"
#include "tiny_models.h"

using namespace pagedattn;

namespace {

// Head dims the CUDA attention kernels support (64, 128); hidden 256 so the GEMMs are not trivial.
ModelConfig gpu_config(const std::string& variant) {
  return pagedattn::testing::tiny_config(variant, pagedattn::testing::TinySize::gpu);
}

KvCacheConfig cache_config(const ModelConfig& c, Device device) {
  return pagedattn::testing::model_kv_config(c, 64, 16, device);
}

struct RowCheck {
  double rel_err = 0;
  bool argmax_clear = false;  // the CPU row's top-2 margin is clear of bf16 noise
  int32_t cpu_argmax = 0, gpu_argmax = 0;
};

RowCheck check_row(const float* cpu, const float* gpu, int32_t V) {
  RowCheck r;
  double num = 0, den = 0;
  for (int32_t i = 0; i < V; ++i) {
    num += double(cpu[i] - gpu[i]) * (cpu[i] - gpu[i]);
    den += double(cpu[i]) * cpu[i];
  }
  r.rel_err = std::sqrt(num / std::max(den, 1e-30));
  r.cpu_argmax = int32_t(std::max_element(cpu, cpu + V) - cpu);
  r.gpu_argmax = int32_t(std::max_element(gpu, gpu + V) - gpu);
  std::vector<float> sorted(cpu, cpu + V);
  std::partial_sort(sorted.begin(), sorted.begin() + 2, sorted.end(), std::greater<float>());
  const float range = sorted[0] - *std::min_element(cpu, cpu + V);
  r.argmax_clear = sorted[0] - sorted[1] > 0.05f * range;
  return r;
}

class LlamaCudaParity : public ::testing::TestWithParam<std::string> {};

TEST_P(LlamaCudaParity, RaggedPrefillThenGreedyDecode) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = gpu_config(GetParam());
  const ModelFile file = make_synthetic_model_file(cfg, 11);
  LlamaModel cpu(file);
  std::unique_ptr<Model> gpu = create_model(file, Device::cuda);
  ASSERT_EQ(gpu->device(), Device::cuda);
  KvCache cpu_cache(cache_config(cpu.config(), Device::cpu));
  KvCache gpu_cache(cache_config(cpu.config(), Device::cuda));

  std::mt19937 rng(3);
  const std::vector<int> lens = {5, 37, 1, 19};
  std::vector<SeqId> cs, gs;
  std::vector<std::vector<int32_t>> toks;
  for (int len : lens) {
    cs.push_back(cpu_cache.create_sequence());
    gs.push_back(gpu_cache.create_sequence());
    std::vector<int32_t> t(static_cast<size_t>(len));
    for (auto& x : t) x = int32_t(rng() % uint32_t(cfg.vocab_size));
    toks.push_back(t);
  }
  const int32_t V = cfg.vocab_size;
  int clear = 0, compared = 0;
  double worst = 0;
  for (int step = 0; step <= 8; ++step) {
    const ForwardBatch cb = make_step_batch(cpu_cache, cs, toks);
    const ForwardBatch gb = make_step_batch(gpu_cache, gs, toks);
    ASSERT_EQ(cb.slots, gb.slots);
    const Tensor cl = cpu.forward(cb, cpu_cache);
    const Tensor gl = gpu->forward(gb, gpu_cache);
    ASSERT_EQ(gl.device(), Device::cpu);
    ASSERT_EQ(gl.dtype(), DType::f32);
    ASSERT_EQ(gl.shape(), cl.shape());
    for (size_t s = 0; s < cs.size(); ++s) {
      cpu_cache.commit(cs[s]);
      gpu_cache.commit(gs[s]);
    }
    for (int64_t r = 0; r < cl.dim(0); ++r) {
      const RowCheck rc = check_row(cl.data_as<float>() + r * V, gl.data_as<float>() + r * V, V);
      EXPECT_LT(rc.rel_err, 2e-2) << GetParam() << " step " << step << " row " << r;
      worst = std::max(worst, rc.rel_err);
      ++compared;
      if (rc.argmax_clear) {
        ++clear;
        EXPECT_EQ(rc.gpu_argmax, rc.cpu_argmax) << GetParam() << " step " << step << " row " << r;
      }
      toks[size_t(r)] = {rc.cpu_argmax};  // both runners continue with the oracle's token
    }
  }
  std::printf("%s: worst row relative error %.2e, %d of %d rows with a clear greedy choice\n",
              GetParam().c_str(), worst, clear, compared);
  EXPECT_EQ(compared, 9 * int(lens.size()));
  EXPECT_GE(clear, compared / 4) << "too few rows with a clear greedy choice to compare";
}

INSTANTIATE_TEST_SUITE_P(Variants, LlamaCudaParity,
                         ::testing::Values("llama", "qwen2", "qwen3", "llama3", "mistral"));

// Batch invariance on CUDA: eight sequences decoded greedily together, and each of them alone
// (fed the batch's tokens). The attention kernels are bit-invariant (split fixed by position);
// the GEMMs are cuBLAS's, whose algorithm may change with the number of rows, so the logits must
// agree within bf16 rounding and the greedy choices wherever the margin is clear of it.
TEST(LlamaCuda, GreedyDecodeAloneEqualsInABatchOfEight) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = gpu_config("llama");
  const ModelFile file = make_synthetic_model_file(cfg, 17);
  std::unique_ptr<Model> gpu = create_model(file, Device::cuda);
  const int32_t V = cfg.vocab_size;
  constexpr int kSeqs = 8, kSteps = 10;
  std::mt19937 rng(8);
  std::vector<std::vector<int32_t>> prompts(kSeqs);
  for (auto& p : prompts) {
    p.resize(3 + rng() % 40);
    for (auto& x : p) x = int32_t(rng() % uint32_t(V));
  }
  // The batch: prefill all, then kSteps greedy steps; every row's logits kept.
  KvCacheConfig cc = cache_config(gpu->config(), Device::cuda);
  cc.num_pages = 128;
  KvCache batch_cache(cc);
  std::vector<SeqId> seqs;
  for (int s = 0; s < kSeqs; ++s) seqs.push_back(batch_cache.create_sequence());
  std::vector<std::vector<std::vector<float>>> batch_rows(kSeqs);  // [seq][step][V]
  std::vector<std::vector<int32_t>> fed(kSeqs);                    // [seq][step]
  std::vector<std::vector<int32_t>> work = prompts;
  for (int step = 0; step <= kSteps; ++step) {
    const Tensor l = gpu->forward(make_step_batch(batch_cache, seqs, work), batch_cache);
    for (int s = 0; s < kSeqs; ++s) {
      batch_cache.commit(seqs[size_t(s)]);
      const float* row = l.data_as<float>() + int64_t(s) * V;
      batch_rows[size_t(s)].emplace_back(row, row + V);
      const int32_t next = argmax(std::span<const float>(row, size_t(V)));
      fed[size_t(s)].push_back(next);
      work[size_t(s)] = {next};
    }
  }
  int clear = 0, compared = 0;
  double worst = 0;
  for (int s = 0; s < kSeqs; ++s) {
    KvCache alone_cache(cc);
    const SeqId a = alone_cache.create_sequence();
    std::vector<std::vector<int32_t>> w = {prompts[size_t(s)]};
    for (int step = 0; step <= kSteps; ++step) {
      const Tensor l = gpu->forward(make_step_batch(alone_cache, {a}, w), alone_cache);
      alone_cache.commit(a);
      const RowCheck rc =
          check_row(batch_rows[size_t(s)][size_t(step)].data(), l.data_as<float>(), V);
      worst = std::max(worst, rc.rel_err);
      EXPECT_LT(rc.rel_err, 1e-2) << "sequence " << s << " step " << step;
      ++compared;
      if (rc.argmax_clear) {
        ++clear;
        EXPECT_EQ(rc.gpu_argmax, rc.cpu_argmax) << "sequence " << s << " step " << step;
      }
      w = {{fed[size_t(s)][size_t(step)]}};
    }
  }
  std::printf("batch of 8 vs alone: worst row relative error %.2e, %d of %d greedy choices clear\n",
              worst, clear, compared);
  EXPECT_GE(clear, compared / 4) << "too few rows with a clear greedy choice to compare";
}

// Every logit row of a prefill (all_logits), not only the last ones.
TEST(LlamaCuda, AllLogitRowsMatchCpu) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = gpu_config("llama");
  const ModelFile file = make_synthetic_model_file(cfg, 5);
  LlamaModel cpu(file);
  LlamaModelCuda gpu(file);
  EXPECT_GT(gpu.weight_bytes(), size_t(cfg.num_layers) * 4 * 256 * 256 * 2);
  KvCache cpu_cache(cache_config(cpu.config(), Device::cpu));
  KvCache gpu_cache(cache_config(cpu.config(), Device::cuda));
  std::vector<int32_t> t(50);
  for (size_t i = 0; i < t.size(); ++i) t[i] = int32_t((i * 37 + 11) % 300);
  const ForwardBatch cb = make_step_batch(cpu_cache, {cpu_cache.create_sequence()}, {t}, true);
  const ForwardBatch gb = make_step_batch(gpu_cache, {gpu_cache.create_sequence()}, {t}, true);
  const Tensor cl = cpu.forward(cb, cpu_cache), gl = gpu.forward(gb, gpu_cache);
  ASSERT_EQ(gl.dim(0), 50);
  for (int64_t r = 0; r < 50; ++r) {
    const RowCheck rc =
        check_row(cl.data_as<float>() + r * 300, gl.data_as<float>() + r * 300, 300);
    EXPECT_LT(rc.rel_err, 2e-2) << "row " << r;
  }
}

// The message after "<runner>::forward" for a bad batch, or "" when nothing was thrown.
std::string forward_error(Model& m, const ForwardBatch& b, KvCache& cache) {
  try {
    m.forward(b, cache);
  } catch (const Error& e) {
    const std::string s = e.what();
    const size_t at = s.find("::forward");
    return at == std::string::npos ? s : s.substr(at);
  }
  return "";
}

TEST(LlamaCuda, BadBatchRaisesTheCpuErrors) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = gpu_config("llama");
  const ModelFile file = make_synthetic_model_file(cfg, 2);
  LlamaModel cpu(file);
  LlamaModelCuda gpu(file);
  KvCache cpu_cache(cache_config(cpu.config(), Device::cpu));
  KvCache gpu_cache(cache_config(cpu.config(), Device::cuda));
  const std::vector<std::vector<int32_t>> toks = {{1, 2, 3}, {4, 5}};
  const ForwardBatch cb =
      make_step_batch(cpu_cache, {cpu_cache.create_sequence(), cpu_cache.create_sequence()}, toks);
  const ForwardBatch gb =
      make_step_batch(gpu_cache, {gpu_cache.create_sequence(), gpu_cache.create_sequence()}, toks);
  using Edit = void (*)(ForwardBatch&);
  const std::vector<std::pair<std::string, Edit>> edits = {
      {"batch.positions[", [](ForwardBatch& b) { b.positions[1] += 1; }},
      {"batch.slots[", [](ForwardBatch& b) { b.slots[4] += 1; }},
      {"batch.tokens[", [](ForwardBatch& b) { b.tokens[0] = 300; }},
      {"batch.logit_rows[", [](ForwardBatch& b) { b.logit_rows[1] = 5; }},
      {"batch.q_indptr ends", [](ForwardBatch& b) { b.q_indptr[2] = 4; }},
      {"appears twice", [](ForwardBatch& b) { b.seqs[1] = b.seqs[0]; }},
      {"batch.positions has", [](ForwardBatch& b) { b.positions.pop_back(); }},
  };
  for (const auto& [what, edit] : edits) {
    ForwardBatch c = cb, g = gb;
    edit(c);
    edit(g);
    const std::string ce = forward_error(cpu, c, cpu_cache), ge = forward_error(gpu, g, gpu_cache);
    EXPECT_NE(ge.find(what), std::string::npos) << what << ": " << ge;
    EXPECT_EQ(ge, ce) << what;
  }
  // The unchanged batch still runs: the rejected ones left the caches usable.
  EXPECT_EQ(gpu.forward(gb, gpu_cache).dim(0), 2);
  // A CPU cache, or a f32 one, is not the CUDA model's.
  EXPECT_NE(forward_error(gpu, cb, cpu_cache).find("cache is on cpu"), std::string::npos);
  KvCacheConfig f32 = cache_config(cpu.config(), Device::cuda);
  f32.dtype = DType::f32;
  KvCache f32_cache(f32);
  const ForwardBatch fb = make_step_batch(f32_cache, {f32_cache.create_sequence()}, {{1}});
  EXPECT_NE(forward_error(gpu, fb, f32_cache).find("cache dtype is f32"), std::string::npos);
}

TEST(LlamaCuda, WithoutDeviceTheConstructorRaises) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  const ModelFile file = make_synthetic_model_file(gpu_config("llama"), 1);
  try {
    LlamaModelCuda m(file);
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("LlamaModelCuda: ", 0), 0u) << e.what();
  }
  EXPECT_THROW(create_model(file, Device::cuda), Error);
}

}  // namespace
