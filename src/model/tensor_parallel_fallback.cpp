// Tensor parallelism in builds without CUDA: every entry point says so.
#ifndef PAGEDATTN_HAVE_CUDA

#include "pagedattn/error.h"
#include "pagedattn/tensor_parallel.h"

namespace pagedattn {

std::unique_ptr<Model> create_tensor_parallel_model(const std::string&,
                                                    const TensorParallelOptions&) {
  fail("tensor parallel: pagedattn was built without CUDA support");
}

int run_tensor_parallel_worker(const TensorParallelOptions&) {
  fail("tensor parallel: pagedattn was built without CUDA support");
}

}  // namespace pagedattn

#endif  // PAGEDATTN_HAVE_CUDA
