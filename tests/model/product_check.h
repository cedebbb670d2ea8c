// The decode products' GPU tests (gemv, wgmma_gemm): random bf16 operands on the device, the
// product launched by the caller, every output checked against a double-precision product on the
// host. Needs a CUDA build (the callers include it under PAGEDATTN_HAVE_CUDA).
#pragma once

#include <cuda_runtime.h>
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "model/cuda/gemv.h"  // GemvArgs
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

namespace pagedattn::test {

// Device copies of random x [T, K] (normal) and W [rows, K] (0.1 normal) and a y buffer of
// y_floats f32; freed with the object.
struct DeviceOperands {
  std::vector<uint16_t> x, w;
  uint16_t *dx = nullptr, *dw = nullptr;
  void* dy = nullptr;
  DeviceOperands(std::mt19937& g, int T, int rows, int K, size_t y_floats) {
    std::normal_distribution<float> nd(0.f, 1.f);
    x.resize(size_t(T) * K);
    w.resize(size_t(rows) * K);
    for (auto& v : x) v = f32_to_bf16(nd(g));
    for (auto& v : w) v = f32_to_bf16(0.1f * nd(g));
    EXPECT_EQ(cudaMalloc(&dx, x.size() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&dw, w.size() * 2), cudaSuccess);
    EXPECT_EQ(cudaMalloc(&dy, y_floats * 4), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
  }
  ~DeviceOperands() {
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
  }
  DeviceOperands(const DeviceOperands&) = delete;
  DeviceOperands& operator=(const DeviceOperands&) = delete;
  // x[t] . W[row] in double precision.
  double dot(int t, int row, int K) const {
    double s = 0;
    for (int k = 0; k < K; ++k)
      s += double(bf16_to_f32(x[size_t(t) * K + k])) * bf16_to_f32(w[size_t(row) * K + k]);
    return s;
  }
};

// y [T, ldy] = x W^T (mode 0: f32, poisoned with NaN first; 1: f32 added onto random values; 2:
// bf16), run `runs` times through launch(args). Returns the outputs off the double product, plus
// any element of the stride's gap past N that was touched; *same_bits says whether every run gave
// the same bits.
inline int check_product(std::mt19937& g, int T, int N, int K, int ldy, int mode,
                         const std::function<void(const cuda::GemvArgs&)>& launch, int runs = 1,
                         bool* same_bits = nullptr) {
  DeviceOperands d(g, T, N, K, size_t(T) * ldy);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<float> y0(size_t(T) * ldy);
  for (auto& v : y0) v = nd(g);
  cuda::GemvArgs a = cuda::product_args(d.dx, d.dw, d.dy, T, N, K, ldy);
  a.y_bf16 = mode == 2;
  a.accumulate = mode == 1;
  std::vector<float> got(y0.size()), first;
  if (same_bits) *same_bits = true;
  for (int run = 0; run < runs; ++run) {
    if (mode == 1) {
      cudaMemcpy(d.dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice);
    } else {
      cudaMemset(d.dy, 0xff, y0.size() * 4);  // NaN: an element never written fails
    }
    launch(a);
    EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    if (mode == 2) {
      std::vector<uint16_t> b(got.size());
      cudaMemcpy(b.data(), d.dy, b.size() * 2, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < b.size(); ++i) got[i] = bf16_to_f32(b[i]);
    } else {
      cudaMemcpy(got.data(), d.dy, got.size() * 4, cudaMemcpyDeviceToHost);
    }
    if (run == 0) first = got;
    if (same_bits && std::memcmp(first.data(), got.data(), got.size() * 4) != 0)
      *same_bits = false;
  }
  int bad = 0;
  for (int t = 0; t < T; ++t) {
    for (int n = 0; n < N; ++n) {
      const double want = (mode == 1 ? double(y0[size_t(t) * ldy + n]) : 0.0) + d.dot(t, n, K);
      const double tol = mode == 2 ? 8e-3 * std::abs(want) + 1e-3 : 1e-4 * (1 + std::abs(want));
      if (!(std::abs(double(got[size_t(t) * ldy + n]) - want) <= tol)) ++bad;
    }
    for (int n = N; n < ldy && mode != 2; ++n) {
      const float v = got[size_t(t) * ldy + n];
      if (mode == 1 ? v != y0[size_t(t) * ldy + n] : !std::isnan(v)) ++bad;
    }
  }
  return bad;
}

// y [T, inter] bf16 = silu(g) * u, g and u the products with W's rows [0, inter) and
// [inter, 2 inter), run through launch(args). Returns the outputs off the double products rounded
// to bf16 as the unfused path rounds them.
inline int check_swiglu(std::mt19937& g, int T, int inter, int K,
                        const std::function<void(const cuda::GemvArgs&)>& launch) {
  DeviceOperands d(g, T, 2 * inter, K, size_t(T) * inter / 2 + 1);
  cudaMemset(d.dy, 0xff, size_t(T) * inter * 2);  // NaN: an element never written fails
  cuda::GemvArgs a = cuda::product_args(d.dx, d.dw, d.dy, T, inter, K, inter);
  a.y_bf16 = true;
  launch(a);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<uint16_t> got(size_t(T) * inter);
  cudaMemcpy(got.data(), d.dy, got.size() * 2, cudaMemcpyDeviceToHost);
  int bad = 0;
  for (int t = 0; t < T; ++t) {
    for (int j = 0; j < inter; ++j) {
      const double gb = bf16_to_f32(f32_to_bf16(float(d.dot(t, j, K))));
      const double ub = bf16_to_f32(f32_to_bf16(float(d.dot(t, inter + j, K))));
      const double want = gb / (1 + std::exp(-gb)) * ub;
      const double v = bf16_to_f32(got[size_t(t) * inter + j]);
      // bf16 output (half a step) plus a gate or up sum one bf16 step off after rounding.
      if (!(std::abs(v - want) <= 2e-2 * std::abs(want) + 2e-3 * (1 + std::abs(ub)))) ++bad;
    }
  }
  return bad;
}

// The argument checks both products share (host only): a valid product of T = 1 is taken; T past
// max_tokens or 0, K not a multiple of 8, ldy < N, a bf16 output accumulated into, a misaligned x
// or W are not. Returns the valid arguments and, in *misaligned, ones the launch must refuse.
// That run() throws an Error whose message names `name` (what: the case, in a failure).
inline void expect_error_naming(const std::function<void()>& run, const char* name,
                                const char* what) {
  try {
    run();
    ADD_FAILURE() << what << " was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(name), std::string::npos) << what << ": " << e.what();
  }
}

inline cuda::GemvArgs expect_common_refusals(
    const std::function<bool(const cuda::GemvArgs&)>& takes, int max_tokens,
    cuda::GemvArgs* misaligned) {
  alignas(16) static uint16_t buf[64];
  const cuda::GemvArgs a = cuda::product_args(buf, buf, buf, 1, 4, 8, 4);
  EXPECT_TRUE(takes(a));
  auto refused = [&](auto edit, const char* what) {
    cuda::GemvArgs b = a;
    edit(b);
    EXPECT_FALSE(takes(b)) << what;
    return b;
  };
  refused([&](cuda::GemvArgs& b) { b.T = max_tokens + 1; }, "T past the most tokens");
  refused([](cuda::GemvArgs& b) { b.T = 0; }, "T = 0");
  refused([](cuda::GemvArgs& b) { b.K = 12; }, "K not a multiple of 8");
  refused([](cuda::GemvArgs& b) { b.ldy = 3; }, "ldy < N");
  refused([](cuda::GemvArgs& b) { b.y_bf16 = b.accumulate = true; }, "bf16 accumulated into");
  refused([](cuda::GemvArgs& b) { b.w = buf + 1; }, "misaligned W");
  *misaligned = refused([](cuda::GemvArgs& b) { b.x = buf + 1; }, "misaligned x");
  return a;
}

}  // namespace pagedattn::test
