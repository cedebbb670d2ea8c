// The few-token matrix product of decode steps (gemv.h).
#include <cstdlib>

#include "cuda_common.cuh"  // allow_dependent_launch, wait_for_dependency
#include "gemv.h"
#include "pdl.h"
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
__global__ void __launch_bounds__(kWarps * 32) gemv_kernel(GemvArgs a, bool early) {
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = (blockIdx.x * kWarps + warp) * R;
  const int chunks = a.K / 8;
  const uint4* x4 = reinterpret_cast<const uint4*>(a.x);
  const uint4* w4 = reinterpret_cast<const uint4*>(a.w);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto load_w = [&](int c, uint4 (&wv)[R]) {
#pragma unroll
    for (int r = 0; r < R; ++r)
      wv[r] = row0 + r < a.N ? __ldcs(w4 + int64_t(row0 + r) * chunks + c) : zero;
  };
  // W is no kernel's output: its first loads go out before the kernels ahead have finished.
  uint4 wv[R];
  if (early && row0 < a.N && lane < chunks) load_w(lane, wv);
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  if (row0 >= a.N) return;
  if (!early && lane < chunks) load_w(lane, wv);
  float acc[R][T];
#pragma unroll
  for (int r = 0; r < R; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
  for (int c = lane; c < chunks; c += 32) {
    uint4 next[R];
    const bool more = c + 32 < chunks;
    if (more) load_w(c + 32, next);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const uint4 xv = __ldg(x4 + int64_t(t) * chunks + c);
#pragma unroll
      for (int r = 0; r < R; ++r) acc[r][t] = dot8(wv[r], xv, acc[r][t]);
    }
    if (more) {
#pragma unroll
      for (int r = 0; r < R; ++r) wv[r] = next[r];
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

// grid (ceil(N / R)), block kWarps * 32. Block b owns rows b * R ... b * R + R - 1 and its
// threads split K: thread i takes the 16-byte chunks i, i + 256, ... of every row, so a row's
// loads are spread over the whole block (a warp per row leaves too few bytes in flight on long
// rows). Lanes, then warps, are summed in a fixed order. GLU: W holds 2N rows (gate, then up);
// the block also takes the up rows N + b * R ... and writes silu(gate) * up (gemv_swiglu).
template <int T, int R, bool GLU>
__global__ void __launch_bounds__(kWarps * 32) gemv_split_kernel(GemvArgs a, bool early) {
  constexpr int RR = GLU ? 2 * R : R;  // rows of W a block reads
  constexpr int kStride = kWarps * 32;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int row0 = blockIdx.x * R;
  const int chunks = a.K / 8;
  const uint4* x4 = reinterpret_cast<const uint4*>(a.x);
  const uint4* w4 = reinterpret_cast<const uint4*>(a.w);
  const uint4 zero = make_uint4(0, 0, 0, 0);
  auto load_w = [&](int c, uint4 (&wv)[RR]) {
#pragma unroll
    for (int r = 0; r < RR; ++r) {
      const int rr = r % R, row = (r < R ? 0 : a.N) + row0 + rr;
      wv[r] = row0 + rr < a.N ? __ldcs(w4 + int64_t(row) * chunks + c) : zero;
    }
  };
  // W is no kernel's output: its first loads go out before the kernels ahead have finished.
  const int c0 = int(threadIdx.x);
  uint4 wv[RR];
  if (early && c0 < chunks) load_w(c0, wv);
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  if (!early && c0 < chunks) load_w(c0, wv);
  float acc[RR][T];
#pragma unroll
  for (int r = 0; r < RR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) acc[r][t] = 0.f;
  for (int c = c0; c < chunks; c += kStride) {
    uint4 next[RR];
    const bool more = c + kStride < chunks;
    if (more) load_w(c + kStride, next);
#pragma unroll
    for (int t = 0; t < T; ++t) {
      const uint4 xv = __ldg(x4 + int64_t(t) * chunks + c);
#pragma unroll
      for (int r = 0; r < RR; ++r) acc[r][t] = dot8(wv[r], xv, acc[r][t]);
    }
    if (more) {
#pragma unroll
      for (int r = 0; r < RR; ++r) wv[r] = next[r];
    }
  }
  __shared__ float part[kWarps][RR * T];
#pragma unroll
  for (int r = 0; r < RR; ++r)
#pragma unroll
    for (int t = 0; t < T; ++t) {
      float v = acc[r][t];
#pragma unroll
      for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
      if (lane == 0) part[warp][r * T + t] = v;
    }
  __syncthreads();
  if (threadIdx.x >= R * T) return;
  const int r = threadIdx.x / T, t = threadIdx.x % T;
  if (row0 + r >= a.N) return;
  float v = 0.f;
#pragma unroll
  for (int w = 0; w < kWarps; ++w) v += part[w][threadIdx.x];
  const int64_t at = int64_t(t) * a.ldy + row0 + r;
  if constexpr (GLU) {
    // As the unfused path computes it: gate and up rounded to bf16 (the product's output), then
    // silu(g) * u in f32 (llama_kernels.cu's swiglu), rounded to bf16.
    float u = 0.f;
#pragma unroll
    for (int w = 0; w < kWarps; ++w) u += part[w][R * T + threadIdx.x];
    const float g = bf16_to_f32(f32_to_bf16(v)), ub = bf16_to_f32(f32_to_bf16(u));
    static_cast<uint16_t*>(a.y)[at] = f32_to_bf16(g / (1.f + __expf(-g)) * ub);
  } else if (a.y_bf16) {
    static_cast<uint16_t*>(a.y)[at] = f32_to_bf16(v);
  } else {
    float* y = static_cast<float*>(a.y) + at;
    *y = a.accumulate ? *y + v : v;
  }
}

// Whether W's first loads go out before the kernels ahead have finished (PAGEDATTN_GEMV_EARLY=0:
// after, a comparison).
bool early_w() {
  static const bool on = [] {
    const char* e = std::getenv("PAGEDATTN_GEMV_EARLY");
    return !(e && e[0] == '0');
  }();
  return on;
}

template <int R, bool kSplit>
void launch(const GemvArgs& a, cudaStream_t stream) {
  cudaError_t e = cudaSuccess;
  const int per_block = kSplit ? R : kWarps * R;
  const unsigned grid = unsigned((a.N + per_block - 1) / per_block);
  switch (a.T) {
#define PA_GEMV_CASE(T)                                                 \
  case T:                                                               \
    e = launch_pdl(kSplit ? gemv_split_kernel<T, R, false> : gemv_kernel<T, R>, \
                   dim3(grid), dim3(kWarps * 32), 0, stream, a, early_w());  \
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
  PA_CHECK(e == cudaSuccess, "gemv: launch failed: ", cudaGetErrorString(e));
}

}  // namespace

bool gemv_supported(const GemvArgs& a) { return product_args_ok(a, kGemvMaxTokens); }

int gemv_pick(int32_t T, int32_t N, int32_t K) {
  if (K < 8 || K % 8 != 0) return 0;
  if (T == 1) return N < kGemvWideRows ? 3 : 1;
  if (T == 2) return N < kGemvWideRows ? 3 : 0;
  return 0;
}

bool gemv_swiglu_takes(int32_t T, int32_t inter, int32_t K) {
  return (T == 1 || T == 2) && gemv_pick(T, 2 * inter, K) == 3;
}

void gemv_swiglu(const GemvArgs& a, cudaStream_t stream) {
  PA_CHECK(gemv_supported(a) && a.y_bf16 && !a.accumulate && a.T <= 2, "gemv_swiglu: ",
           "unsupported arguments (T ", a.T, ", N ", a.N, ", K ", a.K, ", ldy ", a.ldy, ")");
  constexpr int R = 4;  // version 3's rows per block
  const dim3 grid(unsigned((a.N + R - 1) / R));
  const cudaError_t e =
      a.T == 1 ? launch_pdl(gemv_split_kernel<1, R, true>, grid, dim3(kWarps * 32), 0, stream, a,
                            early_w())
               : launch_pdl(gemv_split_kernel<2, R, true>, grid, dim3(kWarps * 32), 0, stream, a,
                            early_w());
  PA_CHECK(e == cudaSuccess, "gemv_swiglu: launch failed: ", cudaGetErrorString(e));
}

void gemv(const GemvArgs& a, cudaStream_t stream, int version) {
  PA_CHECK(gemv_supported(a), "gemv: unsupported arguments (T ", a.T, ", N ", a.N, ", K ", a.K,
           ", ldy ", a.ldy, ")");
  switch (version == 0 ? kGemvDefaultVersion : version) {
    case 1: launch<2, false>(a, stream); break;
    case 2: launch<4, false>(a, stream); break;
    case 3: launch<4, true>(a, stream); break;
    case 4: launch<8, true>(a, stream); break;
    default: fail("gemv: version ", version, " (1 to ", kGemvVersions, ")");
  }
  const cudaError_t e = cudaGetLastError();
  PA_CHECK(e == cudaSuccess, "gemv: launch failed: ", cudaGetErrorString(e));
}

}  // namespace pagedattn::cuda
