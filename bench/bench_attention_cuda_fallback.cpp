// bench_attention_cuda in builds without the CUDA backend (or without its benchmark).
#include "bench_attention.h"
#include "pagedattn/error.h"

namespace pagedattn::bench {

int bench_attention_cuda(const BenchAttentionArgs&) {
  fail("bench attention: --device cuda is not available: pagedattn was built without CUDA");
}

}  // namespace pagedattn::bench
