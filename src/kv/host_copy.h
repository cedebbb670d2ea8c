// Copies between a KV pool's pages and host memory, for swap (internal to the cache).
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>

#include "pagedattn/tensor.h"

namespace pagedattn::kv {

// Host memory for the pages of a swapped-out sequence: page-locked when the pools are on a CUDA
// device (the copies then run at the bus rate, and the device reads and writes it in place).
// Throws Error when it cannot be had.
std::shared_ptr<uint8_t> alloc_host(size_t bytes, Device pools);

// Copies count blocks of block_bytes each, block i from src[i] to dst[i]. With pools on a CUDA
// device one kernel moves every block (each pointer in device memory or in alloc_host's memory)
// and returns when they are done; on the CPU, memcpy.
void copy_blocks(Device pools, std::span<const void* const> src, std::span<void* const> dst,
                 size_t block_bytes);

}  // namespace pagedattn::kv
