#include "cuda_memory.h"

#include "pagedattn/error.h"

#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace pagedattn {

#ifdef PAGEDATTN_HAVE_CUDA
int cuda_device_count() {
  // NOTE: without a driver cudaGetDeviceCount returns an error, not 0: any error means no device.
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}
namespace detail {
static void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail(what, ": ", cudaGetErrorString(e));
}
void* cuda_malloc(size_t bytes) {
  void* p = nullptr;
  check(cudaMalloc(&p, bytes), "cudaMalloc");
  return p;
}
void cuda_free(void* p) { (void)cudaFree(p); }
void cuda_memset(void* p, int value, size_t bytes) { check(cudaMemset(p, value, bytes), "cudaMemset"); }
void cuda_memcpy(void* dst, const void* src, size_t bytes) {
  check(cudaMemcpy(dst, src, bytes, cudaMemcpyDefault), "cudaMemcpy");
}
}  // namespace detail
#else
int cuda_device_count() { return 0; }
namespace detail {
[[noreturn]] static void no_cuda() { fail("CUDA: pagedattn was built without CUDA support"); }
void* cuda_malloc(size_t) { no_cuda(); }
void cuda_free(void*) {}
void cuda_memset(void*, int, size_t) { no_cuda(); }
void cuda_memcpy(void*, const void*, size_t) { no_cuda(); }
}  // namespace detail
#endif

}  // namespace pagedattn
