// Host copies for swap, the CUDA side (see host_copy.h): page-locked host memory, and one kernel
// that moves a list of equal-size blocks between pool pages and host memory. One launch instead of
// a cudaMemcpy per page, layer and K/V (thousands for a long sequence of a large model, each
// paying the call's fixed cost); under unified addressing the kernel reads and writes page-locked
// host memory through its host pointer, over the bus.
#include <cuda_runtime.h>

#include <cstdint>
#include <map>
#include <mutex>
#include <utility>
#include <vector>

#include "../host_copy_cuda.h"
#include "pagedattn/error.h"

namespace pagedattn::kv {

namespace {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("swap: ", what, ": ", cudaGetErrorString(e));
}

// One CTA per block: 16-byte words when both ends allow them, bytes otherwise. Each thread has
// kUnroll words in flight (every load before the stores): a read of page-locked host memory
// waits on the bus, about a microsecond.
__global__ void copy_blocks_kernel(const void* const* src, void* const* dst, size_t block_bytes) {
  constexpr int kUnroll = 4;
  const auto* s = static_cast<const uint8_t*>(src[blockIdx.x]);
  auto* d = static_cast<uint8_t*>(dst[blockIdx.x]);
  const bool wide = ((reinterpret_cast<uintptr_t>(s) | reinterpret_cast<uintptr_t>(d) |
                      block_bytes) & 15) == 0;
  if (wide) {
    const auto* s16 = reinterpret_cast<const uint4*>(s);
    auto* d16 = reinterpret_cast<uint4*>(d);
    const size_t words = block_bytes / 16, step = blockDim.x;
    size_t i = threadIdx.x;
    for (; i + (kUnroll - 1) * step < words; i += kUnroll * step) {
      uint4 v[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) v[u] = s16[i + u * step];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) d16[i + u * step] = v[u];
    }
    for (; i < words; i += step) d16[i] = s16[i];
  } else {
    for (size_t i = threadIdx.x; i < block_bytes; i += blockDim.x) d[i] = s[i];
  }
}

}  // namespace

void* cuda_alloc_pinned(size_t bytes) {
  void* p = nullptr;
  check(cudaMallocHost(&p, bytes), "cudaMallocHost");
  return p;
}

void cuda_free_pinned(void* p) { (void)cudaFreeHost(p); }

void cuda_copy_blocks(const void* const* src, void* const* dst, size_t count, size_t block_bytes) {
  // NOTE: the pools' writers run on their own streams; the copy starts after all of them and the
  // call returns after it, so no step reads a page in flight.
  check(cudaDeviceSynchronize(), "before the page copy");
  int device = 0;
  check(cudaGetDevice(&device), "cudaGetDevice");
  // The kernel's pointer table: one device buffer per device, grown when a copy needs more (a
  // cudaMalloc per copy would cost more than a short copy itself).
  static std::mutex mu;
  static std::map<int, std::pair<void**, size_t>> tables;
  std::lock_guard<std::mutex> lock(mu);
  auto& [table, capacity] = tables[device];
  if (capacity < 2 * count) {
    if (table) (void)cudaFree(table);
    table = nullptr;
    capacity = 0;
    check(cudaMalloc(&table, 2 * count * sizeof(void*)), "cudaMalloc of the block table");
    capacity = 2 * count;
  }
  std::vector<void*> ptrs(2 * count);
  for (size_t i = 0; i < count; ++i) {
    ptrs[i] = const_cast<void*>(src[i]);
    ptrs[count + i] = dst[i];
  }
  check(cudaMemcpy(table, ptrs.data(), ptrs.size() * sizeof(void*), cudaMemcpyHostToDevice),
        "upload of the block table");
  const size_t max_grid = 0x7fffffff;
  for (size_t first = 0; first < count; first += max_grid) {
    const unsigned grid = unsigned(count - first < max_grid ? count - first : max_grid);
    copy_blocks_kernel<<<grid, 256>>>(table + first, table + count + first, block_bytes);
    check(cudaGetLastError(), "page copy launch");
  }
  check(cudaDeviceSynchronize(), "page copy");
}

}  // namespace pagedattn::kv
