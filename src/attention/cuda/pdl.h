// Programmatic dependent launch: a kernel launched with it may be scheduled while the kernel
// before it on the stream is still finishing, so its launch latency hides behind that kernel's
// tail (the decode step of a small model is ~300 kernels of a few microseconds each). Every
// kernel launched this way starts with wait_for_dependency() (cuda_common.cuh), before it touches
// memory, so it sees exactly what a plain launch would; kernels that call
// allow_dependent_launch() let their followers be scheduled early.
// PAGEDATTN_PDL=0 launches everything plainly (a comparison). Host code for .cu files (nvcc).
#pragma once

#include <cuda_runtime.h>

#include <utility>

namespace pagedattn::cuda {

// False when PAGEDATTN_PDL=0 (read once).
bool pdl_enabled();

// cudaLaunchKernelEx's attributes: programmatic stream serialization (off when PAGEDATTN_PDL=0),
// and clusters of x CTAs along the grid's x.
inline cudaLaunchAttribute pdl_attribute() {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeProgrammaticStreamSerialization;
  a.val.programmaticStreamSerializationAllowed = pdl_enabled() ? 1 : 0;
  return a;
}
inline cudaLaunchAttribute cluster_attribute(unsigned x) {
  cudaLaunchAttribute a = {};
  a.id = cudaLaunchAttributeClusterDimension;
  a.val.clusterDim.x = x;
  a.val.clusterDim.y = a.val.clusterDim.z = 1;
  return a;
}

// kernel<<<grid, block, smem, stream>>>(args...) with programmatic stream serialization allowed.
template <typename... Params, typename... Args>
cudaError_t launch_pdl(void (*kernel)(Params...), dim3 grid, dim3 block, size_t smem,
                       cudaStream_t stream, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1] = {pdl_attribute()};
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace pagedattn::cuda
