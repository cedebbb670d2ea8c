// The tensor-core prefill kernel (not yet written: every query row runs the decode kernel).
#include "kernels.h"
#include "pagedattn/error.h"

namespace pagedattn::cuda {

bool prefill_supported(DType, DType, int) { return false; }

void launch_prefill(const AttentionParams&, DType, DType, int, cudaStream_t) {
  fail("paged_attention_cuda: the tensor-core prefill kernel is not available");
}

}  // namespace pagedattn::cuda
