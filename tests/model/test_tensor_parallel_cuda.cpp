// Tensor parallelism on GPUs, in one process with a thread per rank (NCCL allows it): a world of
// one gives bit-identical logits to the plain runner; two ranks on two GPUs give the single-GPU
// logits within bf16 tolerance and the same greedy tokens, for every architecture variant
// (q/k/v biases, tied embeddings, q/k norms with a replicated KV head, a sliding window, an odd
// vocabulary) and for Llama-3-8B's layer shapes. The process-level group (spawned workers, the
// control link) runs in scripts/device/tensor-parallel.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <random>
#include <thread>

#include "../model/step_batch.h"
#include "gpu_skip.h"
#include "pagedattn/llama_cuda.h"
#include "pagedattn/synthetic_model.h"
#include "pagedattn/tensor_parallel.h"
#include "tiny_models.h"
#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/nccl_comm.h"
#include "tp_ranks.h"
#endif

using namespace pagedattn;

namespace {

#ifdef PAGEDATTN_HAVE_CUDA

#define SKIP_WITHOUT_NCCL()                                        \
  do {                                                             \
    std::string why;                                               \
    if (!cuda::nccl_available(&why)) GTEST_SKIP() << why;          \
  } while (0)

ModelConfig gpu_config(const std::string& variant) {
  ModelConfig c = pagedattn::testing::tiny_config(variant, pagedattn::testing::TinySize::gpu);
  if (c.head_dim == 0) c.head_dim = c.hidden_size / c.num_q_heads;
  return c;
}

KvCacheConfig cache_for(const ModelConfig& c, int32_t kv_heads) {
  KvCacheConfig k = pagedattn::testing::model_kv_config(c, 64, 16, Device::cuda);
  k.num_kv_heads = kv_heads;
  return k;
}

// Rows of logits as host vectors.
std::vector<std::vector<float>> rows_of(const Tensor& t) {
  std::vector<std::vector<float>> out;
  for (int64_t r = 0; r < t.dim(0); ++r)
    out.emplace_back(t.data_as<float>() + r * t.dim(1), t.data_as<float>() + (r + 1) * t.dim(1));
  return out;
}

// The steps every test runs: a ragged prefill of two sequences, then `decode` greedy steps.
struct Script {
  std::vector<std::vector<int32_t>> prompts;
  int32_t decode = 4;
};

Script make_script(int32_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  Script s;
  for (int32_t len : {23, 9}) {
    std::vector<int32_t> p;
    for (int32_t i = 0; i < len; ++i) p.push_back(int32_t(g() % uint32_t(vocab)));
    s.prompts.push_back(p);
  }
  return s;
}

// Runs the script: batches are built on `cache0` (rank 0's, which holds the sequences) and run by
// `run` (every rank at once), which returns rank 0's logits. Returns the logits of every step.
template <class Run>
std::vector<std::vector<std::vector<float>>> play(const Script& s, KvCache& cache0, Run&& run) {
  std::vector<std::vector<std::vector<float>>> steps;
  std::vector<SeqId> seqs;
  for (size_t i = 0; i < s.prompts.size(); ++i) seqs.push_back(cache0.create_sequence());
  ForwardBatch b = make_step_batch(cache0, seqs, s.prompts);
  for (int32_t step = 0; step <= s.decode; ++step) {
    const std::vector<std::vector<float>> logits = rows_of(run(b));
    for (SeqId q : seqs) cache0.commit(q);
    steps.push_back(logits);
    if (step == s.decode) break;
    std::vector<std::vector<int32_t>> next;
    for (const auto& row : logits)
      next.push_back({int32_t(std::max_element(row.begin(), row.end()) - row.begin())});
    b = make_step_batch(cache0, seqs, next);
  }
  return steps;
}

TEST(TensorParallelCuda, WorldOfOneIsBitIdentical) {
  PA_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_NCCL();
  for (const char* variant : {"llama", "qwen2", "qwen3"}) {
    SCOPED_TRACE(variant);
    const ModelConfig c = gpu_config(variant);
    const Script s = make_script(c.vocab_size, 5);
    LlamaModelCuda plain(c, 11);
    KvCache plain_cache(cache_for(c, c.num_kv_heads));
    const auto want = play(s, plain_cache, [&](const ForwardBatch& b) {
      return plain.forward(b, plain_cache);
    });
    cuda::NcclComm comm(cuda::nccl_unique_id(), 1, 0);
    LlamaModelCuda one(c, 11, TpShard{0, 1}, &comm);
    KvCache one_cache(cache_for(c, one.num_local_kv_heads()));
    const auto got = play(s, one_cache, [&](const ForwardBatch& b) {
      return one.forward(b, one_cache);
    });
    ASSERT_EQ(got.size(), want.size());
    for (size_t i = 0; i < got.size(); ++i) EXPECT_EQ(got[i], want[i]) << "step " << i;
  }
}

// Two ranks on GPUs 0 and 1 against the plain runner on GPU 0. The ranks' products sum in
// another order (and cuBLAS picks other kernels for the narrower matrices), which moves the bf16
// roundings of the activations: logits agree within bf16's relative step (2^-7), greedy tokens
// exactly.
// from_file: the ranks slice a host file of the same weights (the loader's path for checkpoints:
// bf16 matrices copied as stored, f32 vectors) instead of filling their slices on the device.
void expect_two_ranks_match_one(const ModelConfig& c, float tol, bool from_file = false) {
  const Script s = make_script(c.vocab_size, 9);
  cudaSetDevice(0);
  std::vector<std::vector<std::vector<float>>> want;
  {
    LlamaModelCuda plain(c, 21);
    KvCache cache(cache_for(c, c.num_kv_heads));
    want = play(s, cache, [&](const ForwardBatch& b) { return plain.forward(b, cache); });
  }
  const cuda::NcclId id = cuda::nccl_unique_id();
  std::unique_ptr<cuda::NcclComm> comm[2];
  std::unique_ptr<LlamaModelCuda> model[2];
  std::unique_ptr<KvCache> cache[2];
  auto on_each_rank = [&](auto&& f) { pagedattn::testing::on_two_ranks(comm, f); };
  // The matrices as bf16 host tensors (as a checkpoint stores them; their values are the ones the
  // device rounds the f32 weights to), the vectors f32.
  ModelFile file;
  if (from_file) {
    file = make_hashed_synthetic_model_file(c, 21);
    for (auto& [name, t] : file.tensors) {
      if (t.shape().size() != 2) continue;
      Tensor b = Tensor::empty(t.shape(), DType::bf16);
      for (int64_t i = 0; i < t.numel(); ++i)
        b.data_as<uint16_t>()[i] = f32_to_bf16(t.data_as<float>()[i]);
      t = std::move(b);
    }
  }
  on_each_rank([&](int r) {
    comm[r] = std::make_unique<cuda::NcclComm>(id, 2, r);
    model[r] = from_file
                   ? std::make_unique<LlamaModelCuda>(file, TpShard{r, 2}, comm[r].get())
                   : std::make_unique<LlamaModelCuda>(c, 21, TpShard{r, 2}, comm[r].get());
    cache[r] = std::make_unique<KvCache>(cache_for(c, model[r]->num_local_kv_heads()));
    // NOTE: two ranks in one process: plain launches (the process-level runs, one rank per
    // process as the CLI starts them, replay CUDA graphs: scripts/device/tensor-parallel.sh).
    model[r]->set_cuda_graphs(false);
  });
  const auto got = play(s, *cache[0], [&](const ForwardBatch& b) {
    Tensor logits;
    on_each_rank([&](int r) {
      if (r == 0) {
        logits = model[0]->forward(b, *cache[0]);
      } else {
        model[1]->forward_device(b, *cache[1]);
        cudaDeviceSynchronize();
      }
    });
    return logits;
  });
  ASSERT_EQ(got.size(), want.size());
  int compared = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    ASSERT_EQ(got[i].size(), want[i].size());
    for (size_t r = 0; r < got[i].size(); ++r) {
      const auto& g = got[i][r];
      const auto& w = want[i][r];
      float scale = 1.f, diff = 0.f;
      for (size_t v = 0; v < w.size(); ++v) {
        scale = std::max(scale, std::abs(w[v]));
        diff = std::max(diff, std::abs(g[v] - w[v]));
      }
      EXPECT_LE(diff / scale, tol) << "step " << i << " row " << r;
      const auto gi = std::max_element(g.begin(), g.end()) - g.begin();
      const auto wi = std::max_element(w.begin(), w.end()) - w.begin();
      EXPECT_EQ(gi, wi) << "greedy token of step " << i << " row " << r;
      ++compared;
    }
  }
  EXPECT_EQ(compared, int(s.prompts.size()) * (s.decode + 1));
}

TEST(TensorParallelCuda, TwoRanksMatchOneGpu) {
  PA_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_NCCL();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  for (const char* variant : {"llama", "qwen2", "qwen3", "mistral"}) {
    SCOPED_TRACE(variant);
    expect_two_ranks_match_one(gpu_config(variant), 1e-2f);
  }
}

// The loader's stored-dtype path on one GPU: bf16 matrices copied as they are give the bits of the
// f32 file rounded on the device.
TEST(TensorParallelCuda, Bf16MatricesAsStoredGiveTheSameBits) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig c = gpu_config("qwen2");
  const ModelFile f32 = make_hashed_synthetic_model_file(c, 4);
  ModelFile bf16 = f32;
  for (auto& [name, t] : bf16.tensors) {
    if (t.shape().size() != 2) continue;
    Tensor b = Tensor::empty(t.shape(), DType::bf16);
    for (int64_t i = 0; i < t.numel(); ++i)
      b.data_as<uint16_t>()[i] = f32_to_bf16(t.data_as<float>()[i]);
    t = std::move(b);
  }
  const Script s = make_script(c.vocab_size, 2);
  LlamaModelCuda a(f32), b(bf16);
  KvCache ca(cache_for(c, c.num_kv_heads)), cb(cache_for(c, c.num_kv_heads));
  const auto want = play(s, ca, [&](const ForwardBatch& x) { return a.forward(x, ca); });
  const auto got = play(s, cb, [&](const ForwardBatch& x) { return b.forward(x, cb); });
  EXPECT_EQ(got, want);
}

TEST(TensorParallelCuda, TwoRanksSlicingAFileMatchOneGpu) {
  PA_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_NCCL();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  for (const char* variant : {"llama", "qwen2", "qwen3"}) {
    SCOPED_TRACE(variant);
    expect_two_ranks_match_one(gpu_config(variant), 1e-2f, /*from_file=*/true);
  }
}

TEST(TensorParallelCuda, TwoRanksMatchOneGpuAtLlama3_8bShapes) {
  PA_SKIP_WITHOUT_GPU();
  SKIP_WITHOUT_NCCL();
  if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";
  ModelConfig c = synthetic_model_config("synthetic:llama3-8b");
  c.num_layers = 4;  // the shapes of every layer; four of them keep the test short
  expect_two_ranks_match_one(c, 1e-2f);
}

#else

TEST(TensorParallelCuda, WorldOfOneIsBitIdentical) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
