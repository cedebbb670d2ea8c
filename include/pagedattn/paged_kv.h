// The plain paged-KV view shared by the reference, the CPU kernel and the CUDA kernels.
//
// One layer's pools, each one contiguous buffer:
//   k_pages, v_pages : [num_pages][num_kv_heads][page_size][head_dim]   (dtype: f32|f16|bf16|fp8_e4m3)
// Token position p of sequence b lives at page block_table[b][p / page_size], slot p % page_size.
// A slot id (the write path's currency) is page * page_size + slot.
// fp8 pools store x / scale; the value read is stored * scale, with one scale per KV head.
#pragma once

#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn {

struct PagedKVView {
  void* k_pages = nullptr;         // [num_pages][num_kv_heads][page_size][head_dim]
  void* v_pages = nullptr;         // [num_pages][num_kv_heads][page_size][head_dim]
  DType dtype = DType::f32;
  int32_t num_pages = 0;
  int32_t num_kv_heads = 0;
  int32_t page_size = 0;
  int32_t head_dim = 0;
  const float* k_scale = nullptr;  // [num_kv_heads], fp8 only (same device as the pools)
  const float* v_scale = nullptr;  // [num_kv_heads], fp8 only

  PA_HD int64_t head_stride() const { return int64_t(page_size) * head_dim; }
  PA_HD int64_t page_stride() const { return int64_t(num_kv_heads) * page_size * head_dim; }
  // Element offset of (page, kv_head, slot, 0).
  PA_HD int64_t offset(int32_t page, int32_t kv_head, int32_t slot) const {
    return int64_t(page) * page_stride() + int64_t(kv_head) * head_stride() + int64_t(slot) * head_dim;
  }
};

// The ragged batch: which query rows and which pages belong to each sequence.
// Pointers are host or device memory, matching the backend that reads them.
struct BatchLayout {
  int32_t num_seqs = 0;
  const int32_t* q_indptr = nullptr;     // [num_seqs + 1]: sequence b's queries are rows q_indptr[b]..q_indptr[b+1]
  const int32_t* kv_len = nullptr;       // [num_seqs]: tokens in the cache for b, new ones included
  const int32_t* block_table = nullptr;  // [num_seqs][max_pages_per_seq]
  int32_t max_pages_per_seq = 0;
};

}  // namespace pagedattn
