// Host memory and copies for swap (internal to the cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <mutex>
#include <span>
#include <vector>

#include "pagedattn/tensor.h"

namespace pagedattn::kv {

// Host pages for the pages of swapped-out sequences, one pool per cache: each holds one page of
// the cache (every layer's K and V), page-locked when the pools are on a CUDA device (the copies
// then run at the bus rate, and the device reads and writes them in place). Getting page-locked
// memory is slow (the driver pins every page: slower than copying the bytes over the bus), so the
// pool takes it in chunks of several pages as swapping first needs them and keeps them: a page
// given back serves the next swap. The chunks go when the pool and every page it gave out are
// gone; the engine's swap space bounds how many are ever taken.
class HostPool {
 public:
  HostPool(Device pools, size_t page_bytes);
  ~HostPool();
  HostPool(const HostPool&) = delete;
  HostPool& operator=(const HostPool&) = delete;

  size_t page_bytes() const { return page_bytes_; }
  // n pages, given back when the last copy of the result goes. Throws Error (nothing taken) when
  // the memory cannot be had.
  static std::shared_ptr<const std::vector<uint8_t*>> take(const std::shared_ptr<HostPool>& pool,
                                                          size_t n);
  // Takes host memory ahead of the first swap until the pool holds at least `bytes` (whole
  // chunks), so that swapping does not wait for the driver to pin it; stops quietly at the first
  // chunk it cannot have (swaps ask again as they need memory). Returns the pool's bytes.
  size_t reserve(size_t bytes);
  // Bytes of host memory taken so far (chunks).
  size_t reserved_bytes();

 private:
  static constexpr size_t kChunkBytes = size_t(32) << 20;
  // One more chunk of `pages` pages, all free (mu_ held). Throws Error, nothing added, when the
  // memory cannot be had.
  void add_chunk(size_t pages);
  void give_back(const std::vector<uint8_t*>& pages);
  Device device_;
  size_t page_bytes_;
  std::mutex mu_;
  std::vector<uint8_t*> chunks_, free_;
  size_t chunk_bytes_ = 0;  // of every chunk
};

// Copies count blocks of block_bytes each, block i from src[i] to dst[i]. With pools on a CUDA
// device one kernel moves every block (each pointer in device memory or in a HostPool's pages)
// and returns when they are done; on the CPU, memcpy.
void copy_blocks(Device pools, std::span<const void* const> src, std::span<void* const> dst,
                 size_t block_bytes);

}  // namespace pagedattn::kv
