// The few-token matrix product of decode steps (gemv.h).
#include "gemv.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

namespace pagedattn::cuda {

namespace {

constexpr int kWarps = 8;

// acc += the dot product of 8 bf16 pairs (w, x), in a fixed order.
__device__ __forceinline__ float dot8(const uint4& w, const uint4& x, float acc) {
  const uint32_t ws[4] = {w.x, w.y, w.z, w.w}, xs[4] = {x.x, x.y, x.z, x.w};
#pragma unroll
  for (int i = 0; i < 4; ++i) {
    acc = fmaf(__uint_as_float(ws[i] << 16), __uint_as_float(xs[i] << 16), acc);
    acc = fmaf(__uint_as_float(ws[i] & 0xffff0000u), __uint_as_float(xs[i] & 0xffff0000u), acc);
  }
  return acc;
}

// grid (ceil(N / (kWarps * R))), block kWarps * 32. Warp w of block b owns rows
// (b * kWarps + w) * R ... + R - 1; lane l takes the 16-byte chunks l, l + 32, ... of each.
template <int T, int R>
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWarps + warp) * R;
  if (row0 >= a.N) return;
  const int chunks = a.K / 8;
  const uint4* x4 = reinterpret_cast<const uint4*>(a.x);
  const uint4* w4 = reinterpret_cast<const uint4*>(a.w);
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
  const uint4 zero = make_uint4(0, 0, 0, 0);
#pragma unroll 2
  for (int c = lane; c < chunks; c += 32) {
    uint4 wv[R];
#pragma unroll
    for (int r = 0; r < R; ++r)
      wv[r] = row0 + r < a.N ? __ldcs(w4 + int64_t(row0 + r) * chunks + c) : zero;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const uint4 xv = __ldg(x4 + int64_t(t) * chunks + c);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][t] = dot8(wv[r], xv, acc[r][t]);
    }
  }
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t)
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) acc[r][t] += __shfl_xor_sync(0xffffffffu, acc[r][t], o);
  if (lane != 0) return;
#pragma unroll
  for (int r = 0; r < R; ++r) {
    if (row0 + r >= a.N) break;
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const int64_t at = int64_t(t) * a.ldy + row0 + r;
      if (a.y_bf16) {
        static_cast<uint16_t*>(a.y)[at] = f32_to_bf16(acc[r][t]);
      } else {
        float* y = static_cast<float*>(a.y) + at;
        *y = a.accumulate ? *y + acc[r][t] : acc[r][t];
      }
    }
  }
}

template <int R>
void launch(const GemvArgs& a, cudaStream_t stream) {
  const unsigned grid = unsigned((a.N + kWarps * R - 1) / (kWarps * R));
  switch (a.T) {
#define PA_GEMV_CASE(T)                                                   \
  case T:                                                                 \
    gemv_kernel<T, R><<<grid, kWarps * 32, 0, stream>>>(a);               \
    break;
    PA_GEMV_CASE(1)
    PA_GEMV_CASE(2)
    PA_GEMV_CASE(3)
    PA_GEMV_CASE(4)
    PA_GEMV_CASE(5)
    PA_GEMV_CASE(6)
    PA_GEMV_CASE(7)
    PA_GEMV_CASE(8)
#undef PA_GEMV_CASE
    default:
      break;
  }
}

}  // namespace

bool gemv_supported(const GemvArgs& a) {
  auto aligned = [](const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; };
  return a.T >= 1 && a.T <= kGemvMaxTokens && a.N >= 1 && a.K >= 8 && a.K % 8 == 0 &&
         a.ldy >= a.N && a.x && a.w && a.y && aligned(a.x) && aligned(a.w) &&
         !(a.y_bf16 && a.accumulate);
}

void gemv(const GemvArgs& a, cudaStream_t stream, int rows_per_warp) {
  PA_CHECK(gemv_supported(a), "gemv: unsupported arguments (T ", a.T, ", N ", a.N, ", K ", a.K,
           ", ldy ", a.ldy, ")");
  const int R = rows_per_warp == 0 ? 4 : rows_per_warp;
  PA_CHECK(R == 2 || R == 4, "gemv: rows_per_warp is 2 or 4, got ", R);
  if (R == 2) {
    launch<2>(a, stream);
  } else {
    launch<4>(a, stream);
  }
  const cudaError_t e = cudaGetLastError();
  PA_CHECK(e == cudaSuccess, "gemv: launch failed: ", cudaGetErrorString(e));
}

}  // namespace pagedattn::cuda
