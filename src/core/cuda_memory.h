// Thin wrappers over the CUDA runtime used by core; without CUDA they throw (or report 0 devices).
#pragma once

#include <cstddef>

namespace pagedattn {
int cuda_device_count();
namespace detail {
void* cuda_malloc(size_t bytes);
void cuda_free(void* p);
void cuda_memset(void* p, int value, size_t bytes);
void cuda_memcpy(void* dst, const void* src, size_t bytes);  // cudaMemcpyDefault
}  // namespace detail
}  // namespace pagedattn
