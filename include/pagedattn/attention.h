// The paged attention operator: prefill and decode over a ragged batch in one call.
//
//   q   : [num_tokens, num_q_heads, head_dim]  (f32 | f16 | bf16), tokens of all sequences packed
//   out : [num_tokens, num_q_heads, head_dim]  (f32 | f16 | bf16)
//   kv  : one layer's pools (paged_kv.h), batch: q_indptr, kv_len, block_table.
//
// Query j of sequence b sits at absolute position kv_len[b] - q_len[b] + j. With causal it sees
// keys at positions <= its own; with window > 0 only keys at positions > pos - window; softcap > 0
// maps each scaled logit x to softcap * tanh(x / softcap). GQA: query head h reads KV head
// h / (num_q_heads / num_kv_heads). A query that sees no key gets an output of zeros.
// Softmax is computed in fp32 (double in the reference); dense K/V is never materialised by the
// fused kernels.
#pragma once

#include <cstdint>
#include <memory>

#include "pagedattn/dtype.h"
#include "pagedattn/paged_kv.h"
#include "pagedattn/tensor.h"

namespace pagedattn {

struct AttentionOptions {
  float scale = 0.f;    // 0: 1/sqrt(head_dim)
  bool causal = true;
  int32_t window = 0;   // 0: no sliding window
  float softcap = 0.f;  // 0: no soft-capping
};

// A non-owning view of q or out (contiguous [num_tokens, num_heads, head_dim]).
struct QKVTensor {
  void* data = nullptr;
  DType dtype = DType::f32;
  int32_t num_tokens = 0;
  int32_t num_heads = 0;
  int32_t head_dim = 0;
};

// Checks every argument (host copies of the batch metadata) and throws Error naming the one at
// fault: shapes that disagree, q_indptr not non-decreasing or not ending at num_tokens, a q_len
// beyond kv_len, kv_len beyond the block table, a page id outside the pool, a head count that does
// not divide, a dtype the backend cannot read, fp8 pools without scales.
void validate_paged_attention(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                              const AttentionOptions& opt, const QKVTensor& out);

// The reference: gathers each sequence's K/V to dense and runs a two-pass softmax in double.
// The oracle of every test. Host pointers only.
void paged_attention_reference(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                               const AttentionOptions& opt, QKVTensor& out);

// The fused CPU kernel: walks pages with online softmax, reads each K/V page once per KV-head
// group, parallel over (sequence, KV head, query block) on the thread pool. Host pointers only.
void paged_attention_cpu(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                         const AttentionOptions& opt, QKVTensor& out);

// The same kernel, plan-then-run (as CudaAttentionPlan): plan() validates a batch once and splits
// it into the pool's work items; run() attends one layer's pools over that plan, with the same
// results as the one-shot call. A model step plans once and runs once per layer (every layer has
// the same shapes). The plan keeps `batch`'s pointers (q_indptr, kv_len, block_table): they must
// stay valid and unchanged until the last run. run() checks that q, out and the pools have the
// planned shapes and dtypes (Error otherwise).
class CpuAttentionPlan {
 public:
  CpuAttentionPlan();
  ~CpuAttentionPlan();
  CpuAttentionPlan(const CpuAttentionPlan&) = delete;
  CpuAttentionPlan& operator=(const CpuAttentionPlan&) = delete;

  void plan(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
            const AttentionOptions& opt, const QKVTensor& out);
  void run(const QKVTensor& q, const PagedKVView& kv, QKVTensor& out) const;

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
};

// The KV write path: stores the K and V of new tokens in their slots (slot = page * page_size +
// offset), converting to the pool's dtype (fp8: x / scale, saturating). Host pointers only.
//   slots: [num_tokens], k, v: [num_tokens, num_kv_heads, head_dim] of dtype src_dtype.
// Validates every slot before writing anything.
void write_kv_cpu(const PagedKVView& kv, const int32_t* slots, int32_t num_tokens, const void* k,
                  const void* v, DType src_dtype);

}  // namespace pagedattn
