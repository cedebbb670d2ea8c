// Makes a CUDA device current for a scope (a no-op in builds without CUDA).
#pragma once

#include <cstdint>

#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pagedattn::python {

class CudaDeviceGuard {
 public:
  explicit CudaDeviceGuard(int32_t device) {
#ifdef PAGEDATTN_HAVE_CUDA
    if (cudaGetDevice(&previous_) == cudaSuccess && previous_ != device) cudaSetDevice(device);
#else
    (void)device;
#endif
  }
  ~CudaDeviceGuard() {
#ifdef PAGEDATTN_HAVE_CUDA
    if (previous_ >= 0) cudaSetDevice(previous_);
#endif
  }
  CudaDeviceGuard(const CudaDeviceGuard&) = delete;
  CudaDeviceGuard& operator=(const CudaDeviceGuard&) = delete;

 private:
  int previous_ = -1;
};

}  // namespace pagedattn::python
