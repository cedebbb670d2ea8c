// The few-token product of decode steps (model/cuda/gemv.h) against a double-precision product on
// the host: random shapes, every token count it takes, f32 output, accumulation into f32, bf16
// output, a row stride wider than N; and the arguments it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <random>

#include "gpu_skip.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/gemv.h"
#endif

namespace {

#ifdef PAGEDATTN_HAVE_CUDA

using namespace pagedattn;

TEST(GemvCuda, MatchesDoublePrecisionOnRandomShapes) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937 g(7);
  std::normal_distribution<float> nd(0.f, 1.f);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kGemvMaxTokens));
    const int N = 1 + int(g() % 700);
    const int K = 8 * (1 + int(g() % 300));
    const int ldy = N + int(g() % 5);
    const int mode = int(g() % 3);  // f32, f32 accumulated, bf16
    const int version = 1 + int(g() % uint32_t(cuda::kGemvVersions));
    SCOPED_TRACE(::testing::Message() << "T " << T << " N " << N << " K " << K << " ldy " << ldy
                                      << " mode " << mode << " version " << version);
    std::vector<uint16_t> x(size_t(T) * K), w(size_t(N) * K);
    for (auto& v : x) v = f32_to_bf16(nd(g));
    for (auto& v : w) v = f32_to_bf16(0.1f * nd(g));
    std::vector<float> y0(size_t(T) * ldy);
    for (auto& v : y0) v = nd(g);
    uint16_t *dx = nullptr, *dw = nullptr;
    void* dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, w.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, y0.size() * 4), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
    if (mode == 1) {
      cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice);
    } else {
      cudaMemset(dy, 0xff, y0.size() * 4);  // NaN: an element never written fails
    }
    cuda::GemvArgs a;
    a.x = dx;
    a.w = dw;
    a.y = dy;
    a.T = T;
    a.N = N;
    a.K = K;
    a.ldy = ldy;
    a.y_bf16 = mode == 2;
    a.accumulate = mode == 1;
    cuda::gemv(a, nullptr, version);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<float> got(size_t(T) * ldy);
    if (mode == 2) {
      std::vector<uint16_t> b(got.size());
      cudaMemcpy(b.data(), dy, b.size() * 2, cudaMemcpyDeviceToHost);
      for (size_t i = 0; i < b.size(); ++i) got[i] = bf16_to_f32(b[i]);
    } else {
      cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost);
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
    int bad = 0;
    for (int t = 0; t < T; ++t) {
      for (int n = 0; n < N; ++n) {
        double want = mode == 1 ? double(y0[size_t(t) * ldy + n]) : 0.0;
        for (int k = 0; k < K; ++k)
          want += double(bf16_to_f32(x[size_t(t) * K + k])) * bf16_to_f32(w[size_t(n) * K + k]);
        const double tol = mode == 2 ? 8e-3 * std::abs(want) + 1e-3 : 1e-4 * (1 + std::abs(want));
        if (!(std::abs(double(got[size_t(t) * ldy + n]) - want) <= tol)) ++bad;
        ++checked;
      }
      // The stride's gap past N is never touched.
      for (int n = N; n < ldy && mode != 2; ++n) {
        const float v = got[size_t(t) * ldy + n];
        if (mode == 1 ? v != y0[size_t(t) * ldy + n] : !std::isnan(v)) ++bad;
      }
    }
    EXPECT_EQ(bad, 0);
  }
  EXPECT_GT(checked, 1000);
}

// gate/up and SwiGLU in one launch: the same bits as the product into bf16 followed by the
// model's swiglu, checked here against double precision on the bf16-rounded gate and up.
TEST(GemvCuda, SwigluMatchesDoublePrecision) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937 g(11);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int trial = 0; trial < 20; ++trial) {
    const int T = 1 + int(g() % 2);
    const int inter = 1 + int(g() % 1500);
    const int K = 8 * (1 + int(g() % 200));
    SCOPED_TRACE(::testing::Message() << "T " << T << " inter " << inter << " K " << K);
    ASSERT_TRUE(cuda::gemv_swiglu_takes(T, inter, K));
    std::vector<uint16_t> x(size_t(T) * K), w(size_t(2 * inter) * K);
    for (auto& v : x) v = f32_to_bf16(nd(g));
    for (auto& v : w) v = f32_to_bf16(0.1f * nd(g));
    uint16_t *dx = nullptr, *dw = nullptr, *dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, w.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, size_t(T) * inter * 2), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
    cudaMemset(dy, 0xff, size_t(T) * inter * 2);
    cuda::GemvArgs a;
    a.x = dx;
    a.w = dw;
    a.y = dy;
    a.T = T;
    a.N = a.ldy = inter;
    a.K = K;
    a.y_bf16 = true;
    cuda::gemv_swiglu(a, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<uint16_t> got(size_t(T) * inter);
    cudaMemcpy(got.data(), dy, got.size() * 2, cudaMemcpyDeviceToHost);
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
    int bad = 0;
    for (int t = 0; t < T; ++t) {
      for (int j = 0; j < inter; ++j) {
        double gs = 0, us = 0;
        for (int k = 0; k < K; ++k) {
          const double xv = bf16_to_f32(x[size_t(t) * K + k]);
          gs += xv * bf16_to_f32(w[size_t(j) * K + k]);
          us += xv * bf16_to_f32(w[size_t(inter + j) * K + k]);
        }
        const double gb = bf16_to_f32(f32_to_bf16(float(gs)));
        const double ub = bf16_to_f32(f32_to_bf16(float(us)));
        const double want = gb / (1 + std::exp(-gb)) * ub;
        const double v = bf16_to_f32(got[size_t(t) * inter + j]);
        // bf16 output (half a step) plus a gate or up sum one bf16 step off after rounding.
        if (!(std::abs(v - want) <= 2e-2 * std::abs(want) + 2e-3 * (1 + std::abs(ub)))) ++bad;
      }
    }
    EXPECT_EQ(bad, 0);
  }
}

// Host checks only: no device needed.
TEST(GemvCuda, RefusesWhatItCannotTake) {
  alignas(16) static uint16_t buf[64];
  cuda::GemvArgs a;
  a.x = buf;
  a.w = buf;
  a.y = buf;
  a.T = 1;
  a.N = 4;
  a.K = 8;
  a.ldy = 4;
  EXPECT_TRUE(cuda::gemv_supported(a));
  cuda::GemvArgs b = a;
  b.T = cuda::kGemvMaxTokens + 1;
  EXPECT_FALSE(cuda::gemv_supported(b));
  b = a;
  b.K = 12;  // not a multiple of 8
  EXPECT_FALSE(cuda::gemv_supported(b));
  b = a;
  b.ldy = 3;
  EXPECT_FALSE(cuda::gemv_supported(b));
  b = a;
  b.y_bf16 = b.accumulate = true;
  EXPECT_FALSE(cuda::gemv_supported(b));
  b = a;
  b.x = buf + 1;  // misaligned
  EXPECT_FALSE(cuda::gemv_supported(b));
  // The pick takes gemv only at one or two tokens.
  EXPECT_EQ(cuda::gemv_pick(4, 4096, 4096), 0);
  EXPECT_EQ(cuda::gemv_pick(1, 4096, 12), 0);
  EXPECT_NE(cuda::gemv_pick(1, 576, 576), 0);
  EXPECT_FALSE(cuda::gemv_swiglu_takes(3, 1536, 576));
  EXPECT_FALSE(cuda::gemv_swiglu_takes(1, 14336, 4096));  // 28672 rows: version 1's
  EXPECT_TRUE(cuda::gemv_swiglu_takes(1, 1536, 576));
  try {
    cuda::gemv(b, nullptr);
    ADD_FAILURE() << "a misaligned x was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("gemv"), std::string::npos);
  }
}

#else

TEST(GemvCuda, MatchesDoublePrecisionOnRandomShapes) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
