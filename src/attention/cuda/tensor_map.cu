// Tensor-map encoding through the driver entry point (tensor_map.h).
#include <cudaTypedefs.h>

#include <cstdint>
#include <mutex>

#include "tensor_map.h"

namespace pagedattn::cuda {

namespace {

PFN_cuTensorMapEncodeTiled_v12000 encoder() {
  static PFN_cuTensorMapEncodeTiled_v12000 fn = nullptr;
  static std::once_flag once;
  std::call_once(once, [] {
    void* f = nullptr;
    cudaDriverEntryPointQueryResult res{};
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &f, 12000, cudaEnableDefault,
                                         &res) == cudaSuccess &&
        res == cudaDriverEntryPointSuccess)
      fn = reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(f);
    (void)cudaGetLastError();
  });
  return fn;
}

bool encode(CUtensorMap* map, CUtensorMapDataType dt, CUtensorMapSwizzle swizzle, const void* ptr,
            int rank, const cuuint64_t* dims, const cuuint64_t* strides, const cuuint32_t* box) {
  const auto fn = encoder();
  if (!fn || (reinterpret_cast<uintptr_t>(ptr) & 15) != 0) return false;
  const cuuint32_t elem_strides[5] = {1, 1, 1, 1, 1};
  return fn(map, dt, cuuint32_t(rank), const_cast<void*>(ptr), dims, strides, box, elem_strides,
            CU_TENSOR_MAP_INTERLEAVE_NONE, swizzle, CU_TENSOR_MAP_L2_PROMOTION_L2_256B,
            CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE) == CUDA_SUCCESS;
}

}  // namespace

bool tensor_map_encoder_available() { return encoder() != nullptr; }

bool hopper_kernel_runs_here(PerDeviceAnswers& answers,
                             cudaError_t (*attributes)(cudaFuncAttributes*)) {
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || dev >= 64) {
    (void)cudaGetLastError();
    return false;
  }
  const uint64_t bit = uint64_t(1) << dev;
  if (answers.known.load() & bit) return (answers.yes.load() & bit) != 0;
  int major = 0, minor = 0;
  cudaFuncAttributes fa{};
  const bool ok =
      cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess &&
      cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev) == cudaSuccess &&
      major == 9 && minor == 0 && attributes(&fa) == cudaSuccess && fa.binaryVersion == 90 &&
      tensor_map_encoder_available();
  (void)cudaGetLastError();
  if (ok) answers.yes.fetch_or(bit);
  answers.known.fetch_or(bit);
  return ok;
}

bool encode_tensor_map_16bit(CUtensorMap* map, DType t, const void* ptr, int rank,
                             const cuuint64_t* dims, const cuuint64_t* strides,
                             const cuuint32_t* box) {
  if (t != DType::bf16 && t != DType::f16) return false;
  return encode(
      map, t == DType::bf16 ? CU_TENSOR_MAP_DATA_TYPE_BFLOAT16 : CU_TENSOR_MAP_DATA_TYPE_FLOAT16,
      CU_TENSOR_MAP_SWIZZLE_128B, ptr, rank, dims, strides, box);
}

bool encode_tensor_map_u8(CUtensorMap* map, const void* ptr, int rank, const cuuint64_t* dims,
                          const cuuint64_t* strides, const cuuint32_t* box) {
  return encode(map, CU_TENSOR_MAP_DATA_TYPE_UINT8, CU_TENSOR_MAP_SWIZZLE_NONE, ptr, rank, dims,
                strides, box);
}

}  // namespace pagedattn::cuda
