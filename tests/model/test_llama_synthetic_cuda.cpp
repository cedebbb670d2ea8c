// LlamaModelCuda built from a config and a seed (weights generated on the device): finite logits,
// the same logits from two builds with the same seed, the same weights as the host file of hashed
// values (bit-identical logits) and the CPU model on that file within bf16 tolerance; logits
// returned from reused page-locked buffers are never overwritten while the caller holds them.
// forward_greedy: the host argmax of forward's logits, and its device argmax kernel on crafted
// rows; forward_sample: the host twin of the sample plan on forward's logits, and the same in two
// calls (begin_sample, finish_sample); greedy passes chained on the device (begin_greedy).
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <random>
#include <string>
#include <vector>

#include "../model/step_batch.h"
#include "gpu_skip.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/llama_cuda.h"
#include "pagedattn/sample_plan.h"
#include "pagedattn/sampling.h"
#include "pagedattn/synthetic_model.h"
#include "tiny_models.h"
#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/llama_kernels.h"
#endif

using namespace pagedattn;

namespace {

// The shared GPU-sized configs ("llama", "qwen2", "qwen3") as this file has always run them:
// RoPE theta 500000, the default norm epsilon, 2 KV heads, head dim 64 (128 for qwen3).
ModelConfig tiny_config(const std::string& variant) {
  ModelConfig c = pagedattn::testing::tiny_config(variant, pagedattn::testing::TinySize::gpu);
  c.rope_theta = 500000.f;
  c.rms_norm_eps = ModelConfig{}.rms_norm_eps;
  c.num_kv_heads = 2;
  c.head_dim = variant == "qwen3" ? 128 : 64;
  return c;
}

KvCacheConfig cache_config(const ModelConfig& c, Device device) {
  return pagedattn::testing::model_kv_config(c, 32, 16, device);
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
    const Tensor l = m.forward(make_step_batch(cache, seqs, toks), cache);
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

// `steps` decode steps of `seqs` sequences (prompts of different lengths, so they cross page
// boundaries at different steps) on `cache`: every step's logits, concatenated.
std::vector<float> decode_run(Model& m, KvCache& cache, int seqs, int steps) {
  std::vector<SeqId> ids;
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < seqs; ++s) {
    ids.push_back(cache.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < 3 + 5 * s; ++i) t.push_back(int32_t((i * 17 + s * 5 + 1) % 300));
    toks.push_back(t);
  }
  std::vector<float> out;
  for (int step = 0; step <= steps; ++step) {  // step 0: the prefill
    const Tensor l = m.forward(make_step_batch(cache, ids, toks), cache);
    if (step > 0) out.insert(out.end(), l.data_as<float>(), l.data_as<float>() + l.numel());
    for (SeqId s : ids) cache.commit(s);
    for (int s = 0; s < seqs; ++s) toks[size_t(s)] = {int32_t((step * 7 + s * 3) % 300)};
  }
  for (SeqId s : ids) cache.free_sequence(s);
  return out;
}

// Decode steps replayed from CUDA graphs give the bits of plain launches: across page boundaries
// (wider block tables, whose staged stride is rounded up: one graph serves them), batch sizes, and
// a second cache (other pools: no graph of the first may be replayed on it).
TEST_P(LlamaCudaSynthetic, CudaGraphsGiveTheSameBits) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config(GetParam());
  LlamaModelCuda graphs(cfg, 5), plain(cfg, 5);
  plain.set_cuda_graphs(false);
  KvCache ga(cache_config(cfg, Device::cuda)), gb(cache_config(cfg, Device::cuda));
  KvCache pa(cache_config(cfg, Device::cuda)), pb(cache_config(cfg, Device::cuda));
  for (int seqs : {3, 1}) {
    const std::vector<float> g1 = decode_run(graphs, ga, seqs, 40);
    const std::vector<float> p1 = decode_run(plain, pa, seqs, 40);
    // 40 steps past three page boundaries, on one graph (a new one each had cost a plain step
    // and a capture).
    if (seqs == 3) {
      EXPECT_EQ(graphs.cuda_graph_stats().captures, 1);
    }
    ASSERT_EQ(g1.size(), p1.size());
    EXPECT_EQ(std::memcmp(g1.data(), p1.data(), g1.size() * 4), 0) << seqs << " sequences";
    const std::vector<float> g2 = decode_run(graphs, gb, seqs, 20);
    const std::vector<float> p2 = decode_run(plain, pb, seqs, 20);
    EXPECT_EQ(std::memcmp(g2.data(), p2.data(), g2.size() * 4), 0) << "second cache";
  }
  const Model::GraphStats st = graphs.cuda_graph_stats();
  std::printf("%s: %lld graphs captured, %lld steps replayed\n", GetParam().c_str(),
              (long long)st.captures, (long long)st.replays);
  EXPECT_GE(st.captures, 4);
  EXPECT_GE(st.replays, 60);  // most of the 120 decode steps
  EXPECT_EQ(plain.cuda_graph_stats().captures, 0);
}

// Greedy passes in two calls (begin_greedy, finish_greedy), each begun before the ids of the one
// before it are read and taking them as its tokens on the device (chained_token), give
// forward_greedy's ids step for step: a ragged prefill, then 40 decode steps of three sequences
// across page boundaries, replayed from CUDA graphs (one a slot of ids); a plain forward after
// them still works, and misuse is an error.
TEST_P(LlamaCudaSynthetic, ChainedGreedyPassesGiveForwardGreedysIds) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config(GetParam());
  LlamaModelCuda plain(cfg, 5), chained(cfg, 5);
  KvCache pc(cache_config(cfg, Device::cuda)), cc(cache_config(cfg, Device::cuda));
  std::vector<SeqId> ps, cs;
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < 3; ++s) {
    ps.push_back(pc.create_sequence());
    cs.push_back(cc.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < 3 + 7 * s; ++i) t.push_back(int32_t((i * 17 + s * 5 + 1) % 300));
    toks.push_back(t);
  }
  constexpr int kSteps = 40;
  std::vector<std::vector<int32_t>> want;  // [step][seq]
  std::vector<std::vector<int32_t>> in = toks;
  for (int step = 0; step <= kSteps; ++step) {
    want.push_back(plain.forward_greedy(make_step_batch(pc, ps, in), pc));
    for (SeqId s : ps) pc.commit(s);
    for (int s = 0; s < 3; ++s) in[size_t(s)] = {want.back()[size_t(s)]};
  }
  const double busy0 = chained.device_busy_seconds();
  chained.begin_greedy(make_step_batch(cc, cs, toks), cc);
  const std::vector<std::vector<int32_t>> stand_ins = {
      {chained_token(0)}, {chained_token(1)}, {chained_token(2)}};
  for (int step = 0; step <= kSteps; ++step) {
    if (step < kSteps) chained.begin_greedy(make_step_batch(cc, cs, stand_ins), cc);
    EXPECT_EQ(chained.finish_greedy(), want[size_t(step)]) << "step " << step;
    for (SeqId s : cs) cc.commit(s, cc.kv_len(s) - (step < kSteps ? 1 : 0));
  }
  EXPECT_GT(chained.device_busy_seconds(), busy0);
  EXPECT_GE(chained.cuda_graph_stats().replays, kSteps - 8);
  EXPECT_THROW(chained.finish_greedy(), Error);  // none open
  // A stand-in with no pass open before it names no row: the CPU model's vocabulary error.
  EXPECT_THROW(chained.begin_greedy(make_step_batch(cc, cs, stand_ins), cc), Error);
  // A chained pass with more rows than the pass before it (an admission beside the decodes): on a
  // fresh model, whose ids buffer grows under the open pass's one id. A sequence's stand-in beside
  // two new prompts.
  {
    LlamaModelCuda widen(cfg, 5);
    std::vector<SeqId> p2 = {pc.create_sequence(), pc.create_sequence(), pc.create_sequence()};
    std::vector<SeqId> c2 = {cc.create_sequence(), cc.create_sequence(), cc.create_sequence()};
    const std::vector<int32_t> first =
        plain.forward_greedy(make_step_batch(pc, {p2[0]}, {toks[2]}), pc);
    pc.commit(p2[0]);
    const std::vector<int32_t> second =
        plain.forward_greedy(make_step_batch(pc, p2, {{first[0]}, toks[0], toks[1]}), pc);
    widen.begin_greedy(make_step_batch(cc, {c2[0]}, {toks[2]}), cc);
    widen.begin_greedy(make_step_batch(cc, c2, {{chained_token(0)}, toks[0], toks[1]}), cc);
    EXPECT_EQ(widen.finish_greedy(), first);
    EXPECT_EQ(widen.finish_greedy(), second);
  }
  for (SeqId s : cs) cc.free_sequence(s);
  // A plain pass after the chained ones: the same logits as the other model's.
  std::vector<SeqId> fresh = {cc.create_sequence()}, fresh2 = {pc.create_sequence()};
  const Tensor a = chained.forward(make_step_batch(cc, fresh, {toks[1]}), cc);
  const Tensor b = plain.forward(make_step_batch(pc, fresh2, {toks[1]}), pc);
  EXPECT_EQ(std::memcmp(a.data(), b.data(), size_t(a.numel()) * 4), 0);
}

#ifdef PAGEDATTN_HAVE_CUDA
// Decode steps whose batch changes every two steps (5 to 8 sequences, prompts of different
// lengths): padded to 8 rows they replay one graph (a table stride or two) where unpadded each
// size is captured anew; the logits of the batch's rows are the unpadded model's, and the dummy
// rows write nothing into the pools (every byte the unpadded run leaves poisoned stays poisoned).
TEST_P(LlamaCudaSynthetic, PaddedDecodeStepsReplayAsTheBatchChanges) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config(GetParam());
  LlamaModelCuda padded(cfg, 5), own(cfg, 5);
  own.set_decode_padding(false);
  const KvCacheConfig kc = pagedattn::testing::model_kv_config(cfg, 96, 16, Device::cuda);
  KvCache pc(kc), oc(kc);
  for (KvCache* c : {&pc, &oc}) {
    for (int32_t l = 0; l < cfg.num_layers; ++l) {
      const PagedKVView v = c->layer_view(l);
      const size_t bytes = size_t(v.num_pages) * size_t(v.page_stride()) * dtype_size(v.dtype);
      ASSERT_EQ(cudaMemset(v.k_pages, 0x7f, bytes), cudaSuccess);
      ASSERT_EQ(cudaMemset(v.v_pages, 0x7f, bytes), cudaSuccess);
    }
  }
  constexpr int kSeqs = 8, kSteps = 36;
  std::vector<SeqId> ps, os;
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < kSeqs; ++s) {
    ps.push_back(pc.create_sequence());
    os.push_back(oc.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < 2 + 5 * s; ++i) t.push_back(int32_t((i * 13 + s * 7 + 2) % 300));
    toks.push_back(t);
  }
  padded.forward(make_step_batch(pc, ps, toks), pc);
  own.forward(make_step_batch(oc, os, toks), oc);
  for (int s = 0; s < kSeqs; ++s) {
    pc.commit(ps[size_t(s)]);
    oc.commit(os[size_t(s)]);
  }
  const Model::GraphStats p0 = padded.cuda_graph_stats(), o0 = own.cuda_graph_stats();
  const int sizes[] = {5, 6, 7, 8, 7, 6};
  double worst = 0;
  for (int step = 0; step < kSteps; ++step) {
    const size_t n = size_t(sizes[(step / 2) % 6]);
    const std::vector<SeqId> pb(ps.begin(), ps.begin() + ptrdiff_t(n));
    const std::vector<SeqId> ob(os.begin(), os.begin() + ptrdiff_t(n));
    std::vector<std::vector<int32_t>> in;
    for (size_t s = 0; s < n; ++s) in.push_back({int32_t((step * 11 + int(s) * 3 + 1) % 300)});
    const Tensor lp = padded.forward(make_step_batch(pc, pb, in), pc);
    const Tensor lo = own.forward(make_step_batch(oc, ob, in), oc);
    ASSERT_EQ(lp.numel(), lo.numel());
    ASSERT_EQ(lp.numel(), int64_t(n) * cfg.vocab_size);
    for (size_t r = 0; r < n; ++r) {
      const float* a = lp.data_as<float>() + r * size_t(cfg.vocab_size);
      const float* b = lo.data_as<float>() + r * size_t(cfg.vocab_size);
      double top = 0, diff = 0;
      for (int32_t v = 0; v < cfg.vocab_size; ++v) {
        ASSERT_TRUE(std::isfinite(a[v]));
        top = std::max(top, std::fabs(double(b[v])));
        diff = std::max(diff, std::fabs(double(a[v]) - b[v]));
      }
      worst = std::max(worst, diff / std::max(top, 1e-6));
    }
    for (size_t s = 0; s < n; ++s) {
      pc.commit(pb[s]);
      oc.commit(ob[s]);
    }
  }
  const Model::GraphStats p1 = padded.cuda_graph_stats(), o1 = own.cuda_graph_stats();
  std::printf("%s: padded %lld captures, %lld replays; unpadded %lld, %lld; logits within %.2e\n",
              GetParam().c_str(), (long long)(p1.captures - p0.captures),
              (long long)(p1.replays - p0.replays), (long long)(o1.captures - o0.captures),
              (long long)(o1.replays - o0.replays), worst);
  EXPECT_LT(worst, 1e-3);
  EXPECT_LE(p1.captures - p0.captures, 3);
  EXPECT_GE(p1.replays - p0.replays, kSteps - 6);
  EXPECT_LT(o1.replays - o0.replays, p1.replays - p0.replays);
  for (int32_t l = 0; l < cfg.num_layers; ++l) {
    const PagedKVView pv = pc.layer_view(l), ov = oc.layer_view(l);
    const size_t bytes = size_t(pv.num_pages) * size_t(pv.page_stride()) * dtype_size(pv.dtype);
    for (int kv = 0; kv < 2; ++kv) {
      std::vector<uint8_t> a(bytes), b(bytes);
      ASSERT_EQ(cudaMemcpy(a.data(), kv ? pv.v_pages : pv.k_pages, bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      ASSERT_EQ(cudaMemcpy(b.data(), kv ? ov.v_pages : ov.k_pages, bytes, cudaMemcpyDeviceToHost),
                cudaSuccess);
      size_t stray = 0;
      for (size_t i = 0; i < bytes; ++i) stray += b[i] == 0x7f && a[i] != 0x7f;
      EXPECT_EQ(stray, 0u) << "layer " << l << (kv ? " V" : " K");
    }
  }
}

#endif

// fp8 KV on the device: the calibration pass gives the CPU model's maxima on the same weights
// (within bf16 rounding: the device's are read from its bf16 pools), and an fp8 cache with those
// scales gives logits near the bf16 cache's.
TEST_P(LlamaCudaSynthetic, Fp8KvCalibratedOnTheDevice) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config(GetParam());
  LlamaModelCuda m(cfg, 5);
  LlamaModel cpu(make_hashed_synthetic_model_file(cfg, 5));
  std::vector<int32_t> calib;
  for (int i = 0; i < 70; ++i) calib.push_back(int32_t((i * 37 + 11) % 300));
  const Model::KvAbsMax dev = m.kv_absmax(calib), host = cpu.kv_absmax(calib);
  ASSERT_EQ(dev.k.size(), size_t(cfg.num_layers * cfg.num_kv_heads));
  ASSERT_EQ(dev.k.size(), host.k.size());
  for (size_t i = 0; i < dev.k.size(); ++i) {
    EXPECT_GT(dev.k[i], 0.f);
    EXPECT_NEAR(dev.k[i], host.k[i], 2e-2 * host.k[i]) << "K max, layer x head " << i;
    EXPECT_NEAR(dev.v[i], host.v[i], 2e-2 * host.v[i]) << "V max, layer x head " << i;
  }
  KvCacheConfig bf = cache_config(cfg, Device::cuda), f8 = bf;
  f8.dtype = DType::fp8_e4m3;
  KvCache bf_cache(bf), f8_cache(f8);
  calibrate_kv_scales(m, f8_cache, calib);
  const std::vector<float> lb = decode_run(m, bf_cache, 3, 8), l8 = decode_run(m, f8_cache, 3, 8);
  for (float x : l8) ASSERT_TRUE(std::isfinite(x));
  const double err = rel_err(lb, l8);
  std::printf("%s: fp8 KV against bf16 KV, relative logit error %.2e\n", GetParam().c_str(), err);
  EXPECT_LT(err, 5e-2);
  EXPECT_GT(err, 0.0) << "fp8 pools gave the bf16 logits bit for bit: were they used?";
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
    held.push_back(m.forward(make_step_batch(cache, {s}, toks), cache));
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
  EXPECT_EQ(m.forward(make_step_batch(cache, {s}, toks), cache).dim(0), 1);
}

// Per row of logits [rows, V], sampling.h's argmax.
std::vector<int32_t> host_argmax(const Tensor& logits) {
  const int64_t V = logits.dim(1);
  std::vector<int32_t> ids;
  for (int64_t r = 0; r < logits.dim(0); ++r) {
    ids.push_back(argmax(std::span<const float>(logits.data_as<float>() + r * V, size_t(V))));
  }
  return ids;
}

// forward_greedy's ids are the host argmax of forward's logits for the same batch: a ragged
// prefill with every row's logits, then decode steps fed the greedy tokens. Each batch runs
// twice on one cache (forward_greedy, then forward): the second run rewrites the same K/V.
// The lm_head's second half repeats its first (rows 150 + i = rows i), so each row's maximum
// should be tied with its twin (when the GEMM rounds both alike) and the lower id must win.
TEST(LlamaCudaSynthetic, ForwardGreedyIsTheHostArgmaxOfForward) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config("llama");  // untied: the lm_head is its own tensor
  ModelFile file = make_hashed_synthetic_model_file(cfg, 9);
  Tensor& head = file.tensors.at("lm_head.weight");  // [300, 256] f32
  const int64_t half = cfg.vocab_size / 2, H = cfg.hidden_size;
  std::memcpy(head.data_as<float>() + half * H, head.data_as<float>(), size_t(half * H) * 4);
  LlamaModelCuda m(file);
  KvCache cache(cache_config(cfg, Device::cuda));
  std::vector<SeqId> seqs;
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < 3; ++s) {
    seqs.push_back(cache.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < 5 + 9 * s; ++i) t.push_back(int32_t((i * 37 + s * 11 + 5) % 300));
    toks.push_back(t);
  }
  int64_t rows = 0, ties = 0;
  for (int step = 0; step < 5; ++step) {
    const ForwardBatch b = make_step_batch(cache, seqs, toks, /*all_logits=*/step == 0);
    const std::vector<int32_t> ids = m.forward_greedy(b, cache);
    const Tensor logits = m.forward(b, cache);
    ASSERT_EQ(ids.size(), b.logit_rows.size());
    EXPECT_EQ(ids, host_argmax(logits)) << "step " << step;
    for (size_t r = 0; r < ids.size(); ++r, ++rows) {
      const float* row = logits.data_as<float>() + int64_t(r) * cfg.vocab_size;
      const int32_t lo = ids[r] % int32_t(half);
      if (row[lo] == row[lo + half]) {
        ++ties;
        EXPECT_EQ(ids[r], lo) << "step " << step << " row " << r << ": the lower id of a tie";
      }
    }
    for (SeqId s : seqs) cache.commit(s);
    for (size_t s = 0; s < seqs.size(); ++s) {  // each sequence continues with its last row's id
      const auto it = std::find(b.logit_rows.begin(), b.logit_rows.end(), b.q_indptr[s + 1] - 1);
      ASSERT_NE(it, b.logit_rows.end());
      toks[s] = {ids[size_t(it - b.logit_rows.begin())]};
    }
  }
  std::printf("forward_greedy: %lld of %lld rows had their maximum tied\n", (long long)ties,
              (long long)rows);
  // No logit rows: no ids (and nothing to download).
  ForwardBatch b = make_step_batch(cache, seqs, toks);
  b.logit_rows.clear();
  EXPECT_TRUE(m.forward_greedy(b, cache).empty());
}

// A plan row for params p at generated token `step`, with the edits of a history `toks`.
void add_plan_row(SamplePlan& plan, const SamplingParams& p, const std::vector<int32_t>& toks,
                  int step) {
  LogitEditor editor(p, toks);
  RowSampling row = row_sampling(p, uint64_t(step), p.logprobs);
  row.edit_begin = int32_t(plan.edits.size());
  plan.edits.insert(plan.edits.end(), editor.edits().begin(), editor.edits().end());
  row.edit_end = int32_t(plan.edits.size());
  plan.rows.push_back(row);
}

// forward_sample: the device sampler on the step's logits picks what the host twin picks on
// forward's logits of the same batch (greedy rows and top-N lists exactly; drawn rows the same token
// but where rounding moves a boundary), with penalties, bias, filters and logprobs.
TEST(LlamaCudaSynthetic, ForwardSampleIsTheHostTwinOfForward) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config("llama");
  LlamaModelCuda m(cfg, 21);
  KvCache cache(cache_config(cfg, Device::cuda));
  std::vector<SeqId> seqs;
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < 4; ++s) {
    seqs.push_back(cache.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < 6 + 5 * s; ++i) t.push_back(int32_t((i * 41 + s * 13 + 2) % 300));
    toks.push_back(t);
  }
  int rows = 0, equal = 0;
  for (int step = 0; step < 6; ++step) {
    const ForwardBatch b = make_step_batch(cache, seqs, toks);
    SamplePlan plan;
    for (size_t r = 0; r < b.logit_rows.size(); ++r) {
      SamplingParams p;
      p.temperature = r == 0 ? 0.f : 0.6f + 0.2f * float(r);
      p.top_k = r == 2 ? 0 : 20;
      p.top_p = r == 3 ? 0.8f : 1.f;
      p.repetition_penalty = 1.3f;
      p.logit_bias = {{7, 5.f}};
      p.seed = 1000 + r;
      p.logprobs = int32_t(r) * 3;
      add_plan_row(plan, p, toks[r], step);
    }
    const std::vector<TokenLogprobs> dev = m.forward_sample(b, cache, plan);
    const Tensor logits = m.forward(b, cache);
    const std::vector<TokenLogprobs> host =
        sample_rows(logits.data_as<float>(), logits.dim(0), logits.dim(1), plan);
    ASSERT_EQ(dev.size(), host.size());
    for (size_t r = 0; r < dev.size(); ++r, ++rows) {
      equal += dev[r].token == host[r].token;
      if (plan.rows[r].temperature == 0.f) {
        EXPECT_EQ(dev[r].token, host[r].token) << step;
      }
      const std::span<const float> raw(logits.data_as<float>() + int64_t(r) * cfg.vocab_size,
                                       size_t(cfg.vocab_size));
      const TokenLogprobs want = token_logprobs(raw, dev[r].token, plan.rows[r].logprobs);
      EXPECT_NEAR(dev[r].logprob, want.logprob, 1e-4);
      ASSERT_EQ(dev[r].top.size(), want.top.size());
      for (size_t j = 0; j < want.top.size(); ++j)
        EXPECT_EQ(dev[r].top[j].first, want.top[j].first);
    }
    for (SeqId s : seqs) cache.commit(s);
    for (size_t s = 0; s < seqs.size(); ++s) toks[s] = {dev[s].token};
  }
  EXPECT_GE(equal, rows - 1) << equal << " of " << rows << " rows drew the host twin's token";
  // A plan that does not fit the batch is refused before anything runs.
  const ForwardBatch b = make_step_batch(cache, seqs, toks);
  SamplePlan bad;
  bad.rows.resize(1);
  EXPECT_THROW(m.forward_sample(b, cache, bad), Error);
}

// The mix on every row of a step (seeded, logprobs), with the histories' edits.
SamplePlan mixed_plan(const ForwardBatch& b, const std::vector<std::vector<int32_t>>& toks,
                      int step) {
  SamplePlan plan;
  for (size_t r = 0; r < b.logit_rows.size(); ++r) {
    SamplingParams p;
    p.temperature = 0.8f, p.top_k = 50, p.top_p = 0.95f, p.repetition_penalty = 1.1f;
    p.logprobs = 5, p.seed = 77 + r;
    add_plan_row(plan, p, toks[r], step);
  }
  return plan;
}

// begin_sample + finish_sample (the pass enqueued, then the plan checked and sampled) give what
// forward_sample gives; a plan that does not fit fails finish_sample, and the same step run again
// on the same cache gives forward_sample's tokens (the failed call's K/V writes are overwritten);
// finish_sample without its begin_sample, or after another pass, is refused.
TEST(LlamaCudaSynthetic, BeginAndFinishSampleAreForwardSample) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config("llama");
  LlamaModelCuda a(cfg, 23), b(cfg, 23);
  KvCache ca(cache_config(cfg, Device::cuda)), cb(cache_config(cfg, Device::cuda));
  std::vector<SeqId> sa, sb;
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < 3; ++s) {
    sa.push_back(ca.create_sequence());
    sb.push_back(cb.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < 5 + 7 * s; ++i) t.push_back(int32_t((i * 29 + s * 11 + 1) % 300));
    toks.push_back(t);
  }
  EXPECT_THROW(b.finish_sample(SamplePlan{}), Error);
  for (int step = 0; step < 5; ++step) {
    const ForwardBatch ba = make_step_batch(ca, sa, toks), bb = make_step_batch(cb, sb, toks);
    const SamplePlan plan = mixed_plan(ba, toks, step);
    const std::vector<TokenLogprobs> want = a.forward_sample(ba, ca, plan);
    if (step == 2) {
      SamplePlan bad = plan;
      bad.edits[0].token = cfg.vocab_size;  // outside the vocabulary
      b.begin_sample(bb, cb);
      try {
        b.finish_sample(bad);
        ADD_FAILURE() << "a plan with a token outside the vocabulary was taken";
      } catch (const Error& e) {
        EXPECT_NE(std::string(e.what()).find("outside the vocabulary"), std::string::npos)
            << e.what();
      }
      // A plain pass while one is open is refused; the open one stays and finishes (the same
      // batch again: the same K/V written, the same tokens as below).
      b.begin_sample(bb, cb);
      EXPECT_THROW(b.forward_greedy(bb, cb), Error);
      EXPECT_EQ(b.finish_sample(plan).size(), want.size());
      EXPECT_THROW(b.finish_sample(plan), Error);  // none open
    }
    b.begin_sample(bb, cb);
    const std::vector<TokenLogprobs> got = b.finish_sample(plan);
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(got[r].token, want[r].token) << "step " << step << " row " << r;
      EXPECT_EQ(got[r].logprob, want[r].logprob) << "step " << step << " row " << r;
      ASSERT_EQ(got[r].top.size(), want[r].top.size());
      for (size_t j = 0; j < want[r].top.size(); ++j)
        EXPECT_EQ(got[r].top[j], want[r].top[j]) << "step " << step << " row " << r;
    }
    for (SeqId s : sa) ca.commit(s);
    for (SeqId s : sb) cb.commit(s);
    for (size_t s = 0; s < toks.size(); ++s) toks[s] = {want[s].token};
  }
}

// Sampled steps with CUDA graphs (the decode pass's and the sampler's own, replayed once their
// launches repeat) give the tokens, log-probabilities and top lists of plain launches, bit for bit.
TEST(LlamaCudaSynthetic, SampledStepsReplayTheSamplerGraph) {
  PA_SKIP_WITHOUT_GPU();
  const ModelConfig cfg = tiny_config("llama");
  LlamaModelCuda g(cfg, 23), p(cfg, 23);
  p.set_cuda_graphs(false);
  KvCache cg(cache_config(cfg, Device::cuda)), cp(cache_config(cfg, Device::cuda));
  std::vector<SeqId> sg, sp;
  std::vector<std::vector<int32_t>> toks;
  for (int s = 0; s < 3; ++s) {
    sg.push_back(cg.create_sequence());
    sp.push_back(cp.create_sequence());
    std::vector<int32_t> t;
    for (int i = 0; i < 4 + 6 * s; ++i) t.push_back(int32_t((i * 23 + s * 5 + 3) % 300));
    toks.push_back(t);
  }
  constexpr int kSteps = 12;
  for (int step = 0; step < kSteps; ++step) {
    const ForwardBatch bg = make_step_batch(cg, sg, toks), bp = make_step_batch(cp, sp, toks);
    const SamplePlan plan = mixed_plan(bg, toks, step);
    g.begin_sample(bg, cg);
    const std::vector<TokenLogprobs> got = g.finish_sample(plan);
    const std::vector<TokenLogprobs> want = p.forward_sample(bp, cp, plan);
    ASSERT_EQ(got.size(), want.size());
    for (size_t r = 0; r < got.size(); ++r) {
      EXPECT_EQ(got[r].token, want[r].token) << "step " << step << " row " << r;
      EXPECT_EQ(got[r].logprob, want[r].logprob) << "step " << step << " row " << r;
      EXPECT_EQ(got[r].top, want[r].top) << "step " << step << " row " << r;
    }
    for (SeqId s : sg) cg.commit(s);
    for (SeqId s : sp) cp.commit(s);
    for (size_t s = 0; s < toks.size(); ++s) toks[s] = {want[s].token};
  }
  const Model::GraphStats st = g.cuda_graph_stats();
  std::printf("sampler graphs: %lld captured, %lld launches replayed; decode steps %lld / %lld\n",
              (long long)st.sampler_captures, (long long)st.sampler_replays,
              (long long)st.captures, (long long)st.replays);
  EXPECT_GE(st.sampler_replays, kSteps - 4);
  EXPECT_GE(st.replays, kSteps - 4);
  EXPECT_EQ(p.cuda_graph_stats().sampler_captures, 0);
}

// Crafted rows for the device argmax: rows of length V with the id sampling.h's argmax must give
// (checked against it on the host, GPU or not).
struct ArgmaxRow {
  std::vector<float> x;
  int32_t want;
};

std::vector<ArgmaxRow> argmax_rows_for(int32_t V) {
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  std::mt19937 rng(static_cast<uint32_t>(V));
  auto uniform = [&] {  // values in [-5, 5), below the 9s placed as maxima
    std::vector<float> x(static_cast<size_t>(V));
    for (float& v : x) v = float(rng() % 1000) / 100.f - 5.f;
    return x;
  };
  const size_t last = size_t(V) - 1, mid = size_t(V) / 2;
  std::vector<ArgmaxRow> rows;
  rows.push_back({std::vector<float>(size_t(V), 0.f), 0});   // all tied: the first
  rows.push_back({std::vector<float>(size_t(V), -inf), 0});  // all -inf: the first
  rows.push_back({std::vector<float>(size_t(V), 7.f), 0});   // all tied again
  {
    auto x = uniform();  // the maximum in the last element (the scalar tail when V % 4 != 0)
    x[last] = 9.f;
    rows.push_back({x, int32_t(last)});
  }
  {
    auto x = uniform();  // a NaN x[0] gives 0 whatever follows (the host's running maximum)
    x[0] = nan;
    x[mid] = 9.f;
    rows.push_back({x, 0});
  }
  {
    std::vector<float> x(size_t(V), nan);  // NaN everywhere but x[0] = -inf: 0
    x[0] = -inf;
    rows.push_back({x, 0});
  }
  if (V >= 2) {
    std::vector<float> x(size_t(V), nan);  // NaNs never win: the one number after x[0] above it
    x[0] = -2.f;
    x[last] = -1.f;
    rows.push_back({x, int32_t(last)});
    auto y = uniform();  // the maximum at 1 (a head element when the row starts unaligned)
    y[1] = 9.f;
    rows.push_back({y, 1});
    std::vector<float> z(size_t(V), -inf);  // one finite value among -infs
    z[last] = -1e30f;
    rows.push_back({z, int32_t(last)});
  }
  if (V >= 3) {
    auto x = uniform();  // ties at the maximum: the lowest of them
    x[last] = 9.f;
    x[mid] = 9.f;
    x[1] = 9.f;
    rows.push_back({x, 1});
    auto y = uniform();  // +inf twice
    y[last] = inf;
    y[mid] = inf;
    rows.push_back({y, int32_t(mid)});
    std::vector<float> z(size_t(V), -1.f);  // signed zeros compare equal: the lower id
    z[1] = -0.f;
    z[2] = 0.f;
    rows.push_back({z, 1});
    z[1] = 0.f;
    z[2] = -0.f;
    rows.push_back({z, 1});
  }
  // Random rows of few distinct values (ties everywhere), NaNs, infinities and signed zeros.
  for (int t = 0; t < 8; ++t) {
    std::vector<float> x(static_cast<size_t>(V));
    for (float& v : x) v = float(int(rng() % 9)) - 4.f;
    for (int k = 0; k < 3; ++k) {
      if (rng() % 2) x[rng() % x.size()] = nan;
      if (rng() % 3 == 0) x[rng() % x.size()] = -0.f;
      if (rng() % 4 == 0) x[rng() % x.size()] = inf;
      if (rng() % 4 == 0) x[rng() % x.size()] = -inf;
    }
    if (t == 0) x[0] = nan;
    rows.push_back({x, argmax(x)});
  }
  return rows;
}

// Lengths around the vector width (4 floats) and the block's unrolled span (512 threads x 4
// vectors x 4 floats = 8192), and Llama-3's vocabulary (+1: rows after the first start unaligned).
const std::vector<int32_t> kArgmaxLengths = {1, 2, 3, 4, 5, 7, 8, 300, 1027, 8192, 20003, 128257};

TEST(LlamaCudaSynthetic, ArgmaxRowsExpectationsAreTheHostArgmax) {
  for (int32_t V : kArgmaxLengths) {
    const std::vector<ArgmaxRow> rows = argmax_rows_for(V);
    for (size_t r = 0; r < rows.size(); ++r) {
      EXPECT_EQ(argmax(rows[r].x), rows[r].want) << "V " << V << " row " << r;
    }
  }
}

#ifdef PAGEDATTN_HAVE_CUDA
// x on the device; launch(x, ids) writes ids [R] there; they come back to the host.
template <class Launch>
std::vector<int32_t> device_ids(const std::vector<float>& x, int32_t R, Launch&& launch) {
  Tensor dx = Tensor::empty({int64_t(x.size())}, DType::f32, Device::cuda);
  Tensor dids = Tensor::empty({int64_t(R)}, DType::f32, Device::cuda);  // 4-byte ids
  copy_bytes(dx.data(), Device::cuda, x.data(), Device::cpu, x.size() * 4);
  launch(dx.data_as<float>(), static_cast<int32_t*>(dids.data()));
  std::vector<int32_t> ids(size_t(R), -1);
  copy_bytes(ids.data(), Device::cpu, dids.data(), Device::cuda, size_t(R) * 4);
  return ids;
}

TEST(LlamaCudaSynthetic, DeviceArgmaxOfCraftedRows) {
  PA_SKIP_WITHOUT_GPU();
  for (int32_t V : kArgmaxLengths) {
    const std::vector<ArgmaxRow> rows = argmax_rows_for(V);
    const int32_t R = int32_t(rows.size());
    // [R, V] packed: with V % 4 != 0 the rows after the first start off a 16-byte boundary.
    std::vector<float> x;
    for (const ArgmaxRow& row : rows) x.insert(x.end(), row.x.begin(), row.x.end());
    const std::vector<int32_t> ids = device_ids(x, R, [&](const float* dx, int32_t* dids) {
      cuda::argmax_rows(dx, R, V, dids, nullptr);
    });
    for (int32_t r = 0; r < R; ++r) {
      EXPECT_EQ(ids[size_t(r)], rows[size_t(r)].want) << "V " << V << " row " << r;
    }
  }
}

// A tensor-parallel greedy step's argmax: each rank's vocabulary slice (stride ceil(V / world),
// the last slices narrower or empty) reduced to a pair per row, the pairs folded: the whole rows'
// ids, NaN, infinity and tie rules included.
TEST(LlamaCudaSynthetic, DeviceArgmaxOverSlicesIsTheWholeRowsArgmax) {
  PA_SKIP_WITHOUT_GPU();
  for (int32_t V : kArgmaxLengths) {
    const std::vector<ArgmaxRow> rows = argmax_rows_for(V);
    const int32_t R = int32_t(rows.size());
    for (int32_t world : {2, 3, 4}) {
      const int32_t stride = (V + world - 1) / world;
      // Slice w [R, stride]: ids w * stride ... of every row, past the vocabulary left as NaN
      // (never read: the slice's width stops at V).
      std::vector<float> x(size_t(world) * size_t(R) * size_t(stride),
                           std::numeric_limits<float>::quiet_NaN());
      for (int32_t w = 0; w < world; ++w)
        for (int32_t r = 0; r < R; ++r)
          for (int32_t j = 0; j < stride && w * stride + j < V; ++j)
            x[(size_t(w) * R + size_t(r)) * stride + size_t(j)] =
                rows[size_t(r)].x[size_t(w * stride + j)];
      Tensor dpairs = Tensor::empty({int64_t(world) * R * 2}, DType::f32, Device::cuda);
      auto* pairs = static_cast<cuda::ArgmaxPair*>(dpairs.data());
      const std::vector<int32_t> ids = device_ids(x, R, [&](const float* dx, int32_t* dids) {
        for (int32_t w = 0; w < world; ++w) {
          const int32_t width = std::max(0, std::min(stride, V - w * stride));
          cuda::argmax_rows_slice(dx + int64_t(w) * R * stride, R, width, stride, w * stride,
                                  pairs + int64_t(w) * R, nullptr);
        }
        cuda::argmax_combine(pairs, world, R, dids, nullptr);
      });
      for (int32_t r = 0; r < R; ++r) {
        EXPECT_EQ(ids[size_t(r)], rows[size_t(r)].want)
            << "V " << V << " world " << world << " row " << r;
      }
    }
  }
}
#endif

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
  const Tensor l = m->forward(make_step_batch(cache, {s}, {prompt}), cache);
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
