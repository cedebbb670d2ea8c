// The kernel lab's check of the skinny GEMM of decode steps (skinny_gemm.h, its default
// configuration) against a double-precision product on the host: every element, for f32 output,
// accumulation into f32 Y and bf16 output, over token counts around the kernel's 16-token tiles and
// shapes with and without a K split.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "gpu_skip.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

#if PAGEDATTN_HAVE_CUDA
#include <cuda_runtime.h>

#include "skinny_gemm.h"

using namespace pagedattn;

namespace {

template <class T>
T* device_copy(const std::vector<T>& v) {
  void* p = nullptr;
  EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(v.size(), 1) * sizeof(T)), cudaSuccess);
  EXPECT_EQ(cudaMemcpy(p, v.data(), v.size() * sizeof(T), cudaMemcpyHostToDevice), cudaSuccess);
  return static_cast<T*>(p);
}

// Worst |got - ref| / (sum_k |x w| + |y0|) over every element, beyond bf16 output rounding.
double worst_error(int T, int N, int K, bool y_bf16, bool accumulate, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> nd(0.f, 1.f);
  std::vector<uint16_t> x(size_t(T) * K), w(size_t(N) * K);
  for (auto& v : x) v = f32_to_bf16(nd(rng));
  for (auto& v : w) v = f32_to_bf16(0.05f * nd(rng));
  std::vector<float> y0(size_t(T) * N);
  for (auto& v : y0) v = accumulate ? nd(rng) : NAN;  // NaN: an unwritten element shows
  int dev = 0, sms = 0;
  cudaGetDevice(&dev);
  cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, dev);
  const cuda::SkinnyPlan plan = cuda::skinny_gemm_plan(N, K, sms);
  cuda::SkinnyArgs a;
  a.x = device_copy(x);
  a.w = device_copy(w);
  a.y = device_copy(y0);
  a.T = T;
  a.N = N;
  a.K = K;
  a.y_bf16 = y_bf16;
  a.accumulate = accumulate;
  a.partial = device_copy(std::vector<float>(plan.partial_floats(T, N)));
  a.counters = device_copy(std::vector<unsigned>(size_t(plan.counters())));
  cuda::skinny_gemm(a, plan, nullptr);
  // Twice: the counters must be back at zero for the second launch to be right.
  if (!accumulate) cuda::skinny_gemm(a, plan, nullptr);
  EXPECT_EQ(cudaDeviceSynchronize(), cudaSuccess);
  std::vector<float> got(y0.size());
  if (y_bf16) {
    std::vector<uint16_t> g16(y0.size());
    cudaMemcpy(g16.data(), a.y, g16.size() * 2, cudaMemcpyDeviceToHost);
    for (size_t i = 0; i < got.size(); ++i) got[i] = bf16_to_f32(g16[i]);
  } else {
    cudaMemcpy(got.data(), a.y, got.size() * 4, cudaMemcpyDeviceToHost);
  }
  cudaFree(const_cast<uint16_t*>(a.x));
  cudaFree(const_cast<uint16_t*>(a.w));
  cudaFree(a.y);
  cudaFree(a.partial);
  cudaFree(a.counters);
  double worst = 0;
  for (int t = 0; t < T; ++t)
    for (int n = 0; n < N; ++n) {
      double ref = 0, mag = 0;
      for (int k = 0; k < K; ++k) {
        const double p =
            double(bf16_to_f32(x[size_t(t) * K + k])) * bf16_to_f32(w[size_t(n) * K + k]);
        ref += p;
        mag += std::fabs(p);
      }
      const size_t i = size_t(t) * N + n;
      if (accumulate) ref += y0[i], mag += std::fabs(y0[i]);
      if (std::isnan(got[i])) return INFINITY;
      // bf16 output: its rounding (at most 2^-8 of |ref| relative) is allowed on top.
      const double rounding = y_bf16 ? std::fabs(ref) / 256.0 : 0.0;
      worst = std::max(worst, std::max(0.0, std::fabs(got[i] - ref) - rounding) / (mag + 1e-30));
    }
  return worst;
}

}  // namespace

TEST(SkinnyGemm, MatchesDoubleReference) {
  PA_SKIP_WITHOUT_GPU();
  // (N, K): one tile with a ragged edge; many tiles; a K split (few tiles, long K); a K that is
  // not a multiple of the 64-wide k-block.
  const int shapes[][2] = {{136, 200}, {1000, 1536}, {512, 14336}, {300, 4104}};
  for (const auto& nk : shapes)
    for (int T : {1, 7, 16, 17, 33, 64})
      for (int mode = 0; mode < 3; ++mode) {
        const double e = worst_error(T, nk[0], nk[1], mode == 2, mode == 1, uint64_t(T + nk[0]));
        // f32 sums stay near sqrt(K) 2^-24 of sum |x w|; a lost 8-wide chunk is ~8 / K of it.
        EXPECT_LE(e, 2e-6) << "T " << T << " N " << nk[0] << " K " << nk[1] << " mode " << mode;
      }
}

TEST(SkinnyGemm, RejectsShapesItCannotRun) {
  // Checked before anything touches the device: runs without a GPU too.
  const cuda::SkinnyPlan plan;
  cuda::SkinnyArgs a;
  a.T = 65;
  a.N = 16;
  a.K = 64;
  EXPECT_THROW(
      {
        try {
          cuda::skinny_gemm(a, plan, nullptr);
        } catch (const Error& e) {
          EXPECT_NE(std::string(e.what()).find("T = 65"), std::string::npos) << e.what();
          throw;
        }
      },
      Error);
  a.T = 4;
  a.K = 100;  // not a multiple of 8
  EXPECT_THROW(cuda::skinny_gemm(a, plan, nullptr), Error);
  a.K = 64;
  a.y_bf16 = true;
  a.accumulate = true;
  EXPECT_THROW(cuda::skinny_gemm(a, plan, nullptr), Error);
}

#endif  // PAGEDATTN_HAVE_CUDA
