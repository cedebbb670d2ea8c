// The CUDA side of host_copy.h (cuda/host_copy.cu, C++17 like every CUDA source; without CUDA
// they throw).
#pragma once

#include <cstddef>

namespace pagedattn::kv {

void* cuda_alloc_pinned(size_t bytes);
void cuda_free_pinned(void* p);
void cuda_copy_blocks(const void* const* src, void* const* dst, size_t count, size_t block_bytes);

}  // namespace pagedattn::kv
