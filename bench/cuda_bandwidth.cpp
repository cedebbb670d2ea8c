// measure_copy_bandwidth: host code over the CUDA runtime API (no kernels), so a plain .cpp that
// builds with and without CUDA.
#include "cuda_bandwidth.h"

#include <algorithm>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/tensor.h"

#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pagedattn::bench {

#ifdef PAGEDATTN_HAVE_CUDA

namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("copy bandwidth: ", what, ": ", cudaGetErrorString(e));
}

}  // namespace

CopyBandwidth measure_copy_bandwidth(size_t bytes, int iters) {
  PA_CHECK(cuda_device_count() > 0, "copy bandwidth: no usable CUDA device");
  PA_CHECK(bytes > 0 && iters > 0, "copy bandwidth: bytes and iters must be positive");
  CopyBandwidth r;
  r.bytes = bytes;
  int dev = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  cudaDeviceProp prop{};
  ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  r.device = prop.name;
  // NOTE: both buffers are far larger than L2 (50 MB on an H100), so every copy reads and writes
  // device memory; the source is set once so no page is left untouched.
  const Tensor src = Tensor::empty({int64_t(bytes)}, DType::fp8_e4m3, Device::cuda);
  Tensor dst = Tensor::empty({int64_t(bytes)}, DType::fp8_e4m3, Device::cuda);
  ck(cudaMemset(const_cast<void*>(src.data()), 0x5a, bytes), "cudaMemset");
  cudaEvent_t a = nullptr, b = nullptr;
  ck(cudaEventCreate(&a), "cudaEventCreate");
  ck(cudaEventCreate(&b), "cudaEventCreate");
  std::vector<double> us;
  for (int i = -2; i < iters; ++i) {  // two warm-up copies
    ck(cudaEventRecord(a), "cudaEventRecord");
    ck(cudaMemcpyAsync(dst.data(), src.data(), bytes, cudaMemcpyDeviceToDevice), "copy");
    ck(cudaEventRecord(b), "cudaEventRecord");
    ck(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    if (i >= 0) us.push_back(double(ms) * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(us.begin(), us.end());
  r.median_us = us[us.size() / 2];
  r.gbps = 2.0 * double(bytes) / r.median_us / 1e3;
  return r;
}

#else

CopyBandwidth measure_copy_bandwidth(size_t, int) {
  fail("copy bandwidth: pagedattn was built without CUDA");
}

#endif

}  // namespace pagedattn::bench
