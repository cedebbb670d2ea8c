// The CUDA entry points in builds without CUDA: each throws Error (and reports no device).
#ifndef PAGEDATTN_HAVE_CUDA

#include "pagedattn/attention_cuda.h"
#include "pagedattn/error.h"

namespace pagedattn {

struct CudaAttentionPlan::Impl {};

CudaAttentionPlan::CudaAttentionPlan(size_t, CudaPlanOptions) {
  fail("CudaAttentionPlan: pagedattn was built without CUDA support");
}
CudaAttentionPlan::~CudaAttentionPlan() = default;

void CudaAttentionPlan::plan(const QKVTensor&, const PagedKVView&, const BatchLayout&,
                             const AttentionOptions&, const QKVTensor&, void*) {
  fail("paged_attention_cuda: pagedattn was built without CUDA support");
}

std::string CudaAttentionPlan::launch_signature() const { return {}; }

void paged_attention_cuda(const CudaAttentionPlan&, const QKVTensor&, const PagedKVView&,
                          QKVTensor&, void*) {
  fail("paged_attention_cuda: pagedattn was built without CUDA support");
}

void write_kv_cuda(const PagedKVView&, const int32_t*, int32_t, const void*, const void*, DType,
                   void*, const int32_t*) {
  fail("write_kv: pagedattn was built without CUDA support");
}

int cuda_sm_count() { return 0; }

}  // namespace pagedattn

#endif  // PAGEDATTN_HAVE_CUDA
