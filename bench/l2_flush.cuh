// The cold-L2 flush of the CUDA benchmarks (bench attention and the kernel lab): before each timed
// launch, outside the timed region, a memset of twice the L2, then (clean) a read of another twice
// the L2, so that the L2 holds clean lines. After a memset alone the L2 is full of dirty lines whose
// write-back competes with the timed kernel's reads; a model layer runs after GEMMs, which mostly
// read.
#pragma once

#include <cuda_runtime.h>

#include <cstddef>
#include <cstdint>

namespace pagedattn::bench {

// Reads n 16-byte vectors and writes nothing (unless their xor is a magic value). Static: one copy
// per translation unit that includes this header.
static __global__ void l2_read_sweep(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n;
       i += size_t(gridDim.x) * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) *sink = acc;
}

class L2Flush {
 public:
  // Buffers of twice l2_bytes each; check ok() (CUDA errors are returned, not thrown).
  explicit L2Flush(size_t l2_bytes) : bytes_(2 * l2_bytes) {
    err_ = cudaMalloc(&memset_buf_, bytes_);
    if (err_ == cudaSuccess) err_ = cudaMalloc(&read_buf_, bytes_);
    if (err_ == cudaSuccess) err_ = cudaMemset(read_buf_, 0x5a, bytes_);
    if (err_ == cudaSuccess) err_ = cudaMalloc(&sink_, sizeof(unsigned));
  }
  ~L2Flush() {
    cudaFree(memset_buf_);
    cudaFree(read_buf_);
    cudaFree(sink_);
  }
  L2Flush(const L2Flush&) = delete;
  L2Flush& operator=(const L2Flush&) = delete;

  cudaError_t status() const { return err_; }
  // Queues the flush on the default stream; `fill` varies the memset's byte.
  cudaError_t run(int fill, bool clean = true) {
    cudaError_t e = cudaMemsetAsync(memset_buf_, fill & 0xff, bytes_);
    if (e != cudaSuccess || !clean) return e;
    l2_read_sweep<<<1024, 256>>>(static_cast<const uint4*>(read_buf_), bytes_ / 16, sink_);
    return cudaGetLastError();
  }

 private:
  size_t bytes_;
  void* memset_buf_ = nullptr;
  void* read_buf_ = nullptr;
  unsigned* sink_ = nullptr;
  cudaError_t err_ = cudaSuccess;
};

}  // namespace pagedattn::bench
