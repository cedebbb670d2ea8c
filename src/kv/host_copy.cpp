// Host copies for swap (see host_copy.h): the CPU side, and the CUDA side's stand-ins in a build
// without CUDA.
#include "host_copy.h"

#include <cstdlib>
#include <cstring>

#include "host_copy_cuda.h"

#include "pagedattn/error.h"

namespace pagedattn::kv {

std::shared_ptr<uint8_t> alloc_host(size_t bytes, Device pools) {
  if (bytes == 0) bytes = 1;
  if (pools == Device::cuda)
    return std::shared_ptr<uint8_t>(static_cast<uint8_t*>(cuda_alloc_pinned(bytes)),
                                    [](uint8_t* p) { cuda_free_pinned(p); });
  auto* p = static_cast<uint8_t*>(std::malloc(bytes));
  PA_CHECK(p != nullptr, "swap: cannot allocate ", bytes, " bytes of host memory");
  return std::shared_ptr<uint8_t>(p, [](uint8_t* q) { std::free(q); });
}

void copy_blocks(Device pools, std::span<const void* const> src, std::span<void* const> dst,
                 size_t block_bytes) {
  PA_ASSERT(src.size() == dst.size());
  if (src.empty() || block_bytes == 0) return;
  if (pools == Device::cuda) {
    cuda_copy_blocks(src.data(), dst.data(), src.size(), block_bytes);
    return;
  }
  for (size_t i = 0; i < src.size(); ++i) std::memcpy(dst[i], src[i], block_bytes);
}

#ifndef PAGEDATTN_HAVE_CUDA
[[noreturn]] static void no_cuda() { fail("CUDA: pagedattn was built without CUDA support"); }
void* cuda_alloc_pinned(size_t) { no_cuda(); }
void cuda_free_pinned(void*) {}
void cuda_copy_blocks(const void* const*, void* const*, size_t, size_t) { no_cuda(); }
#endif

}  // namespace pagedattn::kv
