// Launch parameters and entry points of the CUDA attention kernels (internal to the backend; the
// plan in plan.cu fills these, the kernel lab and the benchmark call them directly).
#pragma once

#include <cuda_runtime_api.h>

#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn::cuda {

// Block-table entries copied into each decode item: the pages of its first positions.
constexpr int kDecodeItemPages = 8;
static_assert((kDecodeItemPages & (kDecodeItemPages - 1)) == 0, "a power of two (lane masks)");

// One CTA of the decode kernel: query row q_row of sequence seq, which sees positions [lo, hi)
// (causal limit and sliding window applied), those in chunks [chunk_begin, chunk_end) of
// chunk_tokens positions each (the row's own chunk size, CudaPlanOptions::decode_chunk_tokens).
// partial < 0: the CTA covers every chunk of the row and writes the output; else chunk c's state goes to partial slot partial + c - chunk_begin, and merge names
// the row's MergeItem. pages: the block table's entries for the item's first page on (the one of
// position max(chunk_begin * chunk_tokens, lo)), -1 past the row's positions or where the
// plan leaves them out (CudaPlanOptions::decode_item_pages), so that the tensor-core kernel's
// first copies wait on one read (the item) instead of two (the item, then the block table).
struct DecodeItem {
  int32_t seq, q_row, lo, hi, chunk_begin, chunk_end, partial, merge, chunk_tokens;
  int32_t pages[kDecodeItemPages];
  // Positions below this were written before the kernel ahead started and may be read before the
  // kernel waits for it (CudaPlanOptions::decode_early_cached_kv; 0: none).
  int32_t cached_end;
};
// A split row: num_chunks partial states from slot partial on, in position order, written by
// num_ctas decode CTAs (per head tile); the last of them to finish merges them (merge_if_last).
struct MergeItem {
  int32_t q_row, partial, num_chunks, num_ctas;
};
// One CTA of the prefill kernel: a tile of kPrefillRows packed (query, head-in-group) rows of
// sequence seq starting at packed row row_begin (packed row r = query r / group, head r % group).
struct PrefillItem {
  int32_t seq, row_begin;
};

struct AttentionParams {
  const void* q = nullptr;               // [num_tokens, num_q_heads, head_dim] (bf16 | f16)
  void* out = nullptr;                   // [num_tokens, num_q_heads, head_dim] (q's dtype)
  const void* k_pages = nullptr;         // [num_pages, num_kv_heads, page_size, head_dim]
  const void* v_pages = nullptr;         // [num_pages, num_kv_heads, page_size, head_dim]
  const float* k_scale = nullptr;        // [num_kv_heads], fp8 only
  const float* v_scale = nullptr;        // [num_kv_heads], fp8 only
  const int32_t* q_indptr = nullptr;     // [num_seqs + 1]
  const int32_t* kv_len = nullptr;       // [num_seqs]
  const int32_t* block_table = nullptr;  // [num_seqs, max_pages_per_seq]
  int32_t max_pages_per_seq = 0;
  int32_t num_q_heads = 0, num_kv_heads = 0, group = 1, page_size = 0;
  int64_t page_stride = 0, head_stride = 0;  // elements
  float scale = 0.f;                         // effective softmax scale
  float softcap = 0.f;
  int32_t window = 0;
  bool causal = true;
  int32_t head_tiles = 1;  // set by the launcher
  // decode
  const DecodeItem* decode_items = nullptr;  // [num_decode_items]
  int32_t num_decode_items = 0;
  float* partial_o = nullptr;              // [num_partials, num_q_heads, head_dim]
  float* partial_md = nullptr;             // [num_partials, num_q_heads, 2]: (max, sum)
  const MergeItem* merge_items = nullptr;  // [num_merge_items]
  int32_t num_merge_items = 0;
  // [num_merge_items, num_kv_heads * head_tiles]: CTAs of a split row done so far; zero between
  // launches (the plan clears them, the merging CTA resets its own).
  int32_t* merge_counters = nullptr;
  // Query heads per CTA of the tensor-core decode kernel (8 or 16); 0: the CUDA-core kernel.
  int32_t decode_tc_rows = 0;
  uint64_t* decode_trace = nullptr;   // CudaPlanOptions::decode_trace
  uint64_t* prefill_trace = nullptr;  // CudaPlanOptions::prefill_trace
  // prefill
  const PrefillItem* prefill_items = nullptr;  // [num_prefill_items]
  int32_t num_prefill_items = 0;
  // Which prefill kernel runs the items: kPrefillMma (mma.sync, any GPU), kPrefillWgmma (the
  // Hopper kernel, softmax overlapped with P V) or kPrefillWgmmaSerial (the Hopper kernel, one
  // step after the other); the plan picks a Hopper one only where prefill_hopper_available().
  int32_t prefill_kernel = 0;
  int32_t num_tokens = 0, num_pages = 0;  // the Hopper kernel's tensor maps
  int32_t tma_box_rows = 0;               // K/V rows per bulk copy (set by its launcher)
  bool hopper_gather = false;             // K/V gathered by cp.async instead of tensor copies
  // The Hopper kernel's work order (prefill_hopper_kernel.cuh: KV heads per L2 section, >= 1)
  // and the consumer warpgroups' ping-pong.
  int32_t hopper_head_section = 1;
  bool hopper_pingpong = false;
  // The Hopper kernel's grid: 0, one CTA per work; n > 0, at most n CTAs, each running its works
  // one after the other (prefill_hopper_kernel.cuh: hopper_work_index).
  int32_t hopper_ctas = 0;
  // [2]: the persistent grid's next work (past its first gridDim.x) and its CTAs done taking
  // works; zero between launches (the plan clears them, the kernel's last CTA resets them).
  int32_t* hopper_counters = nullptr;
};

constexpr int32_t kPrefillMma = 0;
constexpr int32_t kPrefillWgmma = 1;
constexpr int32_t kPrefillWgmmaSerial = 2;

// Query heads per CTA of the CUDA-core decode kernel for a GQA group of `group` (fp8 keeps 4 at
// most: its 16-element vectors double the registers per head).
inline int decode_group_tile(int group, bool fp8_kv) {
  if (group == 1) return 1;
  if (group <= 4 || fp8_kv) return 4;
  return 8;
}
// Query heads per CTA of the tensor-core decode kernel: the 8 columns of an n8 mma tile, or two
// tiles for groups above 8 at head_dim <= 128 (head_dim 256 would spill registers).
inline int decode_tc_rows(int group, int head_dim) { return group > 8 && head_dim <= 128 ? 16 : 8; }

// Rows (packed query x head-in-group) per prefill CTA.
constexpr int32_t kPrefillRows = 128;

// Decode kernel over p.decode_items (any q_len: each item is one query row): the tensor-core one
// when p.decode_tc_rows > 0, else the CUDA-core one; split rows are merged by their last CTA.
// q: bf16|f16; kv: q's dtype or fp8; head_dim 64|128|256. Throws Error for an unsupported
// combination.
void launch_decode(const AttentionParams& p, DType q, DType kv, int head_dim, cudaStream_t s);
// CTAs of the decode kernel that launch_decode would pick (tc_rows > 0: the tensor-core one with
// that many rows; else the CUDA-core one with group_tile heads) resident at once on one SM
// (cudaOccupancyMaxActiveBlocksPerMultiprocessor with its shared memory; at least 1).
int decode_ctas_per_sm(DType q, DType kv, int head_dim, int tc_rows, int group_tile);
// Tensor-core prefill kernel over p.prefill_items.
void launch_prefill(const AttentionParams& p, DType q, DType kv, int head_dim, cudaStream_t s);
// Whether launch_prefill handles this combination.
bool prefill_supported(DType q, DType kv, int head_dim);

// The Hopper (sm_90a) prefill kernel over p.prefill_items: wgmma + bulk tensor copies. Falls back
// to launch_prefill where a tensor map cannot be encoded (e.g. a misaligned pool).
void launch_prefill_hopper(const AttentionParams& p, DType q, DType kv, int head_dim,
                           cudaStream_t s);
// Whether the Hopper kernel handles this shape: q bf16 or f16 and KV of q's dtype or fp8 (e4m3),
// head_dim 64, 128 or 256, a GQA group dividing kPrefillRows; by tensor copies (gather false)
// page_size a multiple of 8 (a copy takes gcd(page_size, tile) rows); gathered (16-bit KV only),
// any page size.
bool prefill_hopper_supported(DType q, DType kv, int head_dim, int group, int page_size,
                              bool gather);
// Whether the Hopper kernel gathers K/V for this page size: when asked
// (CudaPlanOptions::hopper_gather), or when no tensor copy takes the page size.
inline bool prefill_hopper_gathers(bool asked, int page_size) {
  return asked || page_size % 8 != 0;
}
// Whether it can run here: the current device is sm_90 and the kernel was built for sm_90a, and
// the driver's tensor-map encoder is reachable.
bool prefill_hopper_available();

}  // namespace pagedattn::cuda
