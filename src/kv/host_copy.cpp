// Host copies for swap (see host_copy.h): the CPU side, and the CUDA side's stand-ins in a build
// without CUDA.
#include "host_copy.h"

#include <algorithm>
#include <cstdlib>
#include <cstring>

#include "host_copy_cuda.h"

#include "pagedattn/error.h"

namespace pagedattn::kv {

namespace {

uint8_t* raw_alloc(size_t bytes, Device device) {
  if (device == Device::cuda) return static_cast<uint8_t*>(cuda_alloc_pinned(bytes));
  auto* p = static_cast<uint8_t*>(std::malloc(bytes));
  PA_CHECK(p != nullptr, "swap: cannot allocate ", bytes, " bytes of host memory");
  return p;
}

void raw_free(uint8_t* p, Device device) {
  if (device == Device::cuda)
    cuda_free_pinned(p);
  else
    std::free(p);
}

}  // namespace

HostPool::HostPool(Device pools, size_t page_bytes)
    : device_(pools), page_bytes_(std::max<size_t>(page_bytes, 1)) {}

HostPool::~HostPool() {
  for (uint8_t* c : chunks_) raw_free(c, device_);
}

void HostPool::add_chunk(size_t pages) {
  uint8_t* c = raw_alloc(pages * page_bytes_, device_);  // may throw: nothing added
  chunks_.push_back(c);
  chunk_bytes_ += pages * page_bytes_;
  for (size_t i = pages; i-- > 0;) free_.push_back(c + i * page_bytes_);
}

size_t HostPool::reserve(size_t bytes) {
  const size_t per_chunk = std::max<size_t>(1, kChunkBytes / page_bytes_);
  std::lock_guard<std::mutex> lock(mu_);
  try {
    while (chunk_bytes_ < bytes) add_chunk(per_chunk);
  } catch (const Error&) {
    // No more host memory to be had now: swaps will ask again as they need it.
  }
  return chunk_bytes_;
}

size_t HostPool::reserved_bytes() {
  std::lock_guard<std::mutex> lock(mu_);
  return chunk_bytes_;
}

std::shared_ptr<const std::vector<uint8_t*>> HostPool::take(const std::shared_ptr<HostPool>& pool,
                                                           size_t n) {
  HostPool& m = *pool;
  auto pages = std::make_shared<std::vector<uint8_t*>>();
  pages->reserve(n);
  {
    std::lock_guard<std::mutex> lock(m.mu_);
    const size_t per_chunk = std::max<size_t>(1, kChunkBytes / m.page_bytes_);
    while (m.free_.size() < n) m.add_chunk(std::max(per_chunk, n - m.free_.size()));
    pages->assign(m.free_.end() - ptrdiff_t(n), m.free_.end());
    m.free_.resize(m.free_.size() - n);
  }
  return std::shared_ptr<const std::vector<uint8_t*>>(
      pages.get(), [pool, pages](const std::vector<uint8_t*>*) { pool->give_back(*pages); });
}

void HostPool::give_back(const std::vector<uint8_t*>& pages) {
  std::lock_guard<std::mutex> lock(mu_);
  free_.insert(free_.end(), pages.begin(), pages.end());
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
