// Internal entry points of the fused CPU attention kernel (not part of the public API): the
// dense no-paging baseline of the benchmark and the paged kernel on a chosen ISA (for tests).
#pragma once

#include <cstdint>

#include "pagedattn/attention.h"

namespace pagedattn {

// Attention over dense, contiguous K/V with the fused kernel's own loops (the no-paging baseline
// that the attention benchmark compares the paged kernel against).
struct DenseKV {
  const void* k = nullptr;  // [num_seqs][num_kv_heads][max_len][head_dim]
  const void* v = nullptr;  // [num_seqs][num_kv_heads][max_len][head_dim]
  DType dtype = DType::f32;
  int32_t num_kv_heads = 0;
  int32_t head_dim = 0;
  int32_t max_len = 0;
  const float* k_scale = nullptr;  // [num_kv_heads], fp8 only
  const float* v_scale = nullptr;  // [num_kv_heads], fp8 only
};

// q, out: [num_tokens, num_q_heads, head_dim]; q_indptr: [num_seqs + 1]; kv_len: [num_seqs], each
// <= kv.max_len. Same semantics as paged_attention_cpu.
void dense_attention_cpu(const QKVTensor& q, const DenseKV& kv, int32_t num_seqs,
                         const int32_t* q_indptr, const int32_t* kv_len,
                         const AttentionOptions& opt, QKVTensor& out);

// The kernel variants, by instruction set. `best` is what paged_attention_cpu uses.
enum class CpuIsa : uint8_t { best, generic, avx2, avx512 };
// Whether this build and this CPU can run the variant.
bool cpu_isa_available(CpuIsa isa);
// paged_attention_cpu on the given variant (throws Error if it is not available).
void paged_attention_cpu_isa(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                             const AttentionOptions& opt, QKVTensor& out, CpuIsa isa);

}  // namespace pagedattn
