// Tensor parallelism on GPUs, in one process with a thread per rank (NCCL allows it): a world of
// one gives bit-identical logits to the plain runner; two ranks on two GPUs give the single-GPU
// logits within bf16 tolerance and the same greedy tokens, for every architecture variant
// (q/k/v biases, tied embeddings, q/k norms with a replicated KV head, a sliding window, an odd
// vocabulary) and for Llama-3-8B's layer shapes. The process-level group (spawned workers, the
// control link) runs in scripts/device/tensor-parallel.sh.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <random>
#include <string>
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
#include "model/kv_calibration.h"
#include "test_gguf_writer.h"
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

// Two ranks in one process: a device, NCCL and a second device.
#define SKIP_WITHOUT_TWO_GPUS()                                                \
  do {                                                                         \
    PA_SKIP_WITHOUT_GPU();                                                     \
    SKIP_WITHOUT_NCCL();                                                       \
    if (cuda_device_count() < 2) GTEST_SKIP() << "needs 2 CUDA devices";       \
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

// An environment variable set to `value` while it lives, then put back as it was: the models
// read their switches (PAGEDATTN_FOLD_NORM: llama_cuda.cpp's fold_norms; PAGEDATTN_PEER_EMBED)
// when they are built.
class ScopedEnv {
 public:
  ScopedEnv(const char* name, const char* value) : name_(name) {
    if (const char* v = std::getenv(name)) {
      old_ = v;
      had_ = true;
    }
    setenv(name, value, 1);
  }
  ~ScopedEnv() {
    if (had_)
      setenv(name_.c_str(), old_.c_str(), 1);
    else
      unsetenv(name_.c_str());
  }
  ScopedEnv(const ScopedEnv&) = delete;
  ScopedEnv& operator=(const ScopedEnv&) = delete;

 private:
  std::string name_, old_;
  bool had_ = false;
};

// The steps every test runs: a ragged prefill of four sequences, then `decode` greedy steps (four
// rows: the products on the tensor cores, wgmma_gemm, where the device has them; two rows would
// take gemv).
struct Script {
  std::vector<std::vector<int32_t>> prompts;
  int32_t decode = 4;
};

Script make_script(int32_t vocab, uint32_t seed) {
  std::mt19937 g(seed);
  Script s;
  for (int32_t len : {23, 9, 14, 5}) {
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

// Every step's logit rows of `got` against `want`: within `tol` of the row's largest logit (at
// least 1) and the same greedy token, unless the reference's two candidates lie within a quarter
// of the tolerance of each other (a near tie, which a rounding apart may swap: the rows' own
// difference always covers the swap); each run feeds its own greedy tokens, so a sequence whose
// tokens parted there is not compared after it. Returns the rows compared.
int expect_steps_close(const std::vector<std::vector<std::vector<float>>>& got,
                       const std::vector<std::vector<std::vector<float>>>& want, float tol) {
  EXPECT_EQ(got.size(), want.size());
  int compared = 0, ties = 0;
  std::vector<bool> parted;
  for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
    EXPECT_EQ(got[i].size(), want[i].size());
    parted.resize(std::max(parted.size(), want[i].size()), false);
    for (size_t r = 0; r < std::min(got[i].size(), want[i].size()); ++r) {
      if (parted[r]) continue;
      const auto& g = got[i][r];
      const auto& w = want[i][r];
      float scale = 1.f, diff = 0.f;
      for (size_t v = 0; v < w.size(); ++v) {
        scale = std::max(scale, std::abs(w[v]));
        diff = std::max(diff, std::abs(g[v] - w[v]));
      }
      EXPECT_LE(diff / scale, tol) << "step " << i << " row " << r;
      const size_t ga = size_t(std::max_element(g.begin(), g.end()) - g.begin());
      const size_t wa = size_t(std::max_element(w.begin(), w.end()) - w.begin());
      if (ga != wa && w[wa] - w[ga] <= tol * scale / 4) {
        parted[r] = true;
        ++ties;
      } else {
        EXPECT_EQ(ga, wa) << "greedy token of step " << i << " row " << r << " (reference "
                          << w[wa] << " against " << w[ga] << ", rows " << diff << " apart)";
      }
      ++compared;
    }
  }
  // Near ties are rare: most rows must keep the same token.
  EXPECT_LE(ties * 4, compared) << ties << " near ties in " << compared << " rows";
  return compared;
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
    // A rank's greedy step gathers only the argmax: its logits are refused by name, its ids are
    // the argmax of the same step's gathered logits.
    const SeqId q1 = one_cache.create_sequence(), q2 = one_cache.create_sequence();
    const std::vector<float> row =
        rows_of(one.forward(make_step_batch(one_cache, {q1}, {s.prompts[0]}), one_cache))[0];
    const float* dl =
        one.forward_device(make_step_batch(one_cache, {q2}, {s.prompts[0]}), one_cache, true);
    try {
      one.download_logits(dl, 1);
      ADD_FAILURE() << "the logits of a greedy step were downloaded";
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find("not gathered"), std::string::npos) << e.what();
    }
    const auto best = int32_t(std::max_element(row.begin(), row.end()) - row.begin());
    EXPECT_EQ(one.download_greedy(dl, 1), std::vector<int32_t>{best});
  }
}

// Two ranks as threads of this process on GPUs 0 and 1 (tp_ranks.h), each with its model and its
// cache.
struct TwoRanks {
  std::unique_ptr<cuda::NcclComm> comm[2];
  std::unique_ptr<LlamaModelCuda> model[2];
  std::unique_ptr<KvCache> cache[2];

  template <class F>
  void on_each(F&& f) {
    pagedattn::testing::on_two_ranks(comm, f);
  }
  // Joins the ranks; rank r's model is make_rank(r, its comm), its cache make_cache(its number
  // of KV heads).
  template <class MakeRank, class MakeCache>
  void build(MakeRank&& make_rank, MakeCache&& make_cache) {
    const cuda::NcclId id = cuda::nccl_unique_id();
    on_each([&](int r) {
      comm[r] = std::make_unique<cuda::NcclComm>(id, 2, r);
      model[r] = make_rank(r, comm[r].get());
      cache[r] = make_cache(model[r]->num_local_kv_heads());
      // NOTE: two ranks in one process: plain launches (the process-level runs, one rank per
      // process as the CLI starts them, replay CUDA graphs: scripts/device/tensor-parallel.sh).
      model[r]->set_cuda_graphs(false);
    });
  }
  // Rank 0's logits of b, which both ranks run at once (batches are built on cache[0]).
  Tensor forward(const ForwardBatch& b) {
    Tensor logits;
    on_each([&](int r) {
      if (r == 0) {
        logits = model[0]->forward(b, *cache[0]);
      } else {
        model[1]->forward_device(b, *cache[1]);
        cudaDeviceSynchronize();
      }
    });
    return logits;
  }
};

// Two ranks on GPUs 0 and 1 against the plain runner on GPU 0. The ranks' products sum in
// another order (and cuBLAS picks other kernels for the narrower matrices), which moves the bf16
// roundings of the activations: logits agree within bf16's relative step (2^-7), greedy tokens
// exactly.
// The file with its matrices as bf16 host tensors (as a checkpoint stores them; their values are
// the ones the device rounds the f32 weights to), the vectors f32.
ModelFile with_bf16_matrices(ModelFile file) {
  for (auto& [name, t] : file.tensors) {
    if (t.shape().size() != 2) continue;
    Tensor b = Tensor::empty(t.shape(), DType::bf16);
    for (int64_t i = 0; i < t.numel(); ++i)
      b.data_as<uint16_t>()[i] = f32_to_bf16(t.data_as<float>()[i]);
    t = std::move(b);
  }
  return file;
}

// make_plain() builds the one-GPU model, make_rank(r, comm) rank r's.
template <class MakePlain, class MakeRank>
void expect_two_ranks_match(const ModelConfig& c, float tol, MakePlain&& make_plain,
                            MakeRank&& make_rank) {
  const Script s = make_script(c.vocab_size, 9);
  cudaSetDevice(0);
  std::vector<std::vector<std::vector<float>>> want;
  {
    // NOTE: the one-GPU reference runs the kernels that the ranks run: a rank of two never folds
    // its RMSNorms into the products (fold_norms), and folded, the reference's logits differ by a
    // rounding of each product's input. On the quantised GGUF model that was enough to swap the
    // greedy token of a near tie (within 1e-2 of each other at decode step 1, an H100), after
    // which the two runs fed different tokens and parted.
    const ScopedEnv unfolded("PAGEDATTN_FOLD_NORM", "0");
    std::unique_ptr<LlamaModelCuda> plain = make_plain();
    KvCache cache(cache_for(c, c.num_kv_heads));
    want = play(s, cache, [&](const ForwardBatch& b) { return plain->forward(b, cache); });
  }
  TwoRanks ranks;
  ranks.build(make_rank,
              [&](int32_t heads) { return std::make_unique<KvCache>(cache_for(c, heads)); });
  auto& model = ranks.model;
  auto& cache = ranks.cache;
  auto on_each_rank = [&](auto&& f) { ranks.on_each(f); };
  const auto got = play(s, *cache[0], [&](const ForwardBatch& b) { return ranks.forward(b); });
  ASSERT_EQ(got.size(), want.size());
  const int compared = expect_steps_close(got, want, tol);
  EXPECT_EQ(compared, int(s.prompts.size()) * (s.decode + 1));

  // The greedy path on the same ranks: each rank's slice's argmax, only those exchanged (no logits
  // gathered), must give the argmax of the gathered logits above, step after step.
  std::vector<SeqId> seqs;
  for (size_t i = 0; i < s.prompts.size(); ++i) seqs.push_back(cache[0]->create_sequence());
  ForwardBatch b = make_step_batch(*cache[0], seqs, s.prompts);
  std::vector<std::vector<int32_t>> greedy_ids;  // [step][row]
  for (int32_t step = 0; step <= s.decode; ++step) {
    std::vector<int32_t> ids;
    on_each_rank([&](int r) {
      if (r == 0) {
        ids = model[0]->download_greedy(model[0]->forward_device(b, *cache[0], true),
                                        int32_t(b.logit_rows.size()));
      } else {
        model[1]->forward_device(b, *cache[1], true);
        cudaDeviceSynchronize();
      }
    });
    for (SeqId q : seqs) cache[0]->commit(q);
    greedy_ids.push_back(ids);
    ASSERT_EQ(ids.size(), got[size_t(step)].size());
    std::vector<std::vector<int32_t>> next;
    for (size_t r = 0; r < ids.size(); ++r) {
      const auto& g = got[size_t(step)][r];
      EXPECT_EQ(ids[r], int32_t(std::max_element(g.begin(), g.end()) - g.begin()))
          << "greedy step " << step << " row " << r;
      next.push_back({ids[r]});
    }
    if (step < s.decode) b = make_step_batch(*cache[0], seqs, next);
  }
  for (SeqId q : seqs) cache[0]->free_sequence(q);

  // Passes begun ahead on both ranks (Model::begin_greedy, as rank 0's engine schedules ahead),
  // each step's tokens standing in for the ids of the pass still open before it, which every rank
  // has: the greedy ids above, step for step. Rank 1 finishes its passes without reading them.
  std::vector<SeqId> ahead;
  std::vector<std::vector<int32_t>> stand_ins;
  for (size_t i = 0; i < s.prompts.size(); ++i) {
    ahead.push_back(cache[0]->create_sequence());
    stand_ins.push_back({chained_token(int32_t(i))});
  }
  const ForwardBatch first = make_step_batch(*cache[0], ahead, s.prompts);
  on_each_rank([&](int r) { model[r]->begin_greedy(first, *cache[r]); });
  for (int32_t step = 0; step <= s.decode; ++step) {
    ForwardBatch next;
    if (step < s.decode) next = make_step_batch(*cache[0], ahead, stand_ins);
    std::vector<int32_t> ids;
    on_each_rank([&](int r) {
      if (step < s.decode) model[r]->begin_greedy(next, *cache[r]);
      if (r == 0) {
        ids = model[0]->finish_greedy();
      } else {
        while (!model[1]->oldest_finished()) std::this_thread::yield();
        model[1]->finish_unread();
      }
    });
    EXPECT_EQ(ids, greedy_ids[size_t(step)]) << "step " << step << " begun ahead";
  }
  EXPECT_EQ(model[0]->open_passes() + model[1]->open_passes(), 0);
}

// from_file: the ranks slice a host file of the same weights (the loader's path for checkpoints:
// bf16 matrices copied as stored, f32 vectors) instead of filling their slices on the device.
void expect_two_ranks_match_one(const ModelConfig& c, float tol, bool from_file = false) {
  ModelFile file;
  if (from_file) file = with_bf16_matrices(make_hashed_synthetic_model_file(c, 21));
  expect_two_ranks_match(
      c, tol, [&] { return std::make_unique<LlamaModelCuda>(c, 21); },
      [&](int r, cuda::NcclComm* comm) {
        return from_file ? std::make_unique<LlamaModelCuda>(file, TpShard{r, 2}, comm)
                         : std::make_unique<LlamaModelCuda>(c, 21, TpShard{r, 2}, comm);
      });
}

// A llama-architecture GGUF file of config c with random quantised matrices: Q8_0 blocks for the
// embeddings, attention and lm_head, Q4_1 for the MLP (values of a few hundredths); f32 norms
// near 1.
std::string write_quantized_gguf(const ModelConfig& c, const std::string& name) {
  using pagedattn::testing::GGUFWriter;
  std::mt19937 g(7);
  std::uniform_real_distribution<float> unit(0.f, 1.f);
  GGUFWriter w;
  w.kv_str("general.architecture", "llama");
  w.kv_u32("llama.context_length", 4096);
  w.kv_u32("llama.embedding_length", uint32_t(c.hidden_size));
  w.kv_u32("llama.block_count", uint32_t(c.num_layers));
  w.kv_u32("llama.feed_forward_length", uint32_t(c.intermediate_size));
  w.kv_u32("llama.attention.head_count", uint32_t(c.num_q_heads));
  w.kv_u32("llama.attention.head_count_kv", uint32_t(c.num_kv_heads));
  w.kv_f32("llama.attention.layer_norm_rms_epsilon", c.rms_norm_eps);
  w.kv_f32("llama.rope.freq_base", c.rope_theta);
  // [rows, cols] in blocks of 32 along a row: Q8_0 (f16 scale, 32 int8), Q4_1 (f16 scale and
  // minimum, 16 bytes of nibbles: q = d * n + m).
  auto matrix = [&](const std::string& tensor, int64_t rows, int64_t cols, bool q4) {
    std::vector<uint8_t> b;
    for (int64_t i = 0; i < rows * cols / 32; ++i) {
      if (q4) {
        const float d = 0.002f + 0.004f * unit(g);
        pagedattn::testing::put_f16(b, d);
        pagedattn::testing::put_f16(b, -7.5f * d);
        for (int j = 0; j < 16; ++j) b.push_back(uint8_t(g() & 0xffu));
      } else {
        pagedattn::testing::put_f16(b, 0.0001f + 0.0003f * unit(g));
        for (int j = 0; j < 32; ++j) b.push_back(uint8_t(g() & 0xffu));
      }
    }
    w.tensor(tensor, {cols, rows}, q4 ? 3 : 8, b);  // GGMLType Q4_1 = 3, Q8_0 = 8
  };
  auto norm = [&](const std::string& tensor, int64_t n) {
    std::vector<float> v(static_cast<size_t>(n));
    for (float& x : v) x = 0.9f + 0.2f * unit(g);
    w.tensor_f32(tensor, {n}, v);
  };
  const int64_t H = c.hidden_size, I = c.intermediate_size, D = c.head_dim;
  matrix("token_embd.weight", c.vocab_size, H, false);
  norm("output_norm.weight", H);
  matrix("output.weight", c.vocab_size, H, false);
  for (int32_t l = 0; l < c.num_layers; ++l) {
    const std::string b = "blk." + std::to_string(l) + ".";
    norm(b + "attn_norm.weight", H);
    norm(b + "ffn_norm.weight", H);
    matrix(b + "attn_q.weight", c.num_q_heads * D, H, false);
    matrix(b + "attn_k.weight", c.num_kv_heads * D, H, false);
    matrix(b + "attn_v.weight", c.num_kv_heads * D, H, false);
    matrix(b + "attn_output.weight", H, c.num_q_heads * D, false);
    matrix(b + "ffn_gate.weight", I, H, true);
    matrix(b + "ffn_up.weight", I, H, true);
    matrix(b + "ffn_down.weight", H, I, true);
  }
  const std::string path = (std::filesystem::temp_directory_path() / name).string();
  w.write(path);
  return path;
}

// Folded RMSNorms (wgmma_gemm.h's NormFold, PAGEDATTN_FOLD_NORM=1) against the norm kernels
// (=0) on one GPU: logits within bf16's step and the same greedy tokens over a ragged prefill and
// decode steps of 3 rows (gemv takes 1 and 2 rows, which do not fold), on every test variant and
// on four layers of Llama-3-8B's shapes.
// (Each run feeds its own greedy tokens: on models whose logits hold near ties, as the quantised
// GGUF file's, a rounding apart can swap one and part the runs.)
TEST(LlamaCudaFold, FoldedNormsMatchTheNormKernels) {
  PA_SKIP_WITHOUT_GPU();
  for (const char* variant : {"llama", "qwen2", "qwen3", "mistral", "llama3-8b"}) {
    SCOPED_TRACE(variant);
    ModelConfig c;
    if (std::string(variant) == "llama3-8b") {
      c = synthetic_model_config("synthetic:llama3-8b");
      c.num_layers = 4;
    } else {
      c = gpu_config(variant);
    }
    auto run = [&](const char* fold) {
      std::unique_ptr<LlamaModelCuda> m;
      {
        const ScopedEnv env("PAGEDATTN_FOLD_NORM", fold);
        m = std::make_unique<LlamaModelCuda>(c, 11);
      }
      KvCache cache(cache_for(c, c.num_kv_heads));
      Script s = make_script(c.vocab_size, 9);
      s.prompts.push_back(std::vector<int32_t>(s.prompts[1].begin(), s.prompts[1].begin() + 5));
      return play(s, cache, [&](const ForwardBatch& b) { return m->forward(b, cache); });
    };
    const auto want = run("0");
    const auto got = run("1");
    ASSERT_EQ(got.size(), want.size());
    expect_steps_close(got, want, 1e-2f);
  }
}

TEST(TensorParallelCuda, TwoRanksMatchOneGpu) {
  SKIP_WITHOUT_TWO_GPUS();
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
  const ModelFile bf16 = with_bf16_matrices(f32);
  const Script s = make_script(c.vocab_size, 2);
  LlamaModelCuda a(f32), b(bf16);
  KvCache ca(cache_for(c, c.num_kv_heads)), cb(cache_for(c, c.num_kv_heads));
  const auto want = play(s, ca, [&](const ForwardBatch& x) { return a.forward(x, ca); });
  const auto got = play(s, cb, [&](const ForwardBatch& x) { return b.forward(x, cb); });
  EXPECT_EQ(got, want);
}

TEST(TensorParallelCuda, TwoRanksSlicingAFileMatchOneGpu) {
  SKIP_WITHOUT_TWO_GPUS();
  for (const char* variant : {"llama", "qwen2", "qwen3"}) {
    SCOPED_TRACE(variant);
    expect_two_ranks_match_one(gpu_config(variant), 1e-2f, /*from_file=*/true);
  }
}

// A GGUF file of quantised blocks on CUDA (the loader keeps the blocks, WeightFormat::stored, and
// the runner dequantises what it uploads, a rank only its slice): on one GPU the same bits as the
// file dequantised on the host first (WeightFormat::f32); on two, the one-GPU logits within
// bf16's step and the same greedy tokens.
TEST(TensorParallelCuda, QuantizedGgufOnOneAndTwoGpus) {
  PA_SKIP_WITHOUT_GPU();
  const std::string path = write_quantized_gguf(gpu_config("llama"), "tp_quantized.gguf");
  const ModelFile stored = load_model_file(path, WeightFormat::stored);
  const ModelFile f32 = load_model_file(path, WeightFormat::f32);
  ASSERT_FALSE(stored.weights.empty()) << "the matrices should stay in the file's blocks";
  ASSERT_TRUE(f32.weights.empty());
  const ModelConfig& c = f32.config;
  {
    const Script s = make_script(c.vocab_size, 3);
    LlamaModelCuda a(f32), b(stored);
    KvCache ca(cache_for(c, c.num_kv_heads)), cb(cache_for(c, c.num_kv_heads));
    const auto want = play(s, ca, [&](const ForwardBatch& x) { return a.forward(x, ca); });
    const auto got = play(s, cb, [&](const ForwardBatch& x) { return b.forward(x, cb); });
    ASSERT_EQ(got.size(), want.size());
    EXPECT_EQ(got, want);
    // Logits that say something: finite, and not one flat row.
    for (const auto& step : want)
      for (const auto& row : step) {
        const auto [lo, hi] = std::minmax_element(row.begin(), row.end());
        EXPECT_TRUE(std::isfinite(*lo) && std::isfinite(*hi));
        EXPECT_GT(*hi - *lo, 1e-3f);
      }
  }
  std::string why;
  if (cuda_device_count() < 2 || !cuda::nccl_available(&why)) {
    std::filesystem::remove(path);
    GTEST_SKIP() << "one GPU checked; two ranks need 2 CUDA devices and NCCL " << why;
  }
  expect_two_ranks_match(
      c, 1e-2f, [&] { return std::make_unique<LlamaModelCuda>(f32); },
      [&](int r, cuda::NcclComm* comm) {
        return std::make_unique<LlamaModelCuda>(stored, TpShard{r, 2}, comm);
      });
  std::filesystem::remove(path);
}

TEST(TensorParallelCuda, TwoRanksMatchOneGpuAtLlama3_8bShapes) {
  SKIP_WITHOUT_TWO_GPUS();
  ModelConfig c = synthetic_model_config("synthetic:llama3-8b");
  c.num_layers = 4;  // the shapes of every layer; four of them keep the test short
  expect_two_ranks_match_one(c, 1e-2f);
}

// fp8 K/V over two ranks: every rank's calibration pass (run at once: it holds the collectives)
// gives the one-GPU maxima of its own KV heads (within bf16 roundings: the ranks sum their
// products in another order), and the ranks' fp8 caches, each scaled from its own maxima, give
// the one-GPU fp8 logits within the fp8 tolerance of LlamaCudaSynthetic.Fp8KvCalibratedOnTheDevice
// (the scales, and so the e4m3 roundings, differ a little). The steps are teacher-forced (both
// runs take the same tokens), so a rounding that swaps a near tie does not part them.
// qwen3: one KV head, replicated on both ranks.
TEST(TensorParallelCuda, Fp8KvOnTwoRanksMatchesOneGpu) {
  SKIP_WITHOUT_TWO_GPUS();
  for (const char* variant : {"llama", "qwen3"}) {
    SCOPED_TRACE(variant);
    const ModelConfig c = gpu_config(variant);
    const std::vector<int32_t> calib = kv_calibration_tokens(nullptr, c.vocab_size);
    const Script s = make_script(c.vocab_size, 13);
    std::mt19937 g(17);
    std::vector<std::vector<std::vector<int32_t>>> steps = {s.prompts};  // [step][seq] tokens
    for (int32_t d = 0; d < s.decode; ++d) {
      std::vector<std::vector<int32_t>> next;
      for (size_t q = 0; q < s.prompts.size(); ++q)
        next.push_back({int32_t(g() % uint32_t(c.vocab_size))});
      steps.push_back(next);
    }
    auto fp8_cache = [&](int32_t heads) {
      KvCacheConfig k = cache_for(c, heads);
      k.dtype = DType::fp8_e4m3;
      return std::make_unique<KvCache>(k);
    };
    // Every step's logit rows, the batches built on cache0.
    auto play_forced = [&](KvCache& cache0, auto&& run) {
      std::vector<std::vector<std::vector<float>>> out;
      std::vector<SeqId> seqs;
      for (size_t q = 0; q < s.prompts.size(); ++q) seqs.push_back(cache0.create_sequence());
      for (const auto& tokens : steps) {
        out.push_back(rows_of(run(make_step_batch(cache0, seqs, tokens))));
        for (SeqId q : seqs) cache0.commit(q);
      }
      return out;
    };
    // The largest difference of `got`'s rows from `want`'s, relative to each row's largest logit
    // (at least 1); every row finite.
    auto worst_of = [&](const std::vector<std::vector<std::vector<float>>>& got,
                        const std::vector<std::vector<std::vector<float>>>& want) {
      EXPECT_EQ(got.size(), want.size());
      double worst = 0;
      for (size_t i = 0; i < std::min(got.size(), want.size()); ++i) {
        EXPECT_EQ(got[i].size(), s.prompts.size()) << "step " << i;
        EXPECT_EQ(got[i].size(), want[i].size()) << "step " << i;
        for (size_t r = 0; r < std::min(got[i].size(), want[i].size()); ++r) {
          EXPECT_EQ(got[i][r].size(), size_t(c.vocab_size));
          float scale = 1.f, diff = 0.f;
          for (size_t v = 0; v < std::min(got[i][r].size(), want[i][r].size()); ++v) {
            EXPECT_TRUE(std::isfinite(got[i][r][v]) && std::isfinite(want[i][r][v]))
                << "step " << i << " row " << r << " logit " << v;
            scale = std::max(scale, std::abs(want[i][r][v]));
            diff = std::max(diff, std::abs(got[i][r][v] - want[i][r][v]));
          }
          worst = std::max(worst, double(diff / scale));
        }
      }
      return worst;
    };
    cudaSetDevice(0);
    Model::KvAbsMax want_max;
    std::vector<std::vector<std::vector<float>>> want, want_bf16;
    {
      const ScopedEnv unfolded("PAGEDATTN_FOLD_NORM", "0");  // as a rank of two runs (expect_two_ranks_match says why)
      LlamaModelCuda plain(c, 21);
      std::unique_ptr<KvCache> cache = fp8_cache(c.num_kv_heads);
      want_max = plain.kv_absmax(calib);
      set_kv_scales(*cache, want_max, 1.25f);
      want = play_forced(*cache, [&](const ForwardBatch& b) { return plain.forward(b, *cache); });
      KvCache bf16_cache(cache_for(c, c.num_kv_heads));
      want_bf16 = play_forced(bf16_cache,
                              [&](const ForwardBatch& b) { return plain.forward(b, bf16_cache); });
    }
    // The fp8 pools are in use: their roundings move the logits off the bf16 cache's.
    const double fp8_err = worst_of(want, want_bf16);
    EXPECT_GT(fp8_err, 0.0) << "the fp8 cache gave the bf16 cache's logits bit for bit";
    TwoRanks ranks;
    ranks.build(
        [&](int r, cuda::NcclComm* comm) {
          return std::make_unique<LlamaModelCuda>(c, 21, TpShard{r, 2}, comm);
        },
        fp8_cache);
    auto& cache = ranks.cache;
    Model::KvAbsMax got_max[2];
    ranks.on_each([&](int r) {
      got_max[r] = ranks.model[r]->kv_absmax(calib);  // both ranks at once
      set_kv_scales(*cache[r], got_max[r], 1.25f);
    });
    const size_t H = size_t(c.num_kv_heads);
    for (int r = 0; r < 2; ++r) {
      const TpSlices sl = tp_slices(c, TpShard{r, 2});
      const size_t h_local = size_t(sl.kv_heads);
      ASSERT_EQ(got_max[r].k.size(), size_t(c.num_layers) * h_local) << "rank " << r;
      ASSERT_EQ(got_max[r].v.size(), got_max[r].k.size()) << "rank " << r;
      EXPECT_TRUE(cache[r]->scales_set()) << "rank " << r;
      for (size_t l = 0; l < size_t(c.num_layers); ++l) {
        for (size_t j = 0; j < h_local; ++j) {
          const size_t mine = l * h_local + j, whole = l * H + size_t(sl.kv_head0) + j;
          EXPECT_GT(got_max[r].k[mine], 0.f);
          EXPECT_NEAR(got_max[r].k[mine], want_max.k[whole], 2e-2 * want_max.k[whole])
              << "rank " << r << " layer " << l << " head " << j;
          EXPECT_NEAR(got_max[r].v[mine], want_max.v[whole], 2e-2 * want_max.v[whole])
              << "rank " << r << " layer " << l << " head " << j;
        }
      }
    }
    const auto got =
        play_forced(*cache[0], [&](const ForwardBatch& b) { return ranks.forward(b); });
    const double worst = worst_of(got, want);
    EXPECT_LE(worst, 5e-2);
    std::printf("%s: fp8 K/V, two ranks against one GPU: worst relative logit error %.2e (one "
                "GPU's fp8 against its bf16 cache: %.2e)\n",
                variant, worst, fp8_err);
  }
}

// The embedding rows read from their ranks' memory (peer_embed.h) against the gather of each
// rank's slice and the all-reduce of the rows (PAGEDATTN_PEER_EMBED=0): the same logits, bit for
// bit (the values and the norm's arithmetic are the all-reduce's), over prefill and decode steps;
// qwen2's embedding is also its lm_head.
TEST(TensorParallelCuda, EmbeddingFromPeersGivesTheAllReducesBits) {
  SKIP_WITHOUT_TWO_GPUS();
  for (const char* variant : {"llama", "qwen2"}) {
    SCOPED_TRACE(variant);
    const ModelConfig c = gpu_config(variant);
    const Script s = make_script(c.vocab_size, 23);
    std::vector<std::vector<std::vector<float>>> steps[2];
    for (int peers = 0; peers < 2; ++peers) {
      const ScopedEnv env("PAGEDATTN_PEER_EMBED", peers ? "1" : "0");
      TwoRanks ranks;
      ranks.build(
          [&](int r, cuda::NcclComm* comm) {
            return std::make_unique<LlamaModelCuda>(c, 21, TpShard{r, 2}, comm);
          },
          [&](int32_t heads) { return std::make_unique<KvCache>(cache_for(c, heads)); });
      steps[peers] =
          play(s, *ranks.cache[0], [&](const ForwardBatch& b) { return ranks.forward(b); });
    }
    ASSERT_EQ(steps[1].size(), size_t(s.decode + 1));
    ASSERT_EQ(steps[0].size(), steps[1].size());
    for (size_t i = 0; i < steps[0].size(); ++i) {
      ASSERT_EQ(steps[1][i].size(), s.prompts.size());
      EXPECT_EQ(steps[1][i], steps[0][i]) << "step " << i;
    }
  }
}

#else

TEST(TensorParallelCuda, WorldOfOneIsBitIdentical) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
