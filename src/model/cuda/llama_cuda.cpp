// LlamaModelCuda: bf16 weights on the device, cuBLAS for the matrix products, the fused kernels of
// llama_kernels.cu for the rest, paged attention over the cache's device pools.
#include "pagedattn/llama_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstring>
#include <map>
#include <string>
#include <unordered_set>

#include "llama_kernels.h"
#include "pagedattn/attention_cuda.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/synthetic_model.h"
#include "rope.h"
#include "step_graphs.h"
#include "synthetic_fill.h"

namespace pagedattn {

namespace {

constexpr const char* kOp = "LlamaModelCuda";

void check_cuda(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(kOp, ": ", what, ": ", cudaGetErrorString(e));
}

void check_cublas(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    fail(kOp, ": ", what, ": ", cublasGetStatusString(s), " (status ", int(s), ")");
  }
}

// Device storage of at least `elems` values of dtype (regrown, never shrunk).
void* ensure(Tensor& t, int64_t elems, DType dtype) {
  elems = std::max<int64_t>(elems, 1);
  if (!t.defined() || t.numel() < elems || t.dtype() != dtype) {
    t = Tensor();
    t = Tensor::empty({elems}, dtype, Device::cuda);
  }
  return t.data();
}

const float* host_f32(const ModelFile& f, const std::string& name) {
  // LlamaModel's constructor has checked that the tensor exists with the right shape and dtype.
  return f.tensors.at(name).data_as<float>();
}

}  // namespace

struct LlamaModelCuda::Impl {
  struct Layer {
    Tensor attn_norm, mlp_norm;  // [hidden] f32
    Tensor wqkv;                 // [(Hq + 2 Hkv) * D, hidden] bf16 (q, k, v rows stacked)
    Tensor bqkv;                 // [(Hq + 2 Hkv) * D] f32 (Qwen2) or empty
    Tensor q_norm, k_norm;       // [D] f32 (Qwen3) or empty
    Tensor wo;                   // [hidden, Hq * D] bf16
    Tensor wgu;                  // [2 * intermediate, hidden] bf16 (gate rows, then up rows)
    Tensor wd;                   // [hidden, intermediate] bf16
  };

  ModelConfig config;
  std::vector<double> inv_freq;  // [D / 2]
  std::vector<Layer> layers;
  Tensor embed;       // [vocab, hidden] bf16
  Tensor lm_head;     // [vocab, hidden] bf16, empty when tied (embed is used)
  Tensor final_norm;  // [hidden] f32
  size_t weight_bytes = 0, step_weight_bytes = 0;
  cublasHandle_t cublas = nullptr;
  // Every forward's work goes on this stream (a blocking one: the legacy default stream's copies
  // and memsets stay ordered with it); decode steps may replay CUDA graphs of it.
  cudaStream_t stream = nullptr;
  Tensor cublas_workspace;  // given to cuBLAS: no allocation while a graph is captured
  cuda::StepGraphs graphs;
  bool use_graphs = true;
  std::unique_ptr<CudaAttentionPlan> plan;
  Tensor staging;  // f32 weights on their way to bf16 (load from a file only)

  // Per-step device scratch, grown on demand.
  Tensor meta;  // tokens [T], slots [T], logit rows [R], rope cos [T, D/2], sin [T, D/2] (4 bytes
                // each)
  Tensor x;     // [T, hidden] f32, the residual stream
  Tensor h;     // [T, max(hidden, Hq * D)] bf16
  Tensor qkv;   // [T, (Hq + 2 Hkv) * D] f32
  Tensor q, k, v;  // [T, Hq, D], [T, Hkv, D] bf16
  Tensor attn;     // [T, Hq, D] bf16
  Tensor gu;       // [T, 2 * intermediate] bf16
  Tensor act;      // [T, intermediate] bf16
  Tensor logits;   // [R, vocab] f32
  Tensor ids;      // [R] int32 (4-byte f32 storage), the greedy step's argmax of each logit row
  std::vector<int32_t> host_meta, kv_len, block_table;
  std::vector<float> rope_cos, rope_sin;

  // Where the weights come from while loading: the file's host f32 tensors, or (file null) the
  // synthetic hash of (seed, tensor id, index), filled on the device.
  const ModelFile* file = nullptr;
  uint64_t seed = 0;
  std::map<std::string, SyntheticTensor> synthetic;  // by name

  // Page-locked host buffers the logits are downloaded into (a pageable destination makes the
  // driver stage the copy at a fraction of the bus speed). A buffer is handed out again once no
  // returned Tensor shares it.
  struct Pinned {
    std::shared_ptr<void> storage;
    size_t bytes = 0;
  };
  std::vector<Pinned> pinned;

  ~Impl() {
    graphs.clear();
    if (cublas) cublasDestroy(cublas);
    if (stream) cudaStreamDestroy(stream);
  }

  // The n f32 values of tensor `name` into dst (device).
  void put_f32(const std::string& name, int64_t n, float* dst) {
    if (file) {
      check_cuda(cudaMemcpy(dst, host_f32(*file, name), size_t(n) * 4, cudaMemcpyHostToDevice),
                 "weight upload");
    } else {
      const SyntheticTensor& t = synthetic.at(name);
      cuda::fill_synthetic_f32(dst, n, synthetic::tensor_key(seed, t.id), t.center, t.half_width,
                               nullptr);
    }
  }
  // The n values of tensor `name` as bf16 into dst (device).
  void put_bf16(const std::string& name, int64_t n, uint16_t* dst) {
    if (file) {
      float* s = static_cast<float*>(ensure(staging, n, DType::f32));
      check_cuda(cudaMemcpy(s, host_f32(*file, name), size_t(n) * 4, cudaMemcpyHostToDevice),
                 "weight upload");
      cuda::f32_to_bf16_device(s, n, dst, nullptr);
    } else {
      const SyntheticTensor& t = synthetic.at(name);
      cuda::fill_synthetic_bf16(dst, n, synthetic::tensor_key(seed, t.id), t.center, t.half_width,
                                nullptr);
    }
  }
  // Several f32 vectors stacked into one f32 device tensor.
  Tensor stack_f32(const std::vector<std::string>& names, const std::vector<int64_t>& sizes) {
    int64_t total = 0;
    for (int64_t n : sizes) total += n;
    Tensor t = Tensor::empty({total}, DType::f32, Device::cuda);
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      put_f32(names[i], sizes[i], t.data_as<float>() + at);
      at += sizes[i];
    }
    weight_bytes += t.nbytes();
    return t;
  }
  // Several [rows_i, cols] matrices stacked into one bf16 [sum rows_i, cols] device tensor.
  Tensor stack_bf16(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                    int64_t cols) {
    int64_t total = 0;
    for (int64_t r : rows) total += r;
    Tensor t = Tensor::empty({total, cols}, DType::bf16, Device::cuda);
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      put_bf16(names[i], rows[i] * cols, t.data_as<uint16_t>() + at * cols);
      at += rows[i];
    }
    weight_bytes += t.nbytes();
    return t;
  }

  // Builds every weight from `file` (or, null, from the synthetic fill of `seed`); config is set.
  void load(const ModelFile* file, uint64_t seed);

  // A host f32 tensor [rows, cols] for the logits: page-locked and reused where it can be.
  Tensor host_logits(int64_t rows, int64_t cols);

  // y [T, out] (ytype: f32 or bf16) = beta * y + x [T, in] (bf16) W^T, W [out, in] bf16, fp32
  // accumulation; beta is 0 or 1 (1: f32 y only). cuBLAS for every shape: the lab's skinny GEMM
  // (kernels_dev/skinny_gemm.cu) is slower at every decode shape but lm_head.
  void gemm(const void* x_, int32_t T, int32_t in, const Tensor& w, int32_t out, void* y,
            cudaDataType_t ytype, float beta, const char* what) {
    const float alpha = 1.f;
    // Column-major view: y^T [out, T] = W [out, in] (row-major = col-major W^T, hence OP_T) x^T.
    check_cublas(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &alpha, w.data(),
                              CUDA_R_16BF, in, x_, CUDA_R_16BF, in, &beta, y, ytype, out,
                              CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
                 what);
  }
};

void LlamaModelCuda::Impl::load(const ModelFile* from, uint64_t from_seed) {
  const ModelConfig& c = config;
  PA_CHECK(c.head_dim == 64 || c.head_dim == 128 || c.head_dim == 256, kOp, ": head_dim ",
           c.head_dim, " has no CUDA attention kernel (64, 128 or 256)");
  PA_CHECK(cuda_device_count() > 0, kOp, ": no CUDA device is available");
  file = from;
  seed = from_seed;
  if (!file) {
    for (const SyntheticTensor& t : synthetic_tensors(c)) synthetic.emplace(t.name, t);
  }
  inv_freq = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling);
  check_cublas(cublasCreate(&cublas), "cublasCreate");
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  check_cublas(cublasSetStream(cublas, stream), "cublasSetStream");
  constexpr int64_t kCublasWorkspace = int64_t(32) << 20;  // bytes
  cublas_workspace = Tensor::empty({kCublasWorkspace / 4}, DType::f32, Device::cuda);
  check_cublas(cublasSetWorkspace(cublas, cublas_workspace.data(), size_t(kCublasWorkspace)),
               "cublasSetWorkspace");
  plan = std::make_unique<CudaAttentionPlan>();

  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, D = c.head_dim;
  const int64_t q_dim = int64_t(c.num_q_heads) * D, kv_dim = int64_t(c.num_kv_heads) * D;
  embed = stack_bf16({"model.embed_tokens.weight"}, {c.vocab_size}, hidden);
  // NOTE: a separate lm_head exists exactly when the embeddings are not tied: LlamaModel's check
  // (file) and synthetic_tensors (no file) agree on that.
  const bool has_lm_head =
      file ? file->tensors.count("lm_head.weight") > 0 : synthetic.count("lm_head.weight") > 0;
  if (has_lm_head) lm_head = stack_bf16({"lm_head.weight"}, {c.vocab_size}, hidden);
  final_norm = stack_f32({"model.norm.weight"}, {hidden});
  for (int32_t i = 0; i < c.num_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    Layer L;
    L.attn_norm = stack_f32({p + "input_layernorm.weight"}, {hidden});
    L.mlp_norm = stack_f32({p + "post_attention_layernorm.weight"}, {hidden});
    L.wqkv = stack_bf16({p + "self_attn.q_proj.weight", p + "self_attn.k_proj.weight",
                         p + "self_attn.v_proj.weight"},
                        {q_dim, kv_dim, kv_dim}, hidden);
    if (c.attention_bias) {
      L.bqkv = stack_f32(
          {p + "self_attn.q_proj.bias", p + "self_attn.k_proj.bias", p + "self_attn.v_proj.bias"},
          {q_dim, kv_dim, kv_dim});
    }
    if (c.qk_norm) {
      L.q_norm = stack_f32({p + "self_attn.q_norm.weight"}, {D});
      L.k_norm = stack_f32({p + "self_attn.k_norm.weight"}, {D});
    }
    L.wo = stack_bf16({p + "self_attn.o_proj.weight"}, {hidden}, q_dim);
    L.wgu =
        stack_bf16({p + "mlp.gate_proj.weight", p + "mlp.up_proj.weight"}, {inter, inter}, hidden);
    L.wd = stack_bf16({p + "mlp.down_proj.weight"}, {hidden}, inter);
    layers.push_back(std::move(L));
  }
  check_cuda(cudaDeviceSynchronize(), "weight conversion");
  staging = Tensor();
  file = nullptr;
  synthetic.clear();
  // The embedding table is only gathered (a few rows per step) unless it is also the lm_head.
  step_weight_bytes = weight_bytes - (has_lm_head ? embed.nbytes() : 0);
}

Tensor LlamaModelCuda::Impl::host_logits(int64_t rows, int64_t cols) {
  // NOTE: pinned memory is a scarce system resource and slow to allocate: at most kMaxBuffers
  // buffers of at most kMaxBytes each (decode logits: [batch, vocab]); larger results (every row
  // of a long prefill) go to pageable memory.
  constexpr size_t kMaxBuffers = 4, kMaxBytes = size_t(64) << 20;
  const size_t bytes = size_t(rows) * size_t(cols) * 4;
  if (bytes == 0 || bytes > kMaxBytes) return Tensor::empty({rows, cols}, DType::f32);
  Pinned* slot = nullptr;
  for (Pinned& b : pinned) {
    if (b.storage.use_count() != 1) continue;  // a returned Tensor still holds it
    if (b.bytes >= bytes) return Tensor::wrap(b.storage, {rows, cols}, DType::f32, Device::cpu);
    slot = &b;  // free but too small: replace it
  }
  if (!slot && pinned.size() < kMaxBuffers) slot = &pinned.emplace_back();
  if (!slot) return Tensor::empty({rows, cols}, DType::f32);
  slot->storage.reset();
  slot->bytes = 0;
  void* p = nullptr;
  if (cudaMallocHost(&p, bytes) != cudaSuccess) {
    (void)cudaGetLastError();  // out of pinned memory: not an error, just slower
    return Tensor::empty({rows, cols}, DType::f32);
  }
  slot->storage = std::shared_ptr<void>(p, [](void* q) { cudaFreeHost(q); });
  slot->bytes = bytes;
  return Tensor::wrap(slot->storage, {rows, cols}, DType::f32, Device::cpu);
}

LlamaModelCuda::LlamaModelCuda(const ModelFile& file) : impl_(std::make_unique<Impl>()) {
  {
    // NOTE: the CPU model's constructor validates the config and every tensor (shape, dtype,
    // device) without copying anything; its messages are the ones users already see.
    const LlamaModel cpu_check(file);
    impl_->config = cpu_check.config();
  }
  impl_->load(&file, 0);
}

LlamaModelCuda::LlamaModelCuda(const ModelConfig& config, uint64_t seed)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  check_llama_config(impl_->config, kOp);
  impl_->load(nullptr, seed);
}

LlamaModelCuda::~LlamaModelCuda() = default;

const ModelConfig& LlamaModelCuda::config() const { return impl_->config; }

size_t LlamaModelCuda::weight_bytes() const { return impl_->weight_bytes; }

size_t LlamaModelCuda::step_weight_bytes() const { return impl_->step_weight_bytes; }

void LlamaModelCuda::set_cuda_graphs(bool enabled) {
  impl_->use_graphs = enabled;
  if (!enabled) impl_->graphs.clear();
}

LlamaModelCuda::GraphStats LlamaModelCuda::cuda_graph_stats() const {
  return GraphStats{impl_->graphs.captures(), impl_->graphs.replays()};
}

void LlamaModelCuda::validate(const ForwardBatch& b, const KvCache& cache) const {
  constexpr const char* op = "LlamaModelCuda::forward";
  const ModelConfig& config = impl_->config;
  const KvCacheConfig& cc = cache.config();
  PA_CHECK(cc.device == Device::cuda, op, ": cache is on ", device_name(cc.device),
           "; the CUDA model needs a CUDA cache");
  PA_CHECK(cc.dtype == DType::bf16 || cc.dtype == DType::fp8_e4m3, op, ": cache dtype is ",
           dtype_name(cc.dtype), "; the CUDA model writes bf16 or fp8_e4m3 K/V");
  PA_CHECK(cc.num_layers == config.num_layers && cc.num_kv_heads == config.num_kv_heads &&
               cc.head_dim == config.head_dim,
           op, ": cache has ", cc.num_layers, " layers x ", cc.num_kv_heads,
           " KV heads x head_dim ", cc.head_dim, ", the model needs ", config.num_layers, " x ",
           config.num_kv_heads, " x ", config.head_dim);
  const size_t num_seqs = b.seqs.size(), num_tokens = b.tokens.size();
  PA_CHECK(b.q_indptr.size() == num_seqs + 1, op, ": batch.q_indptr has ", b.q_indptr.size(),
           " entries, expected num_seqs + 1 = ", num_seqs + 1);
  PA_CHECK(b.q_indptr[0] == 0, op, ": batch.q_indptr[0] must be 0, got ", b.q_indptr[0]);
  for (size_t s = 0; s < num_seqs; ++s) {
    PA_CHECK(b.q_indptr[s + 1] >= b.q_indptr[s], op, ": batch.q_indptr decreases at ", s + 1);
  }
  PA_CHECK(size_t(b.q_indptr[num_seqs]) == num_tokens, op, ": batch.q_indptr ends at ",
           b.q_indptr[num_seqs], " but batch.tokens has ", num_tokens);
  PA_CHECK(b.positions.size() == num_tokens, op, ": batch.positions has ", b.positions.size(),
           " entries, batch.tokens ", num_tokens);
  PA_CHECK(b.slots.size() == num_tokens, op, ": batch.slots has ", b.slots.size(),
           " entries, batch.tokens ", num_tokens);
  for (size_t t = 0; t < num_tokens; ++t) {
    PA_CHECK(b.tokens[t] >= 0 && b.tokens[t] < config.vocab_size, op, ": batch.tokens[", t,
             "] = ", b.tokens[t], " is outside the vocabulary of ", config.vocab_size);
  }
  for (size_t r = 0; r < b.logit_rows.size(); ++r) {
    PA_CHECK(b.logit_rows[r] >= 0 && size_t(b.logit_rows[r]) < num_tokens, op,
             ": batch.logit_rows[", r, "] = ", b.logit_rows[r], " is not a token row (", num_tokens,
             " tokens)");
  }
  std::unordered_set<SeqId> seen;
  const int32_t ps = cc.page_size;
  for (size_t s = 0; s < num_seqs; ++s) {
    const SeqId seq = b.seqs[s];
    PA_CHECK(cache.has_sequence(seq), op, ": batch.seqs[", s, "] = ", seq, " is not in the cache");
    PA_CHECK(seen.insert(seq).second, op, ": batch.seqs[", s, "] = ", seq, " appears twice");
    const int32_t kv = cache.kv_len(seq), q_len = b.q_indptr[s + 1] - b.q_indptr[s];
    PA_CHECK(q_len <= kv, op, ": sequence ", seq, " has ", q_len, " new tokens but kv_len ", kv,
             " (reserve their slots with append_slots first)");
    const auto table = cache.block_table(seq);
    PA_CHECK(int64_t(table.size()) * ps >= kv, op, ": sequence ", seq, " has kv_len ", kv,
             " beyond its block table of ", table.size(), " pages");
    for (int32_t j = 0; j < q_len; ++j) {
      const size_t t = size_t(b.q_indptr[s] + j);
      const int32_t pos = kv - q_len + j;
      PA_CHECK(b.positions[t] == pos, op, ": batch.positions[", t, "] = ", b.positions[t],
               ", expected ", pos, " (kv_len - q_len + j of sequence ", seq, ")");
      const int32_t slot = table[size_t(pos / ps)] * ps + pos % ps;
      PA_CHECK(b.slots[t] == slot, op, ": batch.slots[", t, "] = ", b.slots[t], ", expected ", slot,
               " (position ", pos, " of sequence ", seq, " in its block table)");
    }
  }
}

const float* LlamaModelCuda::forward_device(const ForwardBatch& batch, KvCache& cache) {
  validate(batch, cache);
  Impl& m = *impl_;
  const ModelConfig& c = m.config;
  const int32_t num_seqs = int32_t(batch.seqs.size());
  const int32_t T = int32_t(batch.tokens.size()), R = int32_t(batch.logit_rows.size());
  const int32_t hidden = c.hidden_size, inter = c.intermediate_size, D = c.head_dim;
  const int32_t Hq = c.num_q_heads, Hkv = c.num_kv_heads, half = D / 2;
  const int32_t q_dim = Hq * D, qkv_dim = (Hq + 2 * Hkv) * D;
  if (T == 0) return nullptr;  // no logit rows either (validate: rows index tokens)

  // Host plan: kv_len, block tables padded to the longest, RoPE tables of the positions.
  size_t max_pages = 1;
  for (SeqId s : batch.seqs) max_pages = std::max(max_pages, cache.block_table(s).size());
  m.kv_len.resize(size_t(num_seqs));
  m.block_table.assign(size_t(num_seqs) * max_pages, 0);
  for (int32_t s = 0; s < num_seqs; ++s) {
    m.kv_len[size_t(s)] = cache.kv_len(batch.seqs[size_t(s)]);
    const auto table = cache.block_table(batch.seqs[size_t(s)]);
    std::copy(table.begin(), table.end(), m.block_table.begin() + ptrdiff_t(s * max_pages));
  }
  BatchLayout layout;
  layout.num_seqs = num_seqs;
  layout.q_indptr = batch.q_indptr.data();
  layout.kv_len = m.kv_len.data();
  layout.block_table = m.block_table.data();
  layout.max_pages_per_seq = int32_t(max_pages);
  m.rope_cos.resize(size_t(T) * size_t(half));
  m.rope_sin.resize(size_t(T) * size_t(half));
  rope_tables(m.inv_freq, batch.positions.data(), T, m.rope_cos.data(), m.rope_sin.data());

  // One upload: tokens, slots, logit rows, cos, sin (all 4-byte values).
  const size_t n_meta = size_t(2 * T + R) + 2 * m.rope_cos.size();
  m.host_meta.resize(n_meta);
  int32_t* hm = m.host_meta.data();
  std::copy(batch.tokens.begin(), batch.tokens.end(), hm);
  std::copy(batch.slots.begin(), batch.slots.end(), hm + T);
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), hm + 2 * T);
  std::memcpy(hm + 2 * T + R, m.rope_cos.data(), m.rope_cos.size() * 4);
  std::memcpy(hm + 2 * T + R + m.rope_cos.size(), m.rope_sin.data(), m.rope_sin.size() * 4);
  auto* dm = static_cast<int32_t*>(ensure(m.meta, int64_t(n_meta), DType::f32));
  check_cuda(cudaMemcpyAsync(dm, hm, n_meta * 4, cudaMemcpyHostToDevice, m.stream), "batch upload");
  const int32_t* d_tokens = dm;
  const int32_t* d_slots = dm + T;
  const int32_t* d_rows = dm + 2 * T;
  const auto* d_cos = reinterpret_cast<const float*>(dm + 2 * T + R);
  const float* d_sin = d_cos + m.rope_cos.size();

  float* x = static_cast<float*>(ensure(m.x, int64_t(T) * hidden, DType::f32));
  void* h = ensure(m.h, int64_t(T) * std::max(hidden, q_dim), DType::bf16);
  float* qkv = static_cast<float*>(ensure(m.qkv, int64_t(T) * qkv_dim, DType::f32));
  void* q = ensure(m.q, int64_t(T) * q_dim, DType::bf16);
  void* k = ensure(m.k, int64_t(T) * Hkv * D, DType::bf16);
  void* v = ensure(m.v, int64_t(T) * Hkv * D, DType::bf16);
  void* attn = ensure(m.attn, int64_t(T) * q_dim, DType::bf16);
  auto* gu = static_cast<uint16_t*>(ensure(m.gu, int64_t(T) * 2 * inter, DType::bf16));
  void* act = ensure(m.act, int64_t(T) * inter, DType::bf16);

  // Plan once for every layer (layer 0's view: all layers share shapes and dtype).
  const QKVTensor q_t{q, DType::bf16, T, Hq, D};
  QKVTensor out_t{attn, DType::bf16, T, Hq, D};
  AttentionOptions opt;
  opt.window = c.sliding_window;
  m.plan->plan(q_t, cache.layer_view(0), layout, opt, out_t, m.stream);
  float* dl = R > 0 ? static_cast<float*>(ensure(m.logits, int64_t(R) * c.vocab_size, DType::f32))
                    : nullptr;

  // Everything below only enqueues kernels on m.stream, reading the buffers above: a CUDA graph
  // of it replays correctly for any later step with the same launches (step_graphs.h).
  cudaStream_t st = m.stream;
  auto launch = [&] {
    cuda::embed_gather(m.embed.data_as<uint16_t>(), d_tokens, T, hidden, x, st);
    cuda::QkvParams qp;
    qp.num_tokens = T;
    qp.num_q_heads = Hq;
    qp.num_kv_heads = Hkv;
    qp.head_dim = D;
    qp.eps = c.rms_norm_eps;
    auto* hb = static_cast<uint16_t*>(h);
    auto opt_f32 = [](const Tensor& t) { return t.data_as<float>(); };  // null when absent
    for (int32_t i = 0; i < c.num_layers; ++i) {
      const Impl::Layer& L = m.layers[size_t(i)];
      // Attention block.
      cuda::rms_norm_bf16(x, L.attn_norm.data_as<float>(), nullptr, T, hidden, c.rms_norm_eps, hb,
                          st);
      m.gemm(h, T, hidden, L.wqkv, qkv_dim, qkv, CUDA_R_32F, 0.f, "qkv projection");
      cuda::qkv_post(qkv, opt_f32(L.bqkv), opt_f32(L.q_norm), opt_f32(L.k_norm), d_cos, d_sin, qp,
                     static_cast<uint16_t*>(q), static_cast<uint16_t*>(k),
                     static_cast<uint16_t*>(v), st);
      const PagedKVView view = cache.layer_view(i);
      write_kv_cuda(view, d_slots, T, k, v, DType::bf16, st);
      paged_attention_cuda(*m.plan, q_t, view, out_t, st);
      m.gemm(attn, T, q_dim, L.wo, hidden, x, CUDA_R_32F, 1.f, "o projection");
      // MLP block.
      cuda::rms_norm_bf16(x, L.mlp_norm.data_as<float>(), nullptr, T, hidden, c.rms_norm_eps, hb,
                          st);
      m.gemm(h, T, hidden, L.wgu, 2 * inter, gu, CUDA_R_16BF, 0.f, "gate/up projection");
      cuda::swiglu(gu, T, inter, static_cast<uint16_t*>(act), st);
      m.gemm(act, T, inter, L.wd, hidden, x, CUDA_R_32F, 1.f, "down projection");
    }

    if (R > 0) {
      cuda::rms_norm_bf16(x, m.final_norm.data_as<float>(), d_rows, R, hidden, c.rms_norm_eps, hb,
                          st);
      m.gemm(h, R, hidden, m.lm_head.data() ? m.lm_head : m.embed, c.vocab_size, dl, CUDA_R_32F,
             0.f, "lm_head");
    }
  };

  // Decode steps (one new token per sequence) go through the graph cache, keyed by everything the
  // launches take by value: counts, scratch and pool pointers, the attention plan's launches.
  const bool decode_step = T == num_seqs;
  if (m.use_graphs && decode_step) {
    std::string sig;
    auto put = [&sig](const auto& v) { sig.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    for (int64_t v : {int64_t(T), int64_t(R)}) put(v);
    const void* scratch[] = {dm, x, h, qkv, q, k, v, attn, gu, act, dl};
    for (const void* ptr : scratch) put(ptr);
    for (int32_t i = 0; i < c.num_layers; ++i) {
      const PagedKVView view = cache.layer_view(i);
      const void* pools[] = {view.k_pages, view.v_pages, view.k_scale, view.v_scale};
      for (const void* ptr : pools) put(ptr);
    }
    sig += m.plan->launch_signature();
    m.graphs.run(sig, st, launch);
  } else {
    launch();
  }
  if (R > 0) return dl;  // the caller's download (or argmax) follows on the same stream
  check_cuda(cudaStreamSynchronize(st), "forward");
  return nullptr;
}

Tensor LlamaModelCuda::forward(const ForwardBatch& batch, KvCache& cache) {
  const float* dl = forward_device(batch, cache);
  const int64_t R = int64_t(batch.logit_rows.size()), V = impl_->config.vocab_size;
  if (!dl) return Tensor::empty({R, V}, DType::f32);
  Tensor logits = impl_->host_logits(R, V);
  check_cuda(cudaMemcpy(logits.data(), dl, logits.nbytes(), cudaMemcpyDeviceToHost),
             "logits download");
  return logits;
}

std::vector<int32_t> LlamaModelCuda::forward_greedy(const ForwardBatch& batch, KvCache& cache) {
  const float* dl = forward_device(batch, cache);
  const int32_t R = int32_t(batch.logit_rows.size());
  std::vector<int32_t> ids(static_cast<size_t>(R));
  if (!dl) return ids;
  // NOTE: R ids instead of R x vocab logits: at batch 32 with a 128K vocabulary the logits are
  // 16 MB a step, and the host argmax over them is further time on the critical path.
  auto* d_ids = static_cast<int32_t*>(ensure(impl_->ids, R, DType::f32));
  cuda::argmax_rows(dl, R, impl_->config.vocab_size, d_ids, impl_->stream);
  check_cuda(cudaMemcpy(ids.data(), d_ids, size_t(R) * 4, cudaMemcpyDeviceToHost),
             "token ids download");
  return ids;
}

}  // namespace pagedattn
