// LlamaModelCuda: the Llama-family forward pass (the same math as LlamaModel, llama.h) on one CUDA
// device, in bf16 with fp32 accumulation, over a KvCache whose pools are on that device.
//
// At load the weights of the ModelFile (f32, f16 or bf16 host tensors, a folder's possibly
// memory-mapped as stored: only the parts uploaded are read) become bf16 on the device (q/k/v and
// gate/up fused into one matrix each); norm weights, biases and the residual stream stay fp32.
// Per forward:
//   one upload of tokens, slots, logit rows and the RoPE cos/sin of the positions;
//   x = embed[tokens]                                              (gather kernel, fp32 x)
//   per layer: h = rms_norm(x) (bf16); qkv = h Wqkv^T (cuBLAS, fp32 out);
//     one kernel: + bias (Qwen2), per-head q/k RMSNorm (Qwen3), RoPE, split to bf16 q, k, v;
//     write_kv_cuda into the layer's pools; paged_attention_cuda (one plan per forward);
//     x += attn Wo^T (GEMM with beta = 1); h = rms_norm(x); gu = h Wgu^T (bf16 out);
//     a = silu(g) * u;
//     x += a Wd^T;
//   logits = rms_norm(x[logit_rows]) lm_head^T (fp32 out), copied to a host f32 tensor (in
//   page-locked memory that is reused once the caller drops it, up to 64 MiB of logits);
//   forward_greedy instead takes each row's argmax on the device and copies only the ids, and
//   forward_sample samples each row on the device (penalties, top-k/p, min-p, seeded draws,
//   log-probabilities) and copies only the ids and the log-probabilities.
// All of it on one stream of the runner's; decode steps replay CUDA graphs (set_cuda_graphs).
// The cache must be on CUDA with dtype bf16 (or fp8_e4m3 with its scales set).
// In builds without CUDA the constructor throws Error.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <vector>

#include "pagedattn/model.h"
#include "pagedattn/tensor_parallel.h"

namespace pagedattn {

namespace cuda {
class NcclComm;
}

class LlamaModelCuda : public Model {
 public:
  // Validates the file like LlamaModel (same messages, "LlamaModelCuda: ..."), then uploads the
  // weights. Throws Error when there is no CUDA device or a CUDA/cuBLAS call fails.
  explicit LlamaModelCuda(const ModelFile& file);
  // A synthetic model (synthetic_model.h): random bf16 weights of `config`'s shapes generated on
  // the device from (seed, tensor, index), with no host copy; the same values, rounded to bf16, as
  // LlamaModelCuda(make_hashed_synthetic_model_file(config, seed)). Validates the config like
  // LlamaModel ("LlamaModelCuda: ...").
  LlamaModelCuda(const ModelConfig& config, uint64_t seed);
  // One rank's shard of either (tensor_parallel.h): only its slice of every weight is uploaded (or
  // filled); forward runs the group's collectives on `comm` (this process's rank; the current CUDA
  // device is the rank's). The cache must hold the rank's KV heads (num_local_kv_heads).
  LlamaModelCuda(const ModelFile& file, TpShard shard, cuda::NcclComm* comm);
  LlamaModelCuda(const ModelConfig& config, uint64_t seed, TpShard shard, cuda::NcclComm* comm);
  ~LlamaModelCuda() override;
  LlamaModelCuda(const LlamaModelCuda&) = delete;
  LlamaModelCuda& operator=(const LlamaModelCuda&) = delete;

  const ModelConfig& config() const override;
  Device device() const override { return Device::cuda; }
  Tensor forward(const ForwardBatch& batch, KvCache& cache) override;
  // The fp8 calibration pass (Model::kv_absmax): the tokens through a private bf16 cache on the
  // device, whose stored K and V are read back for their absolute maxima.
  KvAbsMax kv_absmax(const std::vector<int32_t>& tokens) override;
  // The same on a tensor-parallel rank: every rank of the group runs it at once (its pass holds
  // the collectives), each for its own KV heads (k, v [num_layers * num_local_kv_heads()]);
  // `while_busy` (if set) is called over and over while the device runs the pass, and may throw
  // (or end the process) to give up on a group that has failed.
  KvAbsMax kv_absmax(const std::vector<int32_t>& tokens, const std::function<void()>& while_busy);
  // The same pass; the argmax of each logit row on the device, and only the ids downloaded.
  std::vector<int32_t> forward_greedy(const ForwardBatch& batch, KvCache& cache) override;
  // The same pass; every row sampled on the device by the plan (cuda/sampling_kernels.h), and only
  // the ids and the asked log-probabilities downloaded.
  std::vector<TokenLogprobs> forward_sample(const ForwardBatch& batch, KvCache& cache,
                                            const SamplePlan& plan) override;
  // Passes in two calls (Model::begin_greedy, begin_sample): begin_* enqueue the pass and return
  // at once; a pass begun while another is open takes that pass's picks as its stand-in tokens on
  // the device. finish_greedy waits for the oldest open pass and reads its ids; pick_sampled
  // checks the plan (while the pass runs), uploads it and enqueues the sampler, take_sampled
  // waits and reads the tokens. Each open pass has its own page-locked results and events (two
  // slots, alternating). On a tensor-parallel rank every rank begins the same passes (the greedy
  // ids exist on every rank); only rank 0 picks a sampled pass's tokens.
  void begin_greedy(const ForwardBatch& batch, KvCache& cache) override;
  std::vector<int32_t> finish_greedy() override;
  void begin_sample(const ForwardBatch& batch, KvCache& cache) override;
  void pick_sampled(const SamplePlan& plan) override;
  std::vector<TokenLogprobs> take_sampled() override;
  // True unless PAGEDATTN_SCHEDULE_AHEAD=0 is in the environment.
  bool overlaps_passes() const override;
  // For a tensor-parallel group, whose ranks must not block in CUDA while a peer may be gone: the
  // open passes; the logit rows that a pass begun now may name (the last open pass's, once its
  // picks exist: 0 before a sampled pass's plan); whether the oldest open pass has finished on
  // the device (never blocks; a sampled one needs its plan first, except on a worker rank, which
  // never picks); and finishing it without reading its picks (a worker's).
  int32_t open_passes() const;
  int32_t chained_rows() const;
  bool oldest_finished() const;
  void finish_unread();

  // Measured with a pair of CUDA events around each step (Model::device_busy_seconds).
  double device_busy_seconds() const override;

  // Checks a batch against the cache and this model without touching either (the CPU model's
  // rules and messages, prefixed "LlamaModelCuda::forward"; the cache must be a CUDA one).
  // chained_rows: check_forward_batch's (stand-in tokens of a pass begun before).
  void validate(const ForwardBatch& batch, const KvCache& cache, int32_t chained_rows = 0) const;

  // KV heads in this runner's cache: all of them, or a tensor-parallel rank's.
  int32_t num_local_kv_heads() const;

  // forward's work up to the logits, which stay on the device: returns them [R, vocab] f32 there,
  // or null when there are no logit rows (then the step has been synchronised). Every rank of a
  // tensor-parallel group calls it with the same batch. `greedy`: the step also takes each row's
  // argmax for download_greedy; on a tensor-parallel group the ranks then exchange only each
  // row's largest logit of their vocabulary slice and its id, and the logits returned are not
  // assembled (only download_greedy may follow).
  const float* forward_device(const ForwardBatch& batch, KvCache& cache, bool greedy = false);
  // The rest of forward / forward_greedy after forward_device: the logits [rows, vocab] to the host,
  // or each row's argmax id (only the ids downloaded). Both block until the step is done.
  Tensor download_logits(const float* device_logits, int64_t rows);
  std::vector<int32_t> download_greedy(const float* device_logits, int32_t rows);
  // Or each row sampled by the plan (checked first; its rows are the logit rows).
  std::vector<TokenLogprobs> download_sampled(const float* device_logits, const SamplePlan& plan);
  // Whether every step enqueued so far has finished (never blocks).
  bool idle() const;

  // Bytes of the device weights (bf16 matrices, f32 norms and biases).
  size_t weight_bytes() const;
  // Of those, the bytes every forward step reads in full: all but the embedding table when the
  // lm_head is separate (the step gathers only its tokens' rows). The weight part of the memory
  // floor of a decode step.
  size_t step_weight_bytes() const;

  // Decode steps (one new token per sequence) replay CUDA graphs: a step's launches are captured
  // the second time in a row they occur (same padded row count, scratch buffers and attention
  // launch shapes) and replayed while they recur, so the host's launch calls leave the step (they
  // bound small models' steps); the device sampler's launch and download replay a graph of their
  // own. On by default. Results are the same bits either way. PAGEDATTN_CUDA_GRAPHS=0 in the
  // environment starts with them off.
  void set_cuda_graphs(bool enabled);
  bool cuda_graphs() const;
  // Decode steps (every sequence one new token) run padded to one of a few row counts
  // (src/model/decode_padding.h: n up to 2, 4, multiples of 8 to 64, ...) with dummy rows that
  // write nothing, so that continuous batching's changing batches replay a few graphs instead of
  // capturing new ones. Outputs are the batch's rows only. On by default (graphs or not, so both
  // compute the same); PAGEDATTN_PAD_DECODE=0 in the environment starts with it off.
  void set_decode_padding(bool enabled);
  // Tensor parallelism: the median seconds of the collectives of one step of `tokens` tokens and
  // `logit_rows` logit rows, run alone `reps` times (every rank must call it with the same
  // arguments). 0 without a communicator.
  double time_collectives(int32_t tokens, int32_t logit_rows, int32_t reps);
  GraphStats cuda_graph_stats() const override;

 private:
  struct Impl;
  // forward_device's work; slot >= 0: a pass of begin_greedy / begin_sample into that slot.
  const float* run_pass(const ForwardBatch& batch, KvCache& cache, bool greedy, int slot);
  void begin_pass(const ForwardBatch& batch, KvCache& cache, bool greedy);

  std::unique_ptr<Impl> impl_;
};

}  // namespace pagedattn
