// The CUDA backend of the paged attention operator: plan once per step, then run every layer.
//
//   CudaAttentionPlan plan;                     // owns a fixed device workspace
//   plan.plan(q, kv, host_batch, opt, out);     // host copies of q_indptr / kv_len / block_table
//   for (layer ...) paged_attention_cuda(plan, q[layer], kv[layer], out[layer], stream);
//
// plan() validates the batch with validate_paged_attention's rules (same messages), splits long
// decode rows into fixed chunks of positions (split-KV over the chunks, chosen from the shape and
// the SM count) and uploads the metadata into the workspace. run() only launches kernels
// (one for the decode rows, the split-KV merge fused into it, one for the prefill rows), so a
// decode step can be captured in a CUDA graph. Decode rows (q_len == 1) go to the split-KV decode
// kernel (tensor cores for GQA groups); longer rows to the tensor-core prefill kernel.
//
// NOTE: the split-KV partition is fixed by position (a row's chunk size follows from its own
// positions only) and the partial states are merged in position order with the same arithmetic
// whether or not a row is split, so a row's output does not depend on the batch it is in.
//
// Supported: q/out bf16 or f16 (out has q's dtype); KV of q's dtype or fp8 e4m3 (per-head scales
// in device memory); head_dim 64, 128 or 256; any page size; any GQA ratio.
// In builds without CUDA every entry point throws Error.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "pagedattn/attention.h"

namespace pagedattn {

// Positions per split-KV chunk (the unit of the fixed partition) of rows up to
// kDecodeChunkTokens * kDecodeMaxChunks positions; a longer row's chunks are this doubled until
// the row has at most kDecodeMaxChunks of them (kDecodeMaxChunksFp8Tc for fp8 pools on the
// tensor-core decode kernel), or they hold 2^20 positions (CudaPlanOptions::decode_chunk_tokens).
// Rows on the CUDA-core decode kernel (group 1) at head dim 128 with 16-bit K/V that fit
// kDecodeShortRowChunks chunks of kDecodeShortChunkTokens take those.
constexpr int32_t kDecodeChunkTokens = 256;
constexpr int32_t kDecodeMaxChunks = 16;
constexpr int32_t kDecodeMaxChunksFp8Tc = 32;
constexpr int32_t kDecodeShortChunkTokens = 128;
constexpr int32_t kDecodeShortRowChunks = 8;

struct CudaPlanOptions {
  // When the decode rows give fewer CTAs than the GPU has SMs, their chunks are spread so that
  // about this many CTAs per SM run: -1, as many as fit at once (the decode kernel's occupancy:
  // one full wave); 0, no split-KV at all.
  int32_t target_ctas_per_sm = -1;
  // Force the split-KV slice of a decode CTA to this many kDecodeChunkTokens units of positions
  // (at least one of its row's chunks; 0: chosen by the heuristic). Tests use it.
  int32_t chunks_per_cta = 0;
  // Rows of sequences with q_len > 1 go to the tensor-core prefill kernel where it supports the
  // dtypes (false: the decode kernel runs every query row, a slower path kept for cross-checking).
  bool tensor_core_prefill = true;
  // On an sm_90 GPU, those prefill rows run on the Hopper kernel (wgmma on tiles brought in by
  // bulk tensor copies) where it supports the shape; false: always the mma.sync kernel.
  bool hopper_prefill = true;
  // In the Hopper kernel, the softmax of one KV tile runs while the tensor cores do P V of the
  // previous one (false: one step after the other, kept for the kernel lab).
  bool hopper_prefill_overlap = true;
  // In the Hopper kernel, K and V gathered by the producer warpgroup's threads with cp.async
  // instead of bulk tensor copies of page-sized runs of rows (slower wherever both work: kept for
  // the kernel lab); pages that are not a multiple of 8 tokens are always gathered (no tensor
  // copy takes them).
  bool hopper_gather = false;
  // The Hopper kernel's schedule. Its works (a tile of packed rows for one KV head) go heaviest
  // first, in sections of this many KV heads: -1, as many heads as keep their K/V within about
  // 60% of the L2 (heads of a section run side by side); 1, one head after the other.
  int32_t hopper_head_section = -1;
  // The two consumer warpgroups take turns at issuing their products (named barriers), so that
  // one's softmax runs while the other's products hold the tensor cores (overlapped loop only).
  bool hopper_pingpong = true;
  // CTAs of the Hopper kernel: -1, one per SM, each running works one after the other (the next
  // work's Q and first K/V tiles come in while the work before ends); 0, one CTA per work; n > 0,
  // at most n (tests use a few, so that every CTA runs many works). 16-bit pools only: fp8 pools
  // always run one CTA per work.
  int32_t hopper_ctas = -1;
  // Decode rows of GQA groups of at least this many query heads per KV head run on the
  // tensor-core decode kernel, the others on the CUDA-core one. It depends on the model's shape
  // only, never on the batch, so a row's output does not depend on the batch it is in.
  int32_t tensor_core_decode_min_group = 2;
  // Positions per split-KV chunk of a decode row: 0, chosen per row from its own positions and
  // the model's shape (kDecodeChunkTokens, doubled while the row would span more than
  // kDecodeMaxChunks chunks: a long row then has fewer partial states to merge and fewer chunk
  // ends; kDecodeShortChunkTokens for short rows on the CUDA-core kernel); > 0, that many for
  // every row (a multiple of 64; 256 is the partition before rows chose their own).
  int32_t decode_chunk_tokens = 0;
  // Each decode CTA's work item carries the block table's entries of its first pages, so that
  // its first K/V copies need one dependent read, not two (false: read from the block table,
  // a comparison for the kernel lab).
  bool decode_item_pages = true;
  // The caller's promise that each sequence's cached positions, those before its q_len new ones,
  // were written before the kernel ahead of the attention started (a model's own step: only its
  // RoPE kernel writes this step's K/V). The tensor-core decode kernel then issues its first
  // copies of those positions before it waits for the kernel ahead (programmatic dependent
  // launch). False: every K/V read waits for the kernel ahead, whatever wrote the pools.
  bool decode_early_cached_kv = false;
  // Kernel lab instrument: a device buffer of 8 x uint64_t per CTA of the tensor-core decode
  // kernel (blockIdx.x * gridDim.y + blockIdx.y), which then records the GPU's global timer (ns)
  // at its start, after its prologue (its first copies issued), after its last chunk and at its
  // exit (bit 63 set where the CTA merged its row's partials), and in a merging CTA when it knows
  // it merges, when its first window's copies are issued and weighed, when they have landed, and
  // after the last window. Null: nothing recorded.
  void* decode_trace = nullptr;
  // Kernel lab instrument: a device buffer of 8 x uint64_t per work of the Hopper prefill kernel
  // (a prefill item for one KV head, in the kernel's work order), which then records the GPU's
  // global timer (ns) as the first consumer warpgroup takes the work, finds its Q landed, has its
  // first S = Q K^T, has its last P V, has stored its rows and has the next work in hand (before
  // the stores); when the producer has issued its Q; and the CTA (high 32 bits), its count of
  // works before this one (bits 16-31) and the work's KV tiles (0-15). Null: nothing recorded.
  // Recorded only by a library built with -DPAGEDATTN_PREFILL_TRACE=ON (a lab build).
  void* prefill_trace = nullptr;
};

// What a plan decided, for tests and benchmarks.
struct CudaPlanInfo {
  int32_t decode_rows = 0;      // query rows run by the decode kernel
  int32_t decode_ctas = 0;      // decode work items (x dimension of its grid)
  int32_t split_rows = 0;       // decode rows whose chunks are spread over several CTAs
  int32_t prefill_tiles = 0;    // prefill work items
  bool prefill_hopper = false;  // the prefill items run on the Hopper (wgmma) kernel
  int32_t chunks_per_cta = 0;   // split-KV slice per CTA, in units of 64 positions
  int32_t decode_tc_rows = 0;  // query heads per tensor-core decode CTA (0: CUDA-core kernel)
  size_t workspace_bytes = 0;
};

class CudaAttentionPlan {
 public:
  // Allocates the workspace (device metadata + split-KV partials) on the current device.
  explicit CudaAttentionPlan(size_t workspace_bytes = size_t(64) << 20, CudaPlanOptions opts = {});
  ~CudaAttentionPlan();
  CudaAttentionPlan(const CudaAttentionPlan&) = delete;
  CudaAttentionPlan& operator=(const CudaAttentionPlan&) = delete;

  // Plans one step. batch holds HOST pointers; q, kv and out may hold device pointers (only their
  // shapes and dtypes are read). Throws Error (validate_paged_attention's messages, or
  // "paged_attention_cuda: ..." for what this backend cannot run, or a workspace too small).
  // stream: a cudaStream_t (nullptr: the default stream) for the metadata upload.
  void plan(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
            const AttentionOptions& opt, const QKVTensor& out, void* stream = nullptr);

  const CudaPlanInfo& info() const { return info_; }

  // What every paged_attention_cuda launch under this plan takes by value besides its q, out and
  // pool pointers (kernel arguments that fix the grids, the workspace offsets, dtypes): two plans
  // with equal signatures launch the same kernels and differ only in the metadata values they
  // uploaded, so a CUDA graph captured under one replays correctly under the other.
  std::string launch_signature() const;


 private:
  struct Impl;
  // The run reads what plan() left (the launch parameters, the planned shapes).
  friend void paged_attention_cuda(const CudaAttentionPlan& plan, const QKVTensor& q,
                                   const PagedKVView& kv, QKVTensor& out, void* stream);
  std::unique_ptr<Impl> impl_;
  CudaPlanInfo info_;
};

// Runs the planned step on one layer: q, out and the pools are device memory with the shapes
// and dtypes given to plan() (checked; Error otherwise). Asynchronous on stream. The launches of
// one plan run one after the other (one stream, or ordered by events): they share the plan's
// workspace (split-KV partials, the kernels' work counters).
void paged_attention_cuda(const CudaAttentionPlan& plan, const QKVTensor& q, const PagedKVView& kv,
                          QKVTensor& out, void* stream = nullptr);

// The KV write path on the device: k, v [num_tokens, num_kv_heads, head_dim] (f32|f16|bf16,
// device) into slots [num_tokens] (device), rounded exactly like write_kv_cpu. When host_slots is
// given, every slot is validated first (write_kv_cpu's messages) and nothing is written on error;
// the kernel itself skips any slot outside the pool, never writing out of bounds.
void write_kv_cuda(const PagedKVView& kv, const int32_t* slots, int32_t num_tokens, const void* k,
                   const void* v, DType src_dtype, void* stream = nullptr,
                   const int32_t* host_slots = nullptr);

// Multiprocessor count of the current device (0 without CUDA).
int cuda_sm_count();

}  // namespace pagedattn
