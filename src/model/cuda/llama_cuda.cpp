// LlamaModelCuda: bf16 weights on the device, cuBLAS for the matrix products, the fused kernels of
// llama_kernels.cu for the rest, paged attention over the cache's device pools.
#include "pagedattn/llama_cuda.h"

#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <map>
#include <string>

#include "gemv.h"
#include "wgmma_gemm.h"
#include "llama_kernels.h"
#include "sampling_kernels.h"
#include "nccl_comm.h"
#include "peer_all_reduce.h"
#include "peer_embed.h"
#include "pagedattn/attention_cuda.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/synthetic_model.h"
#include "rope.h"
#include "decode_padding.h"
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

// A page-locked host buffer that grows (to twice what is asked, and at least doubling) and is
// reused. NOTE: twice, not just enough: the sample plan grows a little every step, and a
// reallocation (cudaFreeHost waits for the device, then pages are locked anew) in a decode step
// left the GPU idle for milliseconds.
struct PinnedBytes {
  void* p = nullptr;
  size_t cap = 0;
  PinnedBytes() = default;
  PinnedBytes(const PinnedBytes&) = delete;
  PinnedBytes& operator=(const PinnedBytes&) = delete;
  ~PinnedBytes() {
    if (p) cudaFreeHost(p);
  }
  uint8_t* get(size_t bytes) {
    if (bytes > cap) {
      if (p) cudaFreeHost(p);
      p = nullptr;
      cap = std::max<size_t>({2 * bytes, 2 * cap, 1 << 16});
      check_cuda(cudaMallocHost(&p, cap), "cudaMallocHost");
    }
    return static_cast<uint8_t*>(p);
  }
};

// ensure() for buffers that grow a little every step (the sample plan's edits grow with each
// sequence's history): twice what is asked, and at least double the old size, so reallocation (a
// cudaFree, which waits for the device) happens O(log n) times and not in the steps right after
// the first.
void* ensure_growing(Tensor& t, int64_t elems, DType dtype) {
  if (t.defined() && t.numel() >= elems && t.dtype() == dtype) return t.data();
  const int64_t old = t.defined() ? t.numel() : 0;
  return ensure(t, std::max<int64_t>({2 * elems, 2 * old, 4096}), dtype);
}

// Block b of host tensor t (f32, f16 or bf16; possibly memory-mapped: only the block's pages are
// read) as f32, contiguous [b.rows, b.cols].
std::vector<float> host_block_f32(const Tensor& t, const TpBlock& b) {
  std::vector<float> out(size_t(b.rows * b.cols));
  const auto* base = static_cast<const uint8_t*>(t.data());
  for (int64_t r = 0; r < b.rows; ++r) {
    const int64_t from = (b.row0 + r) * b.whole_cols + b.col0;
    for (int64_t c = 0; c < b.cols; ++c)
      out[size_t(r * b.cols + c)] = load_as_f32(base, t.dtype(), from + c);
  }
  return out;
}

// The checks of a model file for the CUDA runner: LlamaModel's (its messages) when every tensor
// is f32, else the config, the tensors' shapes and dtypes (f32, f16 or bf16 on the host; a GGUF
// file's matrices in its blocks, which load_model_file checked).
ModelConfig checked_config(const ModelFile& file) {
  bool all_f32 = file.weights.empty();
  for (const auto& [name, t] : file.tensors) all_f32 = all_f32 && t.dtype() == DType::f32;
  if (all_f32) {
    // NOTE: the CPU model's constructor validates the config and every tensor (shape, dtype,
    // device) without copying anything; its messages are the ones users already see.
    const LlamaModel cpu_check(file);
    return cpu_check.config();
  }
  ModelFile shapes;
  shapes.path = file.path;
  shapes.config = file.config;
  shapes.tensors = file.tensors;  // shares the storage
  shapes.weights = file.weights;  // a GGUF file's blocks (WeightFormat::stored), shared too
  check_llama_config(shapes.config, kOp);
  check_model_tensors(shapes);
  for (const auto& [name, t] : shapes.tensors) {
    PA_CHECK(t.device() == Device::cpu &&
                 (t.dtype() == DType::f32 || t.dtype() == DType::f16 || t.dtype() == DType::bf16),
             kOp, ": tensor ", name, " is ", dtype_name(t.dtype()), " on ",
             device_name(t.device()), "; expected f32, f16 or bf16 on the cpu");
  }
  return shapes.config;
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
  // Tensor parallelism: this rank's slice of the dimensions (the whole model when world is 1) and
  // the group's communicator (null: a plain single-GPU runner, no collectives).
  TpShard shard;
  TpSlices tp;
  cuda::NcclComm* comm = nullptr;
  // The decode steps' all-reduces over peer memory, fused with the residual add and the next
  // norm (null: NCCL for every all-reduce, e.g. ranks on several hosts).
  std::unique_ptr<cuda::PeerAllReduce> peer;
  // With peer memory: every rank's embedding slice mapped here (embed_norm_peers; world 0: no).
  cuda::PeerEmbedTable peer_embed;
  // The RoPE tables on the device: cos, then sin, [rope_rows, D / 2] f32 each, for positions
  // [0, rope_rows), grown (doubling) when a step reaches past them; the frequencies [D / 2] f64.
  // NOTE: host tables uploaded with each step cost a prefill chunk of 2048 tokens 1 MB of copies,
  // and their double-precision rows milliseconds of host time at every new position.
  Tensor rope_inv_freq_dev, rope_table;
  int32_t rope_rows = 0;
  void grow_rope_table(int32_t positions);
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
  cuda::StepGraphs graphs{16};  // padded decode steps: a few row counts, each a table stride or two
  cuda::StepGraphs sampler_graphs{8};  // the sampler and its download (enqueue_sampler)
  bool use_graphs = true;
  bool pad_decode = true;  // set_decode_padding
  bool use_gemv = true;  // PAGEDATTN_GEMV=0: cuBLAS for every product (a comparison)
  // PAGEDATTN_FUSE=0: K/V through write_kv and SwiGLU as its own kernel (a comparison).
  bool fuse = true;
  // PAGEDATTN_FOLD_NORM=0: every RMSNorm its own kernel (fold_norms; a comparison).
  bool fold_norm = true;
  bool overlap_passes = true;  // Model::overlaps_passes (PAGEDATTN_SCHEDULE_AHEAD=0: false)
  // A rank of several runs its o product on kWgmmaGemmBesideAttentionVersion
  // (PAGEDATTN_O_BESIDE_ATTENTION=0: on the version the shape picks; a comparison).
  bool o_beside_attention = true;
  // A rank of several runs its qkv product, behind the peer all-reduce (the first layer's behind
  // the embedding's kernel), on kWgmmaGemmBehindReduceVersion (PAGEDATTN_QKV_BEHIND_REDUCE=0: on
  // the version the shape picks; a comparison).
  bool qkv_behind_reduce = true;
  // A greedy step's ids from every rank's pairs through peer memory (PeerAllReduce::argmax_ids)
  // where the step's all-reduces go that way (PAGEDATTN_PEER_ARGMAX=0: NCCL's all-gather and
  // argmax_combine; a comparison).
  bool peer_argmax = true;
  // The qkv weights' rows in interleave_rope_rows' order (load sets it where the qkv epilogue can
  // run: fused kernels, no per-head norm of q and k, wgmma_gemm on this device), so that the qkv
  // product ends in qkv_post's work (wgmma_gemm_qkv) where wgmma_gemm takes it and the K/V go
  // straight to the pools; qkv_post reads the other products' rows in that order
  // (PAGEDATTN_QKV_EPILOGUE=0: the heads' own order, the product and qkv_post; a comparison).
  bool qkv_interleaved = false;
  // PAGEDATTN_QKV_VERSION=v: the qkv product on wgmma_gemm's version v wherever it runs there
  // (0: the rules of run_layer; a comparison).
  int qkv_version_forced = 0;
  std::unique_ptr<CudaAttentionPlan> plan;
  Tensor staging;  // f32 weights on their way to bf16 (load from a file only)

  // Per-step device scratch, grown on demand.
  Tensor meta;  // tokens [T], slots [T], logit rows [R], positions [T] (int32)
  Tensor rope_step;  // the tokens' RoPE rows: cos [T, D/2], then sin [T, D/2] (f32)
  Tensor x;     // [T, hidden] f32, the residual stream
  Tensor norm_sq;  // [T, sums_ld(hidden)] f32: a folded norm's sums of squares (fold_norms)
  Tensor h;     // [T, max(hidden, Hq * D)] bf16
  Tensor qkv;   // [T, (Hq + 2 Hkv) * D] f32
  Tensor q, k, v;  // [T, Hq, D], [T, Hkv, D] bf16
  Tensor attn;     // [T, Hq, D] bf16
  Tensor gu;       // [T, 2 * intermediate] bf16
  Tensor act;      // [T, intermediate] bf16
  Tensor logits;   // [R, vocab] f32
  Tensor shard_logits, gathered;  // [R, vocab_stride], [world, R, vocab_stride] f32 (comm only)
  Tensor ids;      // [R] int32 (4-byte f32 storage), the greedy step's argmax of each logit row
  // A greedy step of a tensor-parallel rank: its slice's argmax per row, every rank's [world, R]
  // (cuda::ArgmaxPair, two 4-byte values each).
  Tensor argmax_pairs, argmax_pairs_all;
  // A greedy step's lm_head through wgmma_gemm_argmax: its row blocks' (value, index) per row.
  Tensor head_pairs;
  bool greedy_step = false;  // the last forward_device took the argmax (download_greedy copies it)
  bool ids_only = false;     // ... and wrote no logits (a tensor-parallel rank, or head_pairs)
  // A greedy step of a tensor-parallel group leaves the logits unassembled, and one whose lm_head
  // went through wgmma_gemm_argmax leaves them unwritten: only its ids exist.
  void check_logits_assembled(const char* op) {
    PA_CHECK(!(greedy_step && ids_only), op, ": the step before took only its argmax ",
             "(forward_device's greedy), whose logits were not ",
             comm ? "gathered (a tensor-parallel rank)" : "written");
    greedy_step = false;
  }
  // The device sampler's plan in (rows, then edits), its results out (ids [R], logprob [R],
  // top ids [R, N], top logprobs [R, N]; 4-byte values), the edited logits' originals [E].
  Tensor sample_in, sample_out, sample_saved;
  PinnedBytes host_sample_in, host_sample_out;
  PinnedBytes host_ids;  // the greedy step's ids on their way to the host
  // Device time of the steps: an event before a step's first upload and one after its download.
  cudaEvent_t step_begin = nullptr, step_end = nullptr;
  bool step_open = false;
  // Passes begun (begin_greedy, begin_sample) and not yet finished, oldest first, each in a slot
  // of its own: the page-locked copy of its picks (read while the next pass runs, so not shared
  // with it) and events around the pass. The two slots alternate. A greedy pass writes its ids
  // into `ids` on the device, a sampled one (once pick_sampled gives its plan) into sample_out;
  // the pass begun after it reads them as its stand-in tokens before it writes its own (the same
  // stream). The graphs of the steps see one buffer of greedy ids (a graph is captured when a
  // step's launches repeat; two alternating buffers would never repeat).
  struct PassSlot {
    PinnedBytes host;
    cudaEvent_t begin = nullptr, end = nullptr;
    int32_t rows = 0;
    bool sampled = false, picked = false;
    const int32_t* picks = nullptr;  // on the device, once picked (greedy passes: at once)
    const float* logits = nullptr;   // a sampled pass's, until picked
    int32_t top_n = 0;               // a sampled pass: top log-probabilities per row downloaded
    std::vector<int32_t> logprobs;   // a sampled pass: each row's ask (RowSampling::logprobs)
  };
  void record_slot_event(PassSlot& g, bool begin_event);
  // The oldest open pass (greedy, or sampled and picked) once its end event has passed (its device
  // time counted), taken out of the open ones; an error drops every open pass.
  PassSlot& finish_oldest(bool sampled, const char* op);
  PassSlot pass_slots[2];
  std::deque<int> open_slots;
  double busy_seconds = 0;
  void begin_step_timing();
  void end_step_timing();  // records the step's end after its last copy and waits for it
  // The plan goes up on its own stream while the step's forward runs; the sampler waits on it.
  cudaStream_t upload_stream = nullptr;
  cudaEvent_t plan_ready = nullptr;

  // Uploads a checked plan (rows, then edits) to sample_in, on upload_stream.
  void stage_plan(const SamplePlan& plan);
  // The sampler over device logits dl [R, vocab] with the staged plan, enqueued with the download
  // of its results into `host` (n_out 4-byte values: ids [R], logprob [R], top ids [R, N], top
  // logprobs [R, N]); returns the ids on the device.
  const int32_t* enqueue_sampler(const float* dl, const SamplePlan& plan, PinnedBytes& host);
  // Those results (downloaded) as tokens: rows R, N top log-probabilities a row downloaded, each
  // row's ask.
  std::vector<TokenLogprobs> sampled_tokens(const int32_t* h, int32_t R, int32_t N,
                                            const std::vector<int32_t>& logprobs) const;
  std::vector<TokenLogprobs> run_sampler(const float* dl, const SamplePlan& plan);
  std::vector<int32_t> host_meta;

  // Where the weights come from while loading: the file's host tensors (f32, f16, bf16) or GGUF
  // blocks, or (file null) the synthetic hash of (seed, tensor id, index), filled on the device.
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
    sampler_graphs.clear();
    for (PassSlot& g : pass_slots) {
      if (g.begin) cudaEventDestroy(g.begin);
      if (g.end) cudaEventDestroy(g.end);
    }
    if (step_begin) cudaEventDestroy(step_begin);
    if (step_end) cudaEventDestroy(step_end);
    if (plan_ready) cudaEventDestroy(plan_ready);
    if (upload_stream) cudaStreamDestroy(upload_stream);
    if (cublas) cublasDestroy(cublas);
    if (stream) cudaStreamDestroy(stream);
  }

  // Block b of tensor `name` (tensor_parallel.h's TpBlock: this rank's rows and columns) into dst
  // (device, contiguous [b.rows, b.cols]) as f32.
  void put_f32(const std::string& name, const TpBlock& b, float* dst) {
    if (file && file->weights.count(name)) {
      // A GGUF file's blocks: only the block's rows (and, on block edges, columns) are read and
      // dequantised, a few rows at a time.
      const FileWeight& w = file->weights.at(name);
      const int64_t chunk =
          std::max<int64_t>(1, (int64_t(16) << 20) / std::max<int64_t>(b.cols, 1));  // 64 MB
      std::vector<float> host(size_t(std::min(chunk, b.rows) * b.cols));
      for (int64_t r = 0; r < b.rows; r += chunk) {
        const int64_t n = std::min(chunk, b.rows - r);
        dequantize_block(w, b.row0 + r, n, b.col0, b.cols, host.data());
        check_cuda(cudaMemcpy(dst + r * b.cols, host.data(), size_t(n * b.cols) * 4,
                              cudaMemcpyHostToDevice),
                   "weight upload");
      }
    } else if (file) {
      const Tensor& t = file->tensors.at(name);
      if (t.dtype() == DType::f32) {
        const float* src = t.data_as<float>() + b.row0 * b.whole_cols + b.col0;
        check_cuda(cudaMemcpy2D(dst, size_t(b.cols) * 4, src, size_t(b.whole_cols) * 4,
                                size_t(b.cols) * 4, size_t(b.rows), cudaMemcpyHostToDevice),
                   "weight upload");
      } else {
        const std::vector<float> host = host_block_f32(t, b);
        check_cuda(cudaMemcpy(dst, host.data(), host.size() * 4, cudaMemcpyHostToDevice),
                   "weight upload");
      }
    } else {
      const SyntheticTensor& t = synthetic.at(name);
      cuda::fill_synthetic_block_f32(dst, b.rows, b.cols, b.whole_cols,
                                     b.row0 * b.whole_cols + b.col0,
                                     synthetic::tensor_key(seed, t.id), t.center, t.half_width,
                                     nullptr);
    }
  }
  // The same block as bf16.
  void put_bf16(const std::string& name, const TpBlock& b, uint16_t* dst) {
    const int64_t n = b.rows * b.cols;
    const bool stored_bf16 = file && !file->weights.count(name) &&
                             file->tensors.at(name).dtype() == DType::bf16;
    if (stored_bf16) {  // as stored: no conversion
      const auto* src = file->tensors.at(name).data_as<uint16_t>() + b.row0 * b.whole_cols + b.col0;
      check_cuda(cudaMemcpy2D(dst, size_t(b.cols) * 2, src, size_t(b.whole_cols) * 2,
                              size_t(b.cols) * 2, size_t(b.rows), cudaMemcpyHostToDevice),
                 "weight upload");
    } else if (file) {
      float* st = static_cast<float*>(ensure(staging, n, DType::f32));
      put_f32(name, b, st);
      cuda::f32_to_bf16_device(st, n, dst, nullptr);
    } else {
      const SyntheticTensor& t = synthetic.at(name);
      cuda::fill_synthetic_block_bf16(dst, b.rows, b.cols, b.whole_cols,
                                      b.row0 * b.whole_cols + b.col0,
                                      synthetic::tensor_key(seed, t.id), t.center, t.half_width,
                                      nullptr);
    }
  }
  // This rank's block of tensor `name` of the given whole shape.
  TpBlock block(const std::string& name, const std::vector<int64_t>& shape) const {
    return tp_block(name, shape, config, shard);
  }
  // Several f32 vectors (this rank's parts) stacked into one f32 device tensor.
  Tensor stack_f32(const std::vector<std::string>& names, const std::vector<int64_t>& sizes) {
    std::vector<TpBlock> blocks;
    int64_t total = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      blocks.push_back(block(names[i], {sizes[i]}));
      total += blocks.back().cols;
    }
    Tensor t = Tensor::empty({total}, DType::f32, Device::cuda);
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      put_f32(names[i], blocks[i], t.data_as<float>() + at);
      at += blocks[i].cols;
    }
    weight_bytes += t.nbytes();
    return t;
  }
  // Several [rows_i, cols] matrices (this rank's blocks, all of the same width) stacked into one
  // bf16 [sum of block rows, block cols] device tensor.
  Tensor stack_bf16(const std::vector<std::string>& names, const std::vector<int64_t>& rows,
                    int64_t cols) {
    std::vector<TpBlock> blocks;
    int64_t total = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      blocks.push_back(block(names[i], {rows[i], cols}));
      total += blocks.back().rows;
      PA_ASSERT(blocks.back().cols == blocks.front().cols);
    }
    const int64_t block_cols = blocks.front().cols;
    Tensor t = Tensor::empty({total, block_cols}, DType::bf16, Device::cuda);
    int64_t at = 0;
    for (size_t i = 0; i < names.size(); ++i) {
      put_bf16(names[i], blocks[i], t.data_as<uint16_t>() + at * block_cols);
      at += blocks[i].rows;
    }
    weight_bytes += t.nbytes();
    return t;
  }

  // Builds this rank's weights from `file` (or, null, from the synthetic fill of `seed`); config,
  // shard and comm are set.
  void load(const ModelFile* file, uint64_t seed);

  // A step, in the CPU runner's order (forward_device): prepare_step, embed_tokens, run_layer for
  // every layer, logits_of_rows.
  struct Step;
  // slot >= 0: a greedy pass of begin_greedy, its ids into pass_slots[slot], its stand-in
  // tokens from the ids of the pass still open before it.
  Step prepare_step(const ForwardBatch& batch, const KvCache& cache, bool greedy, int slot);
  // Both return whether s.h already holds the next layer's normalised input (the peer
  // all-reduce wrote it), which the next run_layer then does not compute again.
  bool embed_tokens(const Step& s, cudaStream_t st);
  bool run_layer(int32_t i, const Step& s, const PagedKVView& view, bool normed, cudaStream_t st);
  void logits_of_rows(const Step& s, cudaStream_t st);

  // The rank's partial sum in x (o_proj / down_proj output) -> the sum over ranks, in place.
  void all_reduce(float* x, int64_t n, cudaStream_t st) {
    if (comm) comm->all_reduce_sum(x, size_t(n), st);
  }
  // Whether a step of T tokens sums its partial products through `peer` (the same answer on
  // every rank: T is the same on every rank).
  bool peer_step(int32_t T) const { return peer && T <= peer->max_rows(); }
  // Its slots: every step uses them in the order embed, (o, down) per layer, so no slot is used
  // twice in a row, within a step or across two.
  static constexpr int32_t kSlotO = 0, kSlotDown = 1, kSlotEmbed = 2;

  // A host f32 tensor [rows, cols] for the logits: page-locked and reused where it can be.
  Tensor host_logits(int64_t rows, int64_t cols);

  // A folded norm's sums of squares a token (NormFold::sq_ld): one per 64 of `hidden`, rounded
  // up to whole 16-byte vectors.
  static int32_t sums_ld(int32_t hidden) { return ((hidden + 63) / 64 + 3) / 4 * 4; }

  // Whether a step of T tokens folds its RMSNorms into the products around them
  // (wgmma_gemm.h's NormFold: all four products of a layer through wgmma_gemm, one GPU; the first
  // layer's first norm and the final one stay kernels).
  // NOTE: measured on an H100 (synthetic Llama-3-8B, 512-token prompts, three rounds alternating,
  // 2026-11-27): the step 3.3% shorter at batch 8, 2.3% at 16, 1.0% at 32, 0.3% at 64; on
  // SmolLM2-135M 4-12% from batch 4 to 64. On an H200 the Llama-3-8B step was 0.2-0.4% longer at
  // 32 and 64 (the products' weights stream in while a norm kernel runs): taken everywhere.
  bool fold_norms(int32_t T) const {
    // (A rank of several sums its products' partials after them, so x is whole only after the
    // all-reduce; a world of one folds as one GPU does and gives its bits.)
    if (!fold_norm || !fuse || (comm && shard.world > 1) || peer) return false;
    const ModelConfig& c = config;
    const int32_t hidden = c.hidden_size, D = c.head_dim, inter = tp.inter;
    const int32_t q_dim = tp.q_heads * D, qkv_dim = (tp.q_heads + 2 * tp.kv_heads) * D;
    auto wgmma = [&](int32_t N, int32_t K) {
      return !(use_gemv && cuda::gemv_pick(T, N, K)) && cuda::wgmma_gemm_pick(T, N, K);
    };
    // (gate/up: wgmma(2 inter, hidden) is wgmma_gemm_swiglu_takes where gemv does not take it.)
    return wgmma(qkv_dim, hidden) && wgmma(hidden, q_dim) && wgmma(hidden, inter) &&
           wgmma(2 * inter, hidden) && !(use_gemv && cuda::gemv_swiglu_takes(T, inter, hidden));
  }

  // Whether a greedy step of R rows takes its ids from the lm_head's product without logits
  // (wgmma_gemm_argmax), where gemm would run the product through wgmma_gemm.
  bool head_argmax(int32_t R) const {
    const int32_t V = comm ? tp.vocab : config.vocab_size, hidden = config.hidden_size;
    return !(use_gemv && cuda::gemv_pick(R, V, hidden)) &&
           cuda::wgmma_gemm_argmax_takes(R, V, hidden);
  }

  // Whether gemm runs the product `a` on wgmma_gemm: a folded norm's (fold_norms chose it), else
  // where gemv does not take it and wgmma_gemm does.
  bool takes_wgmma(const cuda::GemvArgs& a, const cuda::NormFold* fold) const {
    if (fold && fold->mode != cuda::NormFold::kNone) return true;
    if (use_gemv && cuda::gemv_pick(a.T, a.N, a.K) && cuda::gemv_supported(a)) return false;
    return cuda::wgmma_gemm_pick(a.T, a.N, a.K) && cuda::wgmma_gemm_supported(a);
  }
  // y [T, out] (ytype: f32 or bf16) = beta * y + x [T, in] (bf16) W^T, W [out, in] bf16, fp32
  // accumulation; beta is 0 or 1 (1: f32 y only). At the shapes where gemv_pick says it is
  // faster (one or two tokens), the CUDA-core stream of gemv.h; where wgmma_gemm_pick says so (a
  // few dozen tokens on Hopper), the tensor-core stream of wgmma_gemm.h; cuBLAS everywhere else
  // (kernels_dev/gemv.cu and wgmma_gemm.cu measure them; the lab's older skinny GEMM,
  // kernels_dev/skinny_gemm.cu, and cuBLASLt's other algorithms, kernels_dev/cublaslt_algos.cu,
  // are not faster). ldy: y's row stride in elements (0: out). fold: the product's part in a
  // folded norm (fold_norms chose wgmma_gemm for it), or null. version: wgmma_gemm's, where it
  // runs the product (0: the shape's).
  void gemm(const void* x_, int32_t T, int32_t in, const Tensor& w, int32_t out, void* y,
            cudaDataType_t ytype, float beta, const char* what, int32_t ldy = 0,
            const cuda::NormFold* fold = nullptr, int version = 0) {
    cuda::GemvArgs a = cuda::product_args(static_cast<const uint16_t*>(x_), w.data_as<uint16_t>(),
                                          y, T, out, in, ldy > 0 ? ldy : out);
    a.y_bf16 = ytype == CUDA_R_16BF;
    a.accumulate = beta != 0.f;
    if (takes_wgmma(a, fold)) {
      cuda::wgmma_gemm(a, stream, version, fold);
      return;
    }
    if (const int v = use_gemv ? cuda::gemv_pick(T, out, in) : 0) {
      if (cuda::gemv_supported(a)) {
        cuda::gemv(a, stream, v);
        return;
      }
    }
    const float alpha = 1.f;
    // Column-major view: y^T [out, T] = W [out, in] (row-major = col-major W^T, hence OP_T) x^T.
    check_cublas(cublasGemmEx(cublas, CUBLAS_OP_T, CUBLAS_OP_N, out, T, in, &alpha, w.data(),
                              CUDA_R_16BF, in, x_, CUDA_R_16BF, in, &beta, y, ytype, ldy > 0 ? ldy : out,
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
  tp = tp_slices(c, shard);
  if (!file) {
    for (const SyntheticTensor& t : synthetic_tensors(c)) synthetic.emplace(t.name, t);
  }
  {
    const std::vector<double> inv = rope_inv_freq(c.head_dim, c.rope_theta, c.rope_scaling);
    rope_inv_freq_dev = Tensor::empty({int64_t(inv.size()) * 2}, DType::f32, Device::cuda);
    check_cuda(cudaMemcpy(rope_inv_freq_dev.data(), inv.data(), inv.size() * sizeof(double),
                          cudaMemcpyHostToDevice),
               "rope frequencies upload");
  }
  if (const char* g = std::getenv("PAGEDATTN_CUDA_GRAPHS"); g && std::string(g) == "0")
    use_graphs = false;  // a check of the plain launches against the graphs' results
  if (const char* g = std::getenv("PAGEDATTN_PAD_DECODE"); g && std::string(g) == "0")
    pad_decode = false;
  if (const char* g = std::getenv("PAGEDATTN_GEMV"); g && std::string(g) == "0") use_gemv = false;
  if (const char* f = std::getenv("PAGEDATTN_FUSE"); f && std::string(f) == "0") fuse = false;
  if (const char* f = std::getenv("PAGEDATTN_FOLD_NORM"); f && std::string(f) == "0")
    fold_norm = false;
  // PAGEDATTN_SCHEDULE_AHEAD=0: the engine reads each greedy step's ids before it schedules the
  // next one, as on the CPU (a comparison).
  if (const char* a = std::getenv("PAGEDATTN_SCHEDULE_AHEAD"); a && std::string(a) == "0")
    overlap_passes = false;
  if (const char* o = std::getenv("PAGEDATTN_O_BESIDE_ATTENTION"); o && std::string(o) == "0")
    o_beside_attention = false;
  if (const char* q = std::getenv("PAGEDATTN_QKV_BEHIND_REDUCE"); q && std::string(q) == "0")
    qkv_behind_reduce = false;
  if (const char* a = std::getenv("PAGEDATTN_PEER_ARGMAX"); a && std::string(a) == "0")
    peer_argmax = false;
  {
    const char* e = std::getenv("PAGEDATTN_QKV_EPILOGUE");
    qkv_interleaved = !(e && std::string(e) == "0") && fuse && !c.qk_norm &&
                      cuda::wgmma_gemm_available();
    if (const char* v = std::getenv("PAGEDATTN_QKV_VERSION"))
      qkv_version_forced = std::clamp(std::atoi(v), 0, cuda::kWgmmaGemmVersions);
  }
  check_cublas(cublasCreate(&cublas), "cublasCreate");
  check_cuda(cudaStreamCreate(&stream), "cudaStreamCreate");
  check_cublas(cublasSetStream(cublas, stream), "cublasSetStream");
  constexpr int64_t kCublasWorkspace = int64_t(32) << 20;  // bytes
  cublas_workspace = Tensor::empty({kCublasWorkspace / 4}, DType::f32, Device::cuda);
  check_cublas(cublasSetWorkspace(cublas, cublas_workspace.data(), size_t(kCublasWorkspace)),
               "cublasSetWorkspace");
  {
    // Only this step's RoPE kernel, the qkv product's epilogue (wgmma_gemm_qkv) or write_kv
    // writes the step's K/V; every cached position was written by an earlier step, so the
    // decode kernel may copy those before it waits.
    CudaPlanOptions opts;
    opts.decode_early_cached_kv = true;
    plan = std::make_unique<CudaAttentionPlan>(size_t(64) << 20, opts);
  }

  const int64_t hidden = c.hidden_size, inter = c.intermediate_size, D = c.head_dim;
  const int64_t q_dim = int64_t(c.num_q_heads) * D, kv_dim = int64_t(c.num_kv_heads) * D;
  embed = stack_bf16({"model.embed_tokens.weight"}, {c.vocab_size}, hidden);
  // NOTE: a separate lm_head exists exactly when the embeddings are not tied: LlamaModel's check
  // (file) and synthetic_tensors (no file) agree on that.
  const bool has_lm_head =
      file ? file->tensors.count("lm_head.weight") + file->weights.count("lm_head.weight") > 0
           : synthetic.count("lm_head.weight") > 0;
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
    if (qkv_interleaved) {
      Tensor w = Tensor::empty(L.wqkv.shape(), DType::bf16, Device::cuda);
      cuda::interleave_rope_rows(L.wqkv.data_as<uint16_t>(), w.data_as<uint16_t>(),
                                 L.wqkv.shape()[0], hidden, c.head_dim, stream);
      check_cuda(cudaStreamSynchronize(stream), "qkv rows in RoPE pairs");
      L.wqkv = std::move(w);
    }
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
  if (comm && shard.world > 1) {
    // NOTE: collective (every rank loads at the same point). Decode batches up to kPeerRows
    // rows; longer prefill chunks are bandwidth-bound, where NCCL is as good.
    constexpr int32_t kPeerRows = 512;
    std::string why;
    peer = cuda::PeerAllReduce::create(*comm, kPeerRows, c.hidden_size, &why);
    if (!peer && shard.rank == 0)
      std::fprintf(stderr, "pagedattn: tensor parallel: all-reduce through NCCL only (%s)\n",
                   why.c_str());
  }
  if (peer) {
    // NOTE: collective too; PAGEDATTN_PEER_EMBED=0 (on any rank) keeps the gather and its
    // all-reduce (a comparison).
    const char* env = std::getenv("PAGEDATTN_PEER_EMBED");
    const bool willing = !(env && std::string(env) == "0") &&
                         shard.world <= cuda::PeerEmbedTable::kMaxRanks &&
                         cuda::embed_norm_peers_takes(c.hidden_size);
    std::string why;
    const std::vector<const void*> slices =
        peer->map_peer_buffers(*comm, embed.data(), willing, &why);
    if (!slices.empty()) {
      for (int32_t r = 0; r < shard.world; ++r)
        peer_embed.slice[r] = static_cast<const uint16_t*>(slices[size_t(r)]);
      peer_embed.world = shard.world;
      peer_embed.stride = tp.vocab_stride;
      peer_embed.vocab = c.vocab_size;
    }
  }
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

LlamaModelCuda::LlamaModelCuda(const ModelFile& file) : LlamaModelCuda(file, TpShard{}, nullptr) {}

LlamaModelCuda::LlamaModelCuda(const ModelConfig& config, uint64_t seed)
    : LlamaModelCuda(config, seed, TpShard{}, nullptr) {}

LlamaModelCuda::LlamaModelCuda(const ModelFile& file, TpShard shard, cuda::NcclComm* comm)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = checked_config(file);
  impl_->shard = shard;
  impl_->comm = comm;
  impl_->load(&file, 0);
}

LlamaModelCuda::LlamaModelCuda(const ModelConfig& config, uint64_t seed, TpShard shard,
                               cuda::NcclComm* comm)
    : impl_(std::make_unique<Impl>()) {
  impl_->config = config;
  check_llama_config(impl_->config, kOp);
  impl_->shard = shard;
  impl_->comm = comm;
  impl_->load(nullptr, seed);
}

int32_t LlamaModelCuda::num_local_kv_heads() const { return impl_->tp.kv_heads; }

LlamaModelCuda::~LlamaModelCuda() = default;

const ModelConfig& LlamaModelCuda::config() const { return impl_->config; }

size_t LlamaModelCuda::weight_bytes() const { return impl_->weight_bytes; }

size_t LlamaModelCuda::step_weight_bytes() const { return impl_->step_weight_bytes; }

void LlamaModelCuda::set_cuda_graphs(bool enabled) {
  impl_->use_graphs = enabled;
  if (!enabled) {
    impl_->graphs.clear();
    impl_->sampler_graphs.clear();
  }
}

bool LlamaModelCuda::cuda_graphs() const { return impl_->use_graphs; }

void LlamaModelCuda::set_decode_padding(bool enabled) { impl_->pad_decode = enabled; }

double LlamaModelCuda::time_collectives(int32_t tokens, int32_t logit_rows, int32_t reps) {
  Impl& m = *impl_;
  if (!m.comm) return 0;
  PA_CHECK(tokens > 0 && logit_rows >= 0 && reps > 0, kOp,
           ": time_collectives needs positive tokens and reps");
  const ModelConfig& c = m.config;
  const int64_t n = int64_t(tokens) * c.hidden_size, g = int64_t(logit_rows) * m.tp.vocab_stride;
  Tensor buf = Tensor::zeros({n}, DType::f32, Device::cuda);
  Tensor h = Tensor::zeros({n}, DType::bf16, Device::cuda);
  Tensor send = Tensor::zeros({std::max<int64_t>(g, 1)}, DType::f32, Device::cuda);
  Tensor recv =
      Tensor::zeros({std::max<int64_t>(g, 1) * m.shard.world}, DType::f32, Device::cuda);
  cudaEvent_t e0, e1;
  check_cuda(cudaEventCreate(&e0), "cudaEventCreate");
  check_cuda(cudaEventCreate(&e1), "cudaEventCreate");
  std::vector<float> ms;
  for (int32_t rep = -1; rep < reps; ++rep) {  // rep -1: warm-up
    check_cuda(cudaEventRecord(e0, m.stream), "cudaEventRecord");
    for (int32_t i = 0; i < 2 * c.num_layers + 1; ++i) {
      if (m.peer_step(tokens)) {  // the step's fused kernel: sum, residual add, norm
        const int32_t slot = i == 0 ? Impl::kSlotEmbed : i % 2 ? Impl::kSlotO : Impl::kSlotDown;
        m.peer->reduce(slot, buf.data_as<float>(), true, tokens, m.final_norm.data_as<float>(),
                       c.rms_norm_eps, h.data_as<uint16_t>(), m.stream);
      } else {
        m.comm->all_reduce_sum(buf.data_as<float>(), size_t(n), m.stream);
      }
    }
    if (g > 0)
      m.comm->all_gather(send.data_as<float>(), recv.data_as<float>(), size_t(g), m.stream);
    check_cuda(cudaEventRecord(e1, m.stream), "cudaEventRecord");
    check_cuda(cudaEventSynchronize(e1), "collectives");
    float t = 0;
    check_cuda(cudaEventElapsedTime(&t, e0, e1), "cudaEventElapsedTime");
    if (rep >= 0) ms.push_back(t);
  }
  cudaEventDestroy(e0);
  cudaEventDestroy(e1);
  std::sort(ms.begin(), ms.end());
  return double(ms[ms.size() / 2]) * 1e-3;
}

Model::GraphStats LlamaModelCuda::cuda_graph_stats() const {
  return GraphStats{int64_t(impl_->graphs.captures()), int64_t(impl_->graphs.replays()),
                    int64_t(impl_->sampler_graphs.captures()),
                    int64_t(impl_->sampler_graphs.replays())};
}

void LlamaModelCuda::validate(const ForwardBatch& b, const KvCache& cache,
                              int32_t chained_rows) const {
  constexpr const char* op = "LlamaModelCuda::forward";
  const ModelConfig& config = impl_->config;
  const KvCacheConfig& cc = cache.config();
  PA_CHECK(cc.device == Device::cuda, op, ": cache is on ", device_name(cc.device),
           "; the CUDA model needs a CUDA cache");
  PA_CHECK(cc.dtype == DType::bf16 || cc.dtype == DType::fp8_e4m3, op, ": cache dtype is ",
           dtype_name(cc.dtype), "; the CUDA model writes bf16 or fp8_e4m3 K/V");
  const int32_t kv_heads = impl_->tp.kv_heads;  // this rank's (all without tensor parallelism)
  PA_CHECK(cc.num_layers == config.num_layers && cc.num_kv_heads == kv_heads &&
               cc.head_dim == config.head_dim,
           op, ": cache has ", cc.num_layers, " layers x ", cc.num_kv_heads,
           " KV heads x head_dim ", cc.head_dim, ", the model needs ", config.num_layers, " x ",
           kv_heads, " x ", config.head_dim);
  check_forward_batch(b, config.vocab_size, cc.page_size, cc.num_pages, op, chained_rows);
}

// The step's device buffers and counts, made by prepare_step and read by the launches.
struct LlamaModelCuda::Impl::Step {
  int32_t T = 0, R = 0;  // tokens, logit rows
  const int32_t* tokens = nullptr;  // [T]
  const int32_t* slots = nullptr;   // [T]
  const int32_t* rows = nullptr;    // [R]
  const int32_t* positions = nullptr;  // [T]
  const int32_t* chained_ids = nullptr;  // the stand-in tokens' ids (begin_greedy), or null
  const float* cos_table = nullptr;    // [rope_rows, D/2] (by position)
  const float* sin_table = nullptr;    // [rope_rows, D/2]
  float* cos = nullptr;                // [T, D/2] the tokens' rows (the embedding kernel's copy)
  float* sin = nullptr;                // [T, D/2]
  float* x = nullptr;               // [T, hidden] f32
  float* norm_sq = nullptr;         // [T, sums_ld(hidden)] f32 where `fold` (fold_norms)
  bool fold = false;
  // The last layer's peer all-reduce also writes the final norm's h: every token is a logit row,
  // in order (logits_of_rows then has no norm to run).
  bool final_in_reduce = false;
  void* h = nullptr;                // [T, max(hidden, q_dim)] bf16
  float* qkv = nullptr;             // [T, qkv_dim] f32
  void *q = nullptr, *k = nullptr, *v = nullptr, *attn = nullptr;  // bf16
  uint16_t* gu = nullptr;           // [T, 2 * inter] bf16
  void* act = nullptr;              // [T, inter] bf16
  float* logits = nullptr;          // [R, vocab] f32 (null: R == 0)
  float* shard_logits = nullptr;    // [R, vocab_stride] (tensor parallel)
  float* gathered = nullptr;        // [world, R, vocab_stride] (tensor parallel)
  int32_t* ids = nullptr;           // [R] each row's argmax (greedy steps; else null)
  cuda::ArgmaxPair* head_pairs = nullptr;  // [R, blocks] (greedy, wgmma_gemm_argmax: no logits)
  cuda::ArgmaxPair* pairs = nullptr;      // [R] this rank's slice's (greedy, tensor parallel)
  cuda::ArgmaxPair* pairs_all = nullptr;  // [world, R]
};

// The RoPE tables cover positions [0, n) from here on (computed on the device; rows already there
// keep their values). Between steps only: the old table is freed (cudaFree waits for the device).
void LlamaModelCuda::Impl::grow_rope_table(int32_t n) {
  if (n <= rope_rows) return;
  const int32_t half = config.head_dim / 2;
  const int32_t rows = int32_t(std::min<int64_t>(
      std::max<int64_t>({int64_t(n), 2 * int64_t(rope_rows), 4096}), int64_t(INT32_MAX) / half));
  rope_table = Tensor();
  rope_table = Tensor::empty({2 * int64_t(rows) * half}, DType::f32, Device::cuda);
  auto* cos = rope_table.data_as<float>();
  cuda::rope_table(static_cast<const double*>(rope_inv_freq_dev.data()), half, rows, cos,
                   cos + int64_t(rows) * half, stream, rope_attention_factor(config.rope_scaling));
  rope_rows = rows;
}

// Host work of a step: one upload (tokens, slots, logit rows, positions), the RoPE tables grown to
// the step's positions, the scratch buffers, the attention plan (layer 0's view: every layer has
// the same shapes).
LlamaModelCuda::Impl::Step LlamaModelCuda::Impl::prepare_step(const ForwardBatch& batch,
                                                                const KvCache& cache,
                                                                bool greedy, int slot) {
  const ModelConfig& c = config;
  Step s;
  s.T = int32_t(batch.tokens.size());
  s.R = int32_t(batch.logit_rows.size());
  const int32_t T = s.T, R = s.R;
  const int32_t hidden = c.hidden_size, D = c.head_dim, half = D / 2;
  const int32_t q_dim = tp.q_heads * D, qkv_dim = (tp.q_heads + 2 * tp.kv_heads) * D;
  int32_t top = 0;  // one past the step's largest position (validate: positions are >= 0)
  for (int32_t p : batch.positions) top = std::max(top, p + 1);
  grow_rope_table(top);

  const size_t n_meta = size_t(3 * T + R);  // all 4-byte values
  host_meta.resize(n_meta);
  int32_t* hm = host_meta.data();
  std::copy(batch.tokens.begin(), batch.tokens.end(), hm);
  std::copy(batch.slots.begin(), batch.slots.end(), hm + T);
  std::copy(batch.logit_rows.begin(), batch.logit_rows.end(), hm + 2 * T);
  std::copy(batch.positions.begin(), batch.positions.end(), hm + 2 * T + R);
  auto* dm = static_cast<int32_t*>(ensure(meta, int64_t(n_meta), DType::f32));
  // NOTE: the step's device time starts with its first enqueued work, after the host's part.
  if (slot < 0) {
    begin_step_timing();
  } else {
    record_slot_event(pass_slots[slot], true);
    // The open pass's picks (run_pass moved greedy ids that `ids` would have outgrown).
    if (!open_slots.empty() && pass_slots[open_slots.back()].rows > 0)
      s.chained_ids = pass_slots[open_slots.back()].picks;
  }
  check_cuda(cudaMemcpyAsync(dm, hm, n_meta * 4, cudaMemcpyHostToDevice, stream), "batch upload");
  s.tokens = dm;
  s.slots = dm + T;
  s.rows = dm + 2 * T;
  s.positions = dm + 2 * T + R;
  s.cos_table = rope_table.data_as<float>();
  s.sin_table = s.cos_table + int64_t(rope_rows) * half;
  s.cos = static_cast<float*>(ensure(rope_step, 2 * int64_t(T) * half, DType::f32));
  s.sin = s.cos + int64_t(T) * half;

  s.x = static_cast<float*>(ensure(x, int64_t(T) * hidden, DType::f32));
  s.fold = fold_norms(T);
  if (peer_step(T) && R <= T) {
    s.final_in_reduce = true;
    for (int32_t j = 0; j < R; ++j) s.final_in_reduce &= batch.logit_rows[size_t(j)] == j;
  }
  if (s.fold)
    s.norm_sq = static_cast<float*>(ensure(norm_sq, int64_t(T) * sums_ld(hidden), DType::f32));
  s.h = ensure(h, int64_t(T) * std::max(hidden, q_dim), DType::bf16);
  s.qkv = static_cast<float*>(ensure(qkv, int64_t(T) * qkv_dim, DType::f32));
  s.q = ensure(q, int64_t(T) * q_dim, DType::bf16);
  s.k = ensure(k, int64_t(T) * tp.kv_heads * D, DType::bf16);
  s.v = ensure(v, int64_t(T) * tp.kv_heads * D, DType::bf16);
  s.attn = ensure(attn, int64_t(T) * q_dim, DType::bf16);
  s.gu = static_cast<uint16_t*>(ensure(gu, int64_t(T) * 2 * tp.inter, DType::bf16));
  s.act = ensure(act, int64_t(T) * tp.inter, DType::bf16);
  if (R > 0) s.logits = static_cast<float*>(ensure(logits, int64_t(R) * c.vocab_size, DType::f32));
  // With a communicator each rank computes the logits of its vocabulary rows, which are gathered
  // (or, in a greedy step, only each row's argmax over them).
  if (comm && R > 0) {
    const int64_t Vs = tp.vocab_stride;
    s.shard_logits = static_cast<float*>(ensure(shard_logits, int64_t(R) * Vs, DType::f32));
    if (greedy) {
      s.pairs = static_cast<cuda::ArgmaxPair*>(ensure(argmax_pairs, int64_t(R) * 2, DType::f32));
      s.pairs_all = static_cast<cuda::ArgmaxPair*>(
          ensure(argmax_pairs_all, int64_t(shard.world) * R * 2, DType::f32));
    } else {
      s.gathered =
          static_cast<float*>(ensure(gathered, int64_t(shard.world) * R * Vs, DType::f32));
    }
  }
  if (greedy && R > 0) s.ids = static_cast<int32_t*>(ensure(ids, R, DType::f32));
  // (A tensor-parallel rank's: its slice's pair of each row from the product's blocks.)
  if (greedy && R > 0 && head_argmax(R)) {
    const int64_t blocks = cuda::wgmma_gemm_argmax_blocks(comm ? tp.vocab : c.vocab_size);
    s.head_pairs =
        static_cast<cuda::ArgmaxPair*>(ensure(head_pairs, blocks * R * 2, DType::f32));
  }

  AttentionOptions opt;
  opt.window = c.sliding_window;
  QKVTensor out_t{s.attn, DType::bf16, T, tp.q_heads, D};
  plan->plan(QKVTensor{s.q, DType::bf16, T, tp.q_heads, D}, cache.layer_view(0),
             attention_layout(batch), opt, out_t, stream);
  return s;
}

// x = the tokens' embedding rows (summed over the ranks' vocabulary shards); the tokens' RoPE rows.
bool LlamaModelCuda::Impl::embed_tokens(const Step& s, cudaStream_t st) {
  const int32_t hidden = config.hidden_size;
  cuda::RopeRowsGather rope;
  rope.cos_table = s.cos_table;
  rope.sin_table = s.sin_table;
  rope.positions = s.positions;
  rope.half = config.head_dim / 2;
  rope.cos = s.cos;
  rope.sin = s.sin;
  if (peer_step(s.T) && peer_embed.world > 0) {  // every row from its rank; h as below
    cuda::embed_norm_peers(peer_embed, s.tokens, s.chained_ids, s.T, hidden,
                           layers[0].attn_norm.data_as<float>(), config.rms_norm_eps, s.x,
                           static_cast<uint16_t*>(s.h), rope, st);
    return true;
  }
  if (peer_step(s.T)) {  // and h = the first layer's normalised input
    cuda::embed_gather_shard(embed.data_as<uint16_t>(), tp.vocab0, tp.vocab, s.tokens,
                             s.chained_ids, s.T, hidden, peer->input(kSlotEmbed), rope, st);
    peer->reduce(kSlotEmbed, s.x, false, s.T, layers[0].attn_norm.data_as<float>(),
                 config.rms_norm_eps, static_cast<uint16_t*>(s.h), st);
    return true;
  }
  if (comm) {
    cuda::embed_gather_shard(embed.data_as<uint16_t>(), tp.vocab0, tp.vocab, s.tokens,
                             s.chained_ids, s.T, hidden, s.x, rope, st);
    all_reduce(s.x, int64_t(s.T) * hidden, st);
  } else {
    cuda::embed_gather(embed.data_as<uint16_t>(), s.tokens, s.chained_ids, s.T, hidden, s.x, rope,
                       st);
  }
  return false;
}

// One layer: norm, qkv, RoPE and the K/V store, attention, o (+= x), norm, gate/up, SwiGLU,
// down (+= x); with the peer all-reduce each sum also writes the next norm (`normed`: this
// layer's first norm is done).
bool LlamaModelCuda::Impl::run_layer(int32_t i, const Step& s, const PagedKVView& view,
                                     bool normed, cudaStream_t st) {
  const ModelConfig& c = config;
  const Layer& L = layers[size_t(i)];
  const int32_t T = s.T, hidden = c.hidden_size, D = c.head_dim, inter = tp.inter;
  const int32_t q_dim = tp.q_heads * D, qkv_dim = (tp.q_heads + 2 * tp.kv_heads) * D;
  // NOTE: rank 0 adds the row-parallel products to the residual stream; the other ranks write
  // their partial products over it, and the all-reduce sums them all (x + p0 + p1 + ...).
  const float residual_beta = shard.rank == 0 ? 1.f : 0.f;
  auto* hb = static_cast<uint16_t*>(s.h);
  auto opt_f32 = [](const Tensor& t) { return t.data_as<float>(); };  // null when absent
  cuda::QkvParams qp;
  qp.num_tokens = T;
  qp.num_q_heads = tp.q_heads;
  qp.num_kv_heads = tp.kv_heads;
  qp.head_dim = D;
  qp.eps = c.rms_norm_eps;
  const bool fused = peer_step(T);  // all-reduce + residual add + next norm in one kernel
  // A folded norm (fold_norms): o and down write h = bf16(x * g) of the next norm and x's sums of
  // squares, qkv (from the second layer on) and gate/up scale their outputs by its r.
  const bool last = i + 1 == c.num_layers;
  cuda::NormFold consume, produce_mlp, produce_next;
  if (s.fold) {
    consume.mode = cuda::NormFold::kConsume;
    consume.sq = s.norm_sq;
    consume.sq_ld = sums_ld(hidden);
    consume.eps = c.rms_norm_eps;
    produce_mlp.mode = cuda::NormFold::kProduce;
    produce_mlp.weight = L.mlp_norm.data_as<float>();
    produce_mlp.out = hb;
    produce_mlp.sq = s.norm_sq;
    produce_mlp.sq_ld = consume.sq_ld;
    if (!last) {
      produce_next = produce_mlp;
      produce_next.weight = layers[size_t(i) + 1].attn_norm.data_as<float>();
    }
  }
  const bool qkv_folded = s.fold && i > 0;  // the first layer's norm follows the embedding
  // Attention block.
  if (!normed && !qkv_folded) {
    cuda::rms_norm_bf16(s.x, L.attn_norm.data_as<float>(), nullptr, T, hidden, c.rms_norm_eps, hb,
                        st);
  }
  // bf16 and fp8 pools take k and v straight from the RoPE kernel; other dtypes through write_kv.
  const bool fp8 = view.dtype == DType::fp8_e4m3 && view.k_scale && view.v_scale;
  const bool kv_direct = fuse && (view.dtype == DType::bf16 || fp8) &&
                         view.num_kv_heads == tp.kv_heads && view.head_dim == D;
  if (kv_direct) {
    qp.k_pool = view.k_pages;
    qp.v_pool = view.v_pages;
    qp.fp8 = fp8;
    qp.k_scale = view.k_scale;
    qp.v_scale = view.v_scale;
    qp.slots = s.slots;
    qp.page_size = view.page_size;
    qp.num_pages = view.num_pages;
  }
  qp.interleaved = qkv_interleaved;
  const cuda::NormFold* qkv_fold = qkv_folded ? &consume : nullptr;
  const cuda::GemvArgs qa =
      cuda::product_args(hb, L.wqkv.data_as<uint16_t>(), s.qkv, T, qkv_dim, hidden, qkv_dim);
  const bool qkv_epilogue = qkv_interleaved && kv_direct && takes_wgmma(qa, qkv_fold);
  const bool qkv_large = int64_t(qkv_dim) * hidden > cuda::kWgmmaGemmSmallElements;
  const int qkv_version = qkv_version_forced              ? qkv_version_forced
                          : fused && qkv_behind_reduce ? cuda::kWgmmaGemmBehindReduceVersion
                          : qkv_epilogue && qkv_large  ? cuda::kWgmmaGemmQkvVersion
                                                       : 0;
  if (qkv_epilogue &&
      cuda::wgmma_gemm_qkv_version_ok(
          qkv_version ? qkv_version : cuda::wgmma_gemm_version_for(T, qkv_dim, hidden))) {
    // The product ends in qkv_post's work: q to s.q, k and v into their slots.
    cuda::QkvEpilogue e;
    e.p = qp;
    e.bias = opt_f32(L.bqkv);
    e.cos = s.cos;
    e.sin = s.sin;
    e.q = static_cast<uint16_t*>(s.q);
    cuda::wgmma_gemm_qkv(qa, e, st, qkv_version, qkv_fold);
  } else {
    gemm(s.h, T, hidden, L.wqkv, qkv_dim, s.qkv, CUDA_R_32F, 0.f, "qkv projection", 0, qkv_fold,
         qkv_version);
    cuda::qkv_post(s.qkv, opt_f32(L.bqkv), opt_f32(L.q_norm), opt_f32(L.k_norm), s.cos, s.sin,
                   qp, static_cast<uint16_t*>(s.q), static_cast<uint16_t*>(s.k),
                   static_cast<uint16_t*>(s.v), st);
  }
  if (!kv_direct) write_kv_cuda(view, s.slots, T, s.k, s.v, DType::bf16, st);
  QKVTensor out_t{s.attn, DType::bf16, T, tp.q_heads, D};
  paged_attention_cuda(*plan, QKVTensor{s.q, DType::bf16, T, tp.q_heads, D}, view, out_t, st);
  const int o_version =
      shard.world > 1 && o_beside_attention ? cuda::kWgmmaGemmBesideAttentionVersion : 0;
  if (fused) {
    gemm(s.attn, T, q_dim, L.wo, hidden, peer->input(kSlotO), CUDA_R_32F, 0.f, "o projection",
         0, nullptr, o_version);
    peer->reduce(kSlotO, s.x, true, T, L.mlp_norm.data_as<float>(), c.rms_norm_eps, hb, st);
  } else {
    gemm(s.attn, T, q_dim, L.wo, hidden, s.x, CUDA_R_32F, residual_beta, "o projection", 0,
         s.fold ? &produce_mlp : nullptr, o_version);
    all_reduce(s.x, int64_t(T) * hidden, st);
    // MLP block.
    if (!s.fold) {
      cuda::rms_norm_bf16(s.x, L.mlp_norm.data_as<float>(), nullptr, T, hidden, c.rms_norm_eps,
                          hb, st);
    }
  }
  // gate/up and SwiGLU in one launch where gemv takes the product
  cuda::GemvArgs glu = cuda::product_args(static_cast<const uint16_t*>(s.h),
                                          L.wgu.data_as<uint16_t>(), s.act, T, inter, hidden,
                                          inter);
  glu.y_bf16 = true;
  if (s.fold) {
    cuda::wgmma_gemm_swiglu(glu, st, 0, &consume);
  } else if (fuse && use_gemv && cuda::gemv_swiglu_takes(T, inter, hidden) &&
             cuda::gemv_supported(glu)) {
    cuda::gemv_swiglu(glu, st);
  } else if (fuse && !(use_gemv && cuda::gemv_pick(T, 2 * inter, hidden)) &&
             cuda::wgmma_gemm_swiglu_takes(T, inter, hidden) && cuda::wgmma_gemm_supported(glu)) {
    // (Where gemv takes the gate/up product without SwiGLU, it and the separate SwiGLU are
    // faster: Llama-3-8B's 28672 rows at one token.)
    cuda::wgmma_gemm_swiglu(glu, st);
  } else {
    gemm(s.h, T, hidden, L.wgu, 2 * inter, s.gu, CUDA_R_16BF, 0.f, "gate/up projection");
    cuda::swiglu(s.gu, T, inter, static_cast<uint16_t*>(s.act), st);
  }
  if (fused) {
    gemm(s.act, T, inter, L.wd, hidden, peer->input(kSlotDown), CUDA_R_32F, 0.f,
         "down projection");
    const float* next_norm = last ? (s.final_in_reduce ? final_norm.data_as<float>() : nullptr)
                                  : layers[size_t(i) + 1].attn_norm.data_as<float>();
    peer->reduce(kSlotDown, s.x, true, T, next_norm, c.rms_norm_eps, hb, st);
    return !last;
  }
  gemm(s.act, T, inter, L.wd, hidden, s.x, CUDA_R_32F, residual_beta, "down projection", 0,
       s.fold && !last ? &produce_next : nullptr);
  all_reduce(s.x, int64_t(T) * hidden, st);
  return false;
}

// logits [R, vocab] = rms_norm(x[rows]) lm_head^T (each rank its vocabulary rows, gathered).
void LlamaModelCuda::Impl::logits_of_rows(const Step& s, cudaStream_t st) {
  const ModelConfig& c = config;
  const int32_t R = s.R, hidden = c.hidden_size;
  if (R == 0) return;
  if (!s.final_in_reduce) {  // (else the last all-reduce wrote it: rows 0 .. R - 1 are the tokens)
    cuda::rms_norm_bf16(s.x, final_norm.data_as<float>(), s.rows, R, hidden, c.rms_norm_eps,
                        static_cast<uint16_t*>(s.h), st);
  }
  const Tensor& head = lm_head.data() ? lm_head : embed;
  if (!comm) {
    if (s.head_pairs) {  // a greedy step: only the ids, s.logits stays unwritten
      const cuda::GemvArgs a =
          cuda::product_args(static_cast<const uint16_t*>(s.h), head.data_as<uint16_t>(),
                             s.logits, R, c.vocab_size, hidden, c.vocab_size);
      cuda::wgmma_gemm_argmax(a, s.head_pairs, s.ids, st);
      return;
    }
    gemm(s.h, R, hidden, head, c.vocab_size, s.logits, CUDA_R_32F, 0.f, "lm_head");
    if (s.ids) cuda::argmax_rows(s.logits, R, c.vocab_size, s.ids, st);
    return;
  }
  // shard [R, Vs] (the last rank's columns past its rows are never read), gathered
  // [world, R, Vs], then each rank's columns into their place in logits [R, vocab].
  const int32_t Vs = tp.vocab_stride;
  if (s.ids) {
    // A greedy step: every rank's (largest value, its id) per row, 8 bytes a row, instead of
    // R x vocab logits (16 MB at batch 32 with a 128K vocabulary); the same ids as the argmax of
    // the gathered rows. s.logits stays unwritten; with head_pairs the slice's logits are not
    // written either (the pairs come from the product's epilogue).
    // (The step's layers met the peers since the last step's pairs were read: argmax_ids' rule.)
    const bool peer_ids = peer_argmax && peer_step(s.T) && R <= peer->max_rows();
    cuda::ArgmaxPair* mine = peer_ids ? peer->pairs() : s.pairs;
    if (s.head_pairs) {
      const cuda::GemvArgs a =
          cuda::product_args(static_cast<const uint16_t*>(s.h), head.data_as<uint16_t>(),
                             s.shard_logits, R, tp.vocab, hidden, Vs);
      cuda::wgmma_gemm_argmax_slice(a, tp.vocab0, s.head_pairs, mine, st);
    } else {
      gemm(s.h, R, hidden, head, tp.vocab, s.shard_logits, CUDA_R_32F, 0.f, "lm_head", Vs);
      cuda::argmax_rows_slice(s.shard_logits, R, tp.vocab, Vs, tp.vocab0, mine, st);
    }
    if (peer_ids) {
      peer->argmax_ids(R, s.ids, st);
      return;
    }
    comm->all_gather(reinterpret_cast<const float*>(s.pairs),
                     reinterpret_cast<float*>(s.pairs_all), size_t(R) * 2, st);
    cuda::argmax_combine(s.pairs_all, shard.world, R, s.ids, st);
    return;
  }
  gemm(s.h, R, hidden, head, tp.vocab, s.shard_logits, CUDA_R_32F, 0.f, "lm_head", Vs);
  comm->all_gather(s.shard_logits, s.gathered, size_t(R) * size_t(Vs), st);
  // Only rank 0 reads the logits (the engine runs there): the others take part in the gather.
  for (int32_t r = 0; r < shard.world && shard.rank == 0; ++r) {
    const int64_t v0 = int64_t(r) * Vs;
    const int64_t width = std::min<int64_t>(Vs, c.vocab_size - v0);
    if (width <= 0) continue;
    check_cuda(cudaMemcpy2DAsync(s.logits + v0, size_t(c.vocab_size) * 4,
                                 s.gathered + int64_t(r) * R * Vs, size_t(Vs) * 4,
                                 size_t(width) * 4, size_t(R), cudaMemcpyDeviceToDevice, st),
               "logits gather");
  }
}

// The same skeleton as the CPU runner (llama_model.cpp): prepare the step, embed, every layer,
// the logit rows.
const float* LlamaModelCuda::forward_device(const ForwardBatch& batch, KvCache& cache,
                                           bool greedy) {
  PA_CHECK(impl_->open_slots.empty(), "LlamaModelCuda::forward: a pass begun by begin_greedy or ",
           "begin_sample is not finished");
  return run_pass(batch, cache, greedy, -1);
}

const float* LlamaModelCuda::run_pass(const ForwardBatch& batch, KvCache& cache, bool greedy,
                                      int slot) {
  impl_->greedy_step = false;
  Impl& m = *impl_;
  // The open pass before this one, whose picks its stand-ins may name (a sampled one only once
  // pick_sampled has given its plan).
  Impl::PassSlot* before = slot >= 0 && !m.open_slots.empty() ? &m.pass_slots[m.open_slots.back()]
                                                              : nullptr;
  const int32_t chained = before && before->picks ? before->rows : 0;
  validate(batch, cache, chained);
  // A decode step runs padded to one of a few row counts (decode_padding.h), so that its launches,
  // and the CUDA graph of them, repeat while the batch changes. What the caller sees (logits, ids)
  // is the first R rows.
  ForwardBatch padded;
  const ForwardBatch* run = &batch;
  if (m.pad_decode && is_decode_batch(batch)) {
    const int32_t rows = padded_decode_rows(int32_t(batch.seqs.size()));
    if (rows > int32_t(batch.seqs.size())) {
      padded = pad_decode_batch(batch, rows);
      run = &padded;
    }
  }
  // NOTE: a greedy pass begun after an open greedy one reads that pass's ids from `ids` and writes
  // its own there; when it has more logit rows (an admission) the open pass's ids move to a larger
  // buffer first, on the stream after that pass (the old buffer's cudaFree waits for the device).
  const int64_t R = int64_t(batch.logit_rows.size());
  const int64_t run_rows = int64_t(run->logit_rows.size());
  if (greedy && chained > 0 && before->picks == m.ids.data() && run_rows > m.ids.numel()) {
    Tensor grown = Tensor::empty({2 * run_rows}, DType::f32, Device::cuda);
    check_cuda(cudaMemcpyAsync(grown.data(), m.ids.data(), size_t(chained) * 4,
                               cudaMemcpyDeviceToDevice, m.stream),
               "LlamaModelCuda::begin_greedy: ids");
    m.ids = std::move(grown);
    before->picks = m.ids.data_as<int32_t>();
  }
  if (slot >= 0) {
    Impl::PassSlot& g = m.pass_slots[slot];
    g.rows = int32_t(R);
    g.sampled = !greedy;
    g.picked = false;
    g.picks = nullptr;
    g.logits = nullptr;
  }
  const ModelConfig& c = m.config;
  if (batch.tokens.empty()) {  // no logit rows either (validate: rows index tokens)
    if (slot >= 0) {
      m.record_slot_event(m.pass_slots[slot], true);
      m.record_slot_event(m.pass_slots[slot], false);
    }
    return nullptr;
  }
  const Impl::Step s = m.prepare_step(*run, cache, greedy, slot);

  // Everything below only enqueues kernels on m.stream, reading the step's buffers: a CUDA graph
  // of it replays correctly for any later step with the same launches (step_graphs.h).
  cudaStream_t st = m.stream;
  auto launch = [&] {
    bool normed = m.embed_tokens(s, st);
    for (int32_t i = 0; i < c.num_layers; ++i)
      normed = m.run_layer(i, s, cache.layer_view(i), normed, st);
    m.logits_of_rows(s, st);
  };

  // Decode steps (one new token per sequence) go through the graph cache, keyed by everything the
  // launches take by value: counts, scratch and pool pointers, the attention plan's launches.
  const bool decode_step = s.T == int32_t(run->seqs.size());
  if (m.use_graphs && decode_step) {
    std::string sig;
    auto put = [&sig](const auto& v) { sig.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    for (int64_t v : {int64_t(s.T), int64_t(s.R), int64_t(s.final_in_reduce)}) put(v);
    const void* scratch[] = {s.tokens, s.chained_ids, s.cos_table, s.sin_table, s.cos, s.x,
                             s.norm_sq, s.h,
                             s.qkv, s.q, s.k, s.v, s.attn, s.gu, s.act, s.logits,
                             s.shard_logits, s.gathered, s.ids, s.head_pairs, s.pairs,
                             s.pairs_all};
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
  if (slot >= 0) {
    Impl::PassSlot& g = m.pass_slots[slot];
    if (!greedy) {  // pick_sampled enqueues the sampler and the download, and records the end
      g.logits = s.logits;
      // NOTE: a tensor-parallel worker never picks: its pass ends with its part of the gather.
      if (m.shard.rank != 0) m.record_slot_event(g, false);
      return s.logits;
    }
    // finish_greedy waits for the end event and reads the ids.
    if (R > 0) {
      check_cuda(cudaMemcpyAsync(g.host.get(size_t(R) * 4), s.ids, size_t(R) * 4,
                                 cudaMemcpyDeviceToHost, st),
                 "token ids download");
    }
    g.picks = s.ids;
    m.record_slot_event(g, false);
    return s.logits;
  }
  m.greedy_step = s.ids != nullptr;
  m.ids_only = m.greedy_step && (m.comm || s.head_pairs);
  if (m.greedy_step) {  // the ids' download follows the step at once (download_greedy waits)
    check_cuda(cudaMemcpyAsync(m.host_ids.get(size_t(R) * 4), s.ids, size_t(R) * 4,
                               cudaMemcpyDeviceToHost, st),
               "token ids download");
  }
  if (s.R > 0) return s.logits;  // the caller's download (or argmax) follows on the same stream
  // NOTE: a tensor-parallel rank's caller waits itself, watching the group while it does (such a
  // step is not timed).
  if (!m.comm) {
    check_cuda(cudaStreamSynchronize(st), "forward");
    m.end_step_timing();
  }
  return nullptr;
}

bool LlamaModelCuda::idle() const {
  const cudaError_t e = cudaStreamQuery(impl_->stream);
  if (e == cudaErrorNotReady) return false;
  check_cuda(e, "forward");
  return true;
}

Tensor LlamaModelCuda::download_logits(const float* dl, int64_t R) {
  const int64_t V = impl_->config.vocab_size;
  impl_->check_logits_assembled("LlamaModelCuda::forward");
  if (!dl) return Tensor::empty({R, V}, DType::f32);
  Tensor logits = impl_->host_logits(R, V);
  check_cuda(cudaMemcpy(logits.data(), dl, logits.nbytes(), cudaMemcpyDeviceToHost),
             "logits download");
  impl_->end_step_timing();
  return logits;
}

std::vector<int32_t> LlamaModelCuda::download_greedy(const float* dl, int32_t R) {
  std::vector<int32_t> ids(static_cast<size_t>(R));
  if (!dl) return ids;
  // NOTE: R ids instead of R x vocab logits: at batch 32 with a 128K vocabulary the logits are
  // 16 MB a step, and the host argmax over them is further time on the critical path.
  // NOTE: into page-locked memory, enqueued with a greedy step (forward_device), and one wait
  // (the step's end event, after the copy): a synchronous copy into pageable memory cost tens of
  // microseconds a step on its own, even with the step already done (a tensor-parallel rank
  // polls its stream before it downloads).
  auto* h = reinterpret_cast<int32_t*>(impl_->host_ids.get(size_t(R) * 4));
  if (!impl_->greedy_step) {
    auto* d_ids = static_cast<int32_t*>(ensure(impl_->ids, R, DType::f32));
    cuda::argmax_rows(dl, R, impl_->config.vocab_size, d_ids, impl_->stream);
    check_cuda(cudaMemcpyAsync(h, d_ids, size_t(R) * 4, cudaMemcpyDeviceToHost, impl_->stream),
               "token ids download");
  }
  impl_->greedy_step = false;
  if (impl_->step_open) {
    impl_->end_step_timing();
  } else {
    check_cuda(cudaStreamSynchronize(impl_->stream), "token ids download");
  }
  std::copy(h, h + R, ids.begin());
  return ids;
}

void LlamaModelCuda::Impl::record_slot_event(PassSlot& g, bool begin_event) {
  if (!g.begin) {
    check_cuda(cudaEventCreate(&g.begin), "cudaEventCreate");
    check_cuda(cudaEventCreate(&g.end), "cudaEventCreate");
  }
  check_cuda(cudaEventRecord(begin_event ? g.begin : g.end, stream), "cudaEventRecord");
}

void LlamaModelCuda::Impl::begin_step_timing() {
  if (!step_begin) {
    check_cuda(cudaEventCreate(&step_begin), "cudaEventCreate");
    check_cuda(cudaEventCreate(&step_end), "cudaEventCreate");
  }
  check_cuda(cudaEventRecord(step_begin, stream), "cudaEventRecord");
  step_open = true;
}

void LlamaModelCuda::Impl::end_step_timing() {
  if (!step_open) return;
  step_open = false;
  check_cuda(cudaEventRecord(step_end, stream), "cudaEventRecord");
  check_cuda(cudaEventSynchronize(step_end), "cudaEventSynchronize");
  float ms = 0;
  check_cuda(cudaEventElapsedTime(&ms, step_begin, step_end), "cudaEventElapsedTime");
  busy_seconds += double(ms) * 1e-3;
}

double LlamaModelCuda::device_busy_seconds() const { return impl_->busy_seconds; }

void LlamaModelCuda::Impl::stage_plan(const SamplePlan& plan) {
  static_assert(sizeof(cuda::SampleEdit) == sizeof(LogitEdit));
  if (!upload_stream) {
    check_cuda(cudaStreamCreateWithFlags(&upload_stream, cudaStreamNonBlocking),
               "cudaStreamCreate");
    check_cuda(cudaEventCreateWithFlags(&plan_ready, cudaEventDisableTiming), "cudaEventCreate");
  } else {
    // A step that failed or had no logit rows may have left its upload in flight.
    check_cuda(cudaEventSynchronize(plan_ready), "sample plan upload");
  }
  const size_t R = plan.rows.size(), E = plan.edits.size();
  const size_t desc_bytes = R * sizeof(cuda::SampleRowDesc);
  const size_t bytes = desc_bytes + E * sizeof(cuda::SampleEdit);
  // NOTE: the previous step's sampler has finished (its results were downloaded) and its upload
  // too, so both the page-locked buffer and the device one are free to overwrite.
  uint8_t* h = host_sample_in.get(bytes);
  auto* desc = reinterpret_cast<cuda::SampleRowDesc*>(h);
  for (size_t i = 0; i < R; ++i) {
    const RowSampling& r = plan.rows[i];
    desc[i] = cuda::SampleRowDesc{r.temperature,        r.top_p,          r.min_p,
                                  r.repetition_penalty, r.presence_penalty, r.frequency_penalty,
                                  r.top_k,              r.logprobs,       r.edit_begin,
                                  r.edit_end,           r.seed,           r.counter};
  }
  if (E > 0) std::memcpy(h + desc_bytes, plan.edits.data(), E * sizeof(LogitEdit));
  void* din = ensure_growing(sample_in, int64_t((bytes + 3) / 4), DType::f32);
  check_cuda(cudaMemcpyAsync(din, h, bytes, cudaMemcpyHostToDevice, upload_stream),
             "sample plan upload");
  check_cuda(cudaEventRecord(plan_ready, upload_stream), "sample plan upload");
}

const int32_t* LlamaModelCuda::Impl::enqueue_sampler(const float* dl, const SamplePlan& plan,
                                                      PinnedBytes& host) {
  const int32_t R = int32_t(plan.rows.size()), V = config.vocab_size;
  check_cuda(cudaStreamWaitEvent(stream, plan_ready, 0), "sample plan upload");
  if (!dl) return nullptr;
  const int32_t N = std::max(plan.max_logprobs(), 0);
  const size_t E = plan.edits.size();
  const auto* din = static_cast<const uint8_t*>(sample_in.data());
  const size_t desc_bytes = size_t(R) * sizeof(cuda::SampleRowDesc);
  const int64_t n_out = int64_t(R) * (2 + 2 * int64_t(N));
  auto* dout = static_cast<int32_t*>(ensure_growing(sample_out, n_out, DType::f32));
  auto* saved = static_cast<float*>(ensure_growing(sample_saved, int64_t(E), DType::f32));
  int32_t* d_ids = dout;
  float* d_lp = reinterpret_cast<float*>(dout + R);
  int32_t* d_top = dout + 2 * R;
  float* d_top_lp = reinterpret_cast<float*>(dout + 2 * R + int64_t(R) * N);
  uint8_t* h_out = host.get(size_t(n_out) * 4);
  // NOTE: the logits are the step's scratch: the sampler may edit them in place for the draw,
  // and puts them back.
  auto launch = [&] {
    cuda::sample_rows(const_cast<float*>(dl), R, V,
                      reinterpret_cast<const cuda::SampleRowDesc*>(din),
                      reinterpret_cast<const cuda::SampleEdit*>(din + desc_bytes), saved, d_ids,
                      d_lp, d_top, d_top_lp, N, stream);
    check_cuda(cudaMemcpyAsync(h_out, dout, size_t(n_out) * 4, cudaMemcpyDeviceToHost, stream),
               "sampled tokens download");
  };
  // The sampler and its download as a graph of their own, keyed by what they take by value (the
  // plan's rows and edits are read on the device, uploaded before): steady sampled steps replay
  // it. (The plan is built while the pass runs, so it cannot join the pass's graph.)
  if (use_graphs) {
    std::string sig;
    auto put = [&sig](const auto& v) { sig.append(reinterpret_cast<const char*>(&v), sizeof(v)); };
    for (int64_t v : {int64_t(R), int64_t(V), int64_t(N)}) put(v);
    const void* ptrs[] = {dl, din, saved, dout, h_out};
    for (const void* ptr : ptrs) put(ptr);
    sampler_graphs.run(sig, stream, launch);
  } else {
    launch();
  }
  return d_ids;
}

std::vector<TokenLogprobs> LlamaModelCuda::Impl::sampled_tokens(
    const int32_t* h, int32_t R, int32_t N, const std::vector<int32_t>& logprobs) const {
  const int32_t V = config.vocab_size;
  std::vector<TokenLogprobs> out(static_cast<size_t>(R));
  for (int32_t i = 0; i < R; ++i) {
    TokenLogprobs& t = out[size_t(i)];
    t.token = h[i];
    PA_CHECK(t.token >= 0 && t.token < V, "LlamaModelCuda::forward_sample: row ", i,
             " sampled token ", t.token, " outside the vocabulary");
    if (logprobs[size_t(i)] < 0) continue;
    float chosen;
    std::memcpy(&chosen, h + R + i, 4);
    t.logprob = chosen;
    const int32_t n = std::min(logprobs[size_t(i)], V);
    t.top.reserve(size_t(n));
    for (int32_t j = 0; j < n; ++j) {
      float lp;
      std::memcpy(&lp, h + 2 * R + int64_t(R) * N + int64_t(i) * N + j, 4);
      t.top.emplace_back(h[2 * R + int64_t(i) * N + j], lp);
    }
  }
  return out;
}

std::vector<TokenLogprobs> LlamaModelCuda::Impl::run_sampler(const float* dl,
                                                            const SamplePlan& plan) {
  const int32_t R = int32_t(plan.rows.size());
  if (!enqueue_sampler(dl, plan, host_sample_out)) return std::vector<TokenLogprobs>(size_t(R));
  check_cuda(cudaStreamSynchronize(stream), "sampled tokens download");
  end_step_timing();
  std::vector<int32_t> logprobs;
  for (const RowSampling& r : plan.rows) logprobs.push_back(r.logprobs);
  return sampled_tokens(reinterpret_cast<const int32_t*>(host_sample_out.p), R,
                        std::max(plan.max_logprobs(), 0), logprobs);
}

std::vector<TokenLogprobs> LlamaModelCuda::download_sampled(const float* dl,
                                                           const SamplePlan& plan) {
  check_sample_plan(plan, int64_t(plan.rows.size()), impl_->config.vocab_size,
                    "LlamaModelCuda::forward_sample");
  impl_->check_logits_assembled("LlamaModelCuda::forward_sample");
  impl_->stage_plan(plan);
  return impl_->run_sampler(dl, plan);
}

std::vector<TokenLogprobs> LlamaModelCuda::forward_sample(const ForwardBatch& batch,
                                                          KvCache& cache, const SamplePlan& plan) {
  check_sample_plan(plan, int64_t(batch.logit_rows.size()), impl_->config.vocab_size,
                    "LlamaModelCuda::forward_sample");
  // NOTE: the forward pass is enqueued first, so that the plan's staging (a copy of every row's
  // edits into page-locked memory: tens of microseconds at 32 rows with repetition penalties) and
  // its upload on its own stream run while the GPU computes, not before.
  const float* dl = forward_device(batch, cache);
  impl_->stage_plan(plan);
  return impl_->run_sampler(dl, plan);
}

Tensor LlamaModelCuda::forward(const ForwardBatch& batch, KvCache& cache) {
  return download_logits(forward_device(batch, cache), int64_t(batch.logit_rows.size()));
}

std::vector<int32_t> LlamaModelCuda::forward_greedy(const ForwardBatch& batch, KvCache& cache) {
  return download_greedy(forward_device(batch, cache, true), int32_t(batch.logit_rows.size()));
}

// A pass into the next free slot (begin_greedy, begin_sample).
void LlamaModelCuda::begin_pass(const ForwardBatch& batch, KvCache& cache, bool greedy) {
  Impl& m = *impl_;
  PA_CHECK(m.open_slots.size() < 2, "LlamaModelCuda::begin_", greedy ? "greedy" : "sample",
           ": two passes are open already");
  const int slot = m.open_slots.empty() ? 0 : 1 - m.open_slots.back();
  run_pass(batch, cache, greedy, slot);
  m.open_slots.push_back(slot);
}

void LlamaModelCuda::begin_greedy(const ForwardBatch& batch, KvCache& cache) {
  begin_pass(batch, cache, true);
}

void LlamaModelCuda::begin_sample(const ForwardBatch& batch, KvCache& cache) {
  begin_pass(batch, cache, false);
}

int32_t LlamaModelCuda::open_passes() const { return int32_t(impl_->open_slots.size()); }

int32_t LlamaModelCuda::chained_rows() const {
  const Impl& m = *impl_;
  if (m.open_slots.empty()) return 0;
  const Impl::PassSlot& g = m.pass_slots[m.open_slots.back()];
  return g.picks ? g.rows : 0;
}

bool LlamaModelCuda::oldest_finished() const {
  const Impl& m = *impl_;
  PA_CHECK(!m.open_slots.empty(), "LlamaModelCuda::oldest_finished: no open pass");
  const Impl::PassSlot& g = m.pass_slots[m.open_slots.front()];
  PA_CHECK(!g.sampled || g.picked || m.shard.rank != 0, "LlamaModelCuda::oldest_finished: the ",
           "oldest open pass is sampled and has no plan yet");
  const cudaError_t e = cudaEventQuery(g.end);
  if (e == cudaErrorNotReady) return false;
  check_cuda(e, "LlamaModelCuda::oldest_finished");
  return true;
}

void LlamaModelCuda::finish_unread() {
  Impl& m = *impl_;
  PA_CHECK(!m.open_slots.empty(), "LlamaModelCuda::finish_unread: no open pass");
  m.finish_oldest(m.pass_slots[m.open_slots.front()].sampled, "finish_unread");
}

bool LlamaModelCuda::overlaps_passes() const { return impl_->overlap_passes; }

LlamaModelCuda::Impl::PassSlot& LlamaModelCuda::Impl::finish_oldest(bool sampled,
                                                                      const char* op) {
  Impl& m = *this;
  try {
    PA_CHECK(!m.open_slots.empty() && m.pass_slots[m.open_slots.front()].sampled == sampled &&
                 (!sampled || m.pass_slots[m.open_slots.front()].picked || m.shard.rank != 0),
             "LlamaModelCuda::", op, ": no ", sampled ? "pick_sampled" : "begin_greedy",
             " before it");
    Impl::PassSlot& g = m.pass_slots[m.open_slots.front()];
    check_cuda(cudaEventSynchronize(g.end), op);
    m.open_slots.pop_front();
    float ms = 0;
    check_cuda(cudaEventElapsedTime(&ms, g.begin, g.end), "cudaEventElapsedTime");
    m.busy_seconds += double(ms) * 1e-3;
    return g;
  } catch (...) {
    m.open_slots.clear();  // the passes after it are lost too
    throw;
  }
}

std::vector<int32_t> LlamaModelCuda::finish_greedy() {
  const Impl::PassSlot& g = impl_->finish_oldest(false, "finish_greedy");
  const auto* h = reinterpret_cast<const int32_t*>(g.host.p);
  return std::vector<int32_t>(h, h + g.rows);
}

void LlamaModelCuda::pick_sampled(const SamplePlan& plan) {
  Impl& m = *impl_;
  // NOTE: a tensor-parallel group picks on rank 0, where the logits are gathered.
  PA_CHECK(m.shard.rank == 0, "LlamaModelCuda::pick_sampled: rank ", m.shard.rank,
           " has no logits to pick from");
  Impl::PassSlot* g = nullptr;
  for (int slot : m.open_slots)
    if (!g && m.pass_slots[slot].sampled && !m.pass_slots[slot].picked) g = &m.pass_slots[slot];
  try {
    PA_CHECK(g != nullptr, "LlamaModelCuda::pick_sampled: no begin_sample before it");
    // NOTE: checked here, while the pass runs, not before it: a bad plan fails the step after
    // its K/V writes, which the caller has not committed.
    check_sample_plan(plan, g->rows, m.config.vocab_size, "LlamaModelCuda::forward_sample");
    m.stage_plan(plan);
    g->picks = m.enqueue_sampler(g->logits, plan, g->host);
    m.record_slot_event(*g, false);
  } catch (...) {
    m.open_slots.clear();
    throw;
  }
  g->picked = true;
  g->top_n = std::max(plan.max_logprobs(), 0);
  g->logprobs.clear();
  for (const RowSampling& r : plan.rows) g->logprobs.push_back(r.logprobs);
}

std::vector<TokenLogprobs> LlamaModelCuda::take_sampled() {
  const Impl::PassSlot& g = impl_->finish_oldest(true, "take_sampled");
  if (g.rows == 0) return {};
  return impl_->sampled_tokens(reinterpret_cast<const int32_t*>(g.host.p), g.rows, g.top_n,
                               g.logprobs);
}

}  // namespace pagedattn
