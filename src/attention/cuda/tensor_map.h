// Tensor maps for the bulk tensor copies (TMA) of the Hopper kernels, and whether a device runs
// them: the attention prefill (prefill_hopper.cu) and the decode steps' products
// (src/model/cuda/wgmma_gemm.cu).
//
// NOTE: the maps are encoded by the driver's cuTensorMapEncodeTiled, reached through
// cudaGetDriverEntryPointByVersion: linking libcuda would make every binary fail to start on a
// machine without a driver (CI), and the runtime hands out the entry point where one exists.
// Host code (C++17, nvcc or the host compiler).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <atomic>
#include <cstdint>

#include "pagedattn/dtype.h"

namespace pagedattn::cuda {

// Whether the driver's encoder could be reached (false without a driver).
bool tensor_map_encoder_available();

// Per-device answers (bit d for device d < 64) of hopper_kernel_runs_here; one static per kernel
// family: a process may drive GPUs of several kinds.
struct PerDeviceAnswers {
  std::atomic<uint64_t> known{0}, yes{0};
};
// Whether the current device runs a Hopper kernel that takes tensor maps: compute capability 9.0,
// the kernel's sm_90 image loadable here (`attributes` returns its cudaFuncGetAttributes) and the
// driver's encoder; false without a device. Asked once per device.
bool hopper_kernel_runs_here(PerDeviceAnswers& answers,
                             cudaError_t (*attributes)(cudaFuncAttributes*));

// A 128-byte-swizzled map of 16-bit elements (bf16 or f16): dims[0] is the contiguous one
// (strides in bytes of dims 1..rank-1), box[0] = 64 elements (one 128-byte row of the swizzle
// pattern). False when the encoder is missing, ptr is not 16-byte aligned or the driver refuses.
bool encode_tensor_map_16bit(CUtensorMap* map, DType t, const void* ptr, int rank,
                             const cuuint64_t* dims, const cuuint64_t* strides,
                             const cuuint32_t* box);

// An unswizzled map of bytes (e4m3 pools' staging tiles): box[0] = the row's bytes.
bool encode_tensor_map_u8(CUtensorMap* map, const void* ptr, int rank, const cuuint64_t* dims,
                          const cuuint64_t* strides, const cuuint32_t* box);

}  // namespace pagedattn::cuda
