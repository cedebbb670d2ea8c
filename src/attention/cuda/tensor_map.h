// Tensor maps for the bulk tensor copies (TMA) of the Hopper kernels: the attention prefill
// (prefill_hopper.cu) and the decode steps' products (src/model/cuda/wgmma_gemm.cu).
//
// NOTE: the maps are encoded by the driver's cuTensorMapEncodeTiled, reached through
// cudaGetDriverEntryPointByVersion: linking libcuda would make every binary fail to start on a
// machine without a driver (CI), and the runtime hands out the entry point where one exists.
// Host code (C++17, nvcc or the host compiler).
#pragma once

#include <cuda.h>

#include "pagedattn/dtype.h"

namespace pagedattn::cuda {

// Whether the driver's encoder could be reached (false without a driver).
bool tensor_map_encoder_available();

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
