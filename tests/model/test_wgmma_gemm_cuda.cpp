// The few-dozen-token product on Hopper (model/cuda/wgmma_gemm.h) against a double-precision
// product on the host: random shapes (rows not a multiple of its 128-row blocks, K not a multiple
// of its 64-element stages, every token tile), f32 output, accumulation into f32, bf16 output, a
// row stride wider than N, the same bits twice; gate/up with SwiGLU in one launch; and the
// arguments it refuses.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "gpu_skip.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#ifdef PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "model/cuda/wgmma_gemm.h"
#endif

namespace {

#ifdef PAGEDATTN_HAVE_CUDA

using namespace pagedattn;

TEST(WgmmaGemmCuda, MatchesDoublePrecisionOnRandomShapes) {
  PA_SKIP_WITHOUT_GPU();
  if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(17);
  std::normal_distribution<float> nd(0.f, 1.f);
  int checked = 0;
  for (int trial = 0; trial < 60; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kWgmmaGemmMaxTokens));
    const int N = trial % 6 == 0 ? 128 * (1 + int(g() % 40)) : 1 + int(g() % 900);
    const int K = 8 * (1 + int(g() % (trial % 5 == 0 ? 1200 : 200)));
    const int ldy = N + int(g() % 5);
    const int mode = int(g() % 3);  // f32, f32 accumulated, bf16
    const int version = 1 + int(g() % uint32_t(cuda::kWgmmaGemmVersions));
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
    std::vector<float> got(size_t(T) * ldy), first;
    for (int run = 0; run < 2; ++run) {
      if (mode == 1) {
        cudaMemcpy(dy, y0.data(), y0.size() * 4, cudaMemcpyHostToDevice);
      } else {
        cudaMemset(dy, 0xff, y0.size() * 4);  // NaN: an element never written fails
      }
      cuda::wgmma_gemm(a, nullptr, version);
      ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
      if (mode == 2) {
        std::vector<uint16_t> b(got.size());
        cudaMemcpy(b.data(), dy, b.size() * 2, cudaMemcpyDeviceToHost);
        for (size_t i = 0; i < b.size(); ++i) got[i] = bf16_to_f32(b[i]);
      } else {
        cudaMemcpy(got.data(), dy, got.size() * 4, cudaMemcpyDeviceToHost);
      }
      if (run == 0) first = got;
    }
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
    // The K slices are summed in a fixed order: the same bits every call.
    EXPECT_EQ(std::memcmp(first.data(), got.data(), got.size() * 4), 0);
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
  EXPECT_GT(checked, 10000);
}

// gate/up and SwiGLU in one launch: checked against double precision on the bf16-rounded gate
// and up (the unfused path's roundings), with inter not a multiple of the 64-row blocks.
TEST(WgmmaGemmCuda, SwigluMatchesDoublePrecision) {
  PA_SKIP_WITHOUT_GPU();
  if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(23);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int trial = 0; trial < 24; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kWgmmaGemmMaxTokens));
    const int inter = trial % 4 == 0 ? 64 * (1 + int(g() % 30)) : 1 + int(g() % 1500);
    const int K = 8 * (1 + int(g() % 300));
    SCOPED_TRACE(::testing::Message() << "T " << T << " inter " << inter << " K " << K);
    std::vector<uint16_t> x(size_t(T) * K), w(size_t(2 * inter) * K);
    for (auto& v : x) v = f32_to_bf16(nd(g));
    for (auto& v : w) v = f32_to_bf16(0.1f * nd(g));
    uint16_t *dx = nullptr, *dw = nullptr, *dy = nullptr;
    ASSERT_EQ(cudaMalloc(&dx, x.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dw, w.size() * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, size_t(T) * inter * 2), cudaSuccess);
    cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice);
    cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice);
    cudaMemset(dy, 0xff, size_t(T) * inter * 2);  // NaN: an element never written fails
    cuda::GemvArgs a;
    a.x = dx;
    a.w = dw;
    a.y = dy;
    a.T = T;
    a.N = a.ldy = inter;
    a.K = K;
    a.y_bf16 = true;
    cuda::wgmma_gemm_swiglu(a, nullptr);
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
TEST(WgmmaGemmCuda, RefusesWhatItCannotTake) {
  alignas(16) static uint16_t buf[64];
  cuda::GemvArgs a;
  a.x = buf;
  a.w = buf;
  a.y = buf;
  a.T = 1;
  a.N = 4;
  a.K = 8;
  a.ldy = 4;
  EXPECT_TRUE(cuda::wgmma_gemm_supported(a));
  cuda::GemvArgs b = a;
  b.T = cuda::kWgmmaGemmMaxTokens + 1;
  EXPECT_FALSE(cuda::wgmma_gemm_supported(b));
  b = a;
  b.T = 0;
  EXPECT_FALSE(cuda::wgmma_gemm_supported(b));
  b = a;
  b.K = 12;  // not a multiple of 8
  EXPECT_FALSE(cuda::wgmma_gemm_supported(b));
  b = a;
  b.ldy = 3;
  EXPECT_FALSE(cuda::wgmma_gemm_supported(b));
  b = a;
  b.y_bf16 = b.accumulate = true;
  EXPECT_FALSE(cuda::wgmma_gemm_supported(b));
  b = a;
  b.w = buf + 1;  // misaligned
  EXPECT_FALSE(cuda::wgmma_gemm_supported(b));
  // The pick (unless PAGEDATTN_WGMMA_GEMM overrides it): up to 16 tokens on every weight, 32 on
  // the smaller ones, 64 on the smallest and the largest, never where the device cannot run it.
  if (!std::getenv("PAGEDATTN_WGMMA_GEMM")) {
    const bool can = cuda::wgmma_gemm_available();
    EXPECT_EQ(cuda::wgmma_gemm_pick(8, 4096, 4096), can);
    EXPECT_FALSE(cuda::wgmma_gemm_pick(cuda::kWgmmaGemmPickMaxTokens + 1, 4096, 4096));
    EXPECT_EQ(cuda::wgmma_gemm_pick(64, 576, 576), can);      // SmolLM2's o
    EXPECT_EQ(cuda::wgmma_gemm_pick(64, 128256, 4096), can);  // Llama-3-8B's lm_head
    EXPECT_FALSE(cuda::wgmma_gemm_pick(cuda::kWgmmaGemmMaxTokens + 1, 128256, 4096));
    EXPECT_EQ(cuda::wgmma_gemm_pick(32, 3072, 4096), can);  // one rank of two: qkv
    EXPECT_FALSE(cuda::wgmma_gemm_pick(33, 3072, 4096));
    EXPECT_FALSE(cuda::wgmma_gemm_swiglu_takes(cuda::kWgmmaGemmPickMaxTokens + 1, 4096, 4096));
    EXPECT_EQ(cuda::wgmma_gemm_swiglu_takes(32, 14336, 4096), can);  // 28672 x 4096: large
  }
  EXPECT_FALSE(cuda::wgmma_gemm_pick(8, 4096, 12));
  try {
    cuda::wgmma_gemm(b, nullptr);
    ADD_FAILURE() << "a misaligned W was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wgmma_gemm"), std::string::npos);
  }
  try {
    cuda::wgmma_gemm(a, nullptr, cuda::kWgmmaGemmVersions + 1);
    ADD_FAILURE() << "an unknown version was taken";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("wgmma_gemm"), std::string::npos);
  }
}

#else

TEST(WgmmaGemmCuda, MatchesDoublePrecisionOnRandomShapes) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
