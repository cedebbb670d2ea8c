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

std::shared_ptr<uint8_t> HostPool::alloc(const std::shared_ptr<HostPool>& pool, size_t bytes) {
  HostPool& m = *pool;
  bytes = std::max<size_t>(bytes, 1);
  uint8_t* p = nullptr;
  size_t capacity = 0;
  {
    std::lock_guard<std::mutex> lock(m.mu_);
    auto it = m.free_.lower_bound(bytes);
    if (it != m.free_.end() && it->first / 2 <= bytes) {
      capacity = it->first;
      p = it->second;
      m.free_.erase(it);
      m.cached_ -= capacity;
    }
  }
  if (!p) {
    capacity = (bytes + kRound - 1) / kRound * kRound;
    p = raw_alloc(capacity, m.device_);
  }
  {
    std::lock_guard<std::mutex> lock(m.mu_);
    m.in_use_ += capacity;
    m.peak_in_use_ = std::max(m.peak_in_use_, m.in_use_);
  }
  return std::shared_ptr<uint8_t>(p, [pool, capacity](uint8_t* q) { pool->give_back(q, capacity); });
}

void HostPool::give_back(uint8_t* p, size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  in_use_ -= capacity;
  free_.emplace(capacity, p);
  cached_ += capacity;
  // NOTE: the largest first: what is kept then serves the most requests.
  while (cached_ > peak_in_use_ && !free_.empty()) {
    auto it = std::prev(free_.end());
    cached_ -= it->first;
    raw_free(it->second, device_);
    free_.erase(it);
  }
}

HostPool::~HostPool() {
  for (auto& [capacity, p] : free_) raw_free(p, device_);
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
