// Copies between a KV pool's pages and host memory, for swap (internal to the cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <span>

#include "pagedattn/tensor.h"

namespace pagedattn::kv {

// Host memory for the pages of swapped-out sequences, one pool per cache: page-locked when the
// pools are on a CUDA device (the copies then run at the bus rate, and the device reads and
// writes it in place). Getting page-locked memory is slow (the driver pins every page: slower
// than copying the bytes over the bus), so a buffer given back is kept for the next swap: it
// serves any request of at least half its size. The pool keeps at most as many bytes as were in
// use at once (what swapping needs at its peak, which the engine's swap space bounds), and frees
// them when the pool and every buffer it gave out are gone.
class HostPool {
 public:
  explicit HostPool(Device pools) : device_(pools) {}
  // Throws Error when the memory cannot be had.
  static std::shared_ptr<uint8_t> alloc(const std::shared_ptr<HostPool>& pool, size_t bytes);
  ~HostPool();

 private:
  static constexpr size_t kRound = size_t(64) << 10;  // capacities are multiples of this
  void give_back(uint8_t* p, size_t capacity);
  Device device_;
  std::mutex mu_;
  std::multimap<size_t, uint8_t*> free_;  // capacity -> buffer
  size_t cached_ = 0, in_use_ = 0, peak_in_use_ = 0;
};

// Copies count blocks of block_bytes each, block i from src[i] to dst[i]. With pools on a CUDA
// device one kernel moves every block (each pointer in device memory or in alloc_host's memory)
// and returns when they are done; on the CPU, memcpy.
void copy_blocks(Device pools, std::span<const void* const> src, std::span<void* const> dst,
                 size_t block_bytes);

}  // namespace pagedattn::kv
