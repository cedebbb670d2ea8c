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
#include "model/cuda/wgmma_gemm.h"
#include "model/product_check.h"
#endif

namespace {

#ifdef PAGEDATTN_HAVE_CUDA

using namespace pagedattn;

TEST(WgmmaGemmCuda, MatchesDoublePrecisionOnRandomShapes) {
  PA_SKIP_WITHOUT_GPU();
  if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(17);
  for (int trial = 0; trial < 90; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kWgmmaGemmMaxTokens));
    const int N = trial % 6 == 0 ? 128 * (1 + int(g() % 40)) : 1 + int(g() % 900);
    const int K = 8 * (1 + int(g() % (trial % 5 == 0 ? 1200 : 200)));
    const int ldy = N + int(g() % 5);
    const int mode = int(g() % 3);  // f32, f32 accumulated, bf16
    const int version = 1 + int(g() % uint32_t(cuda::kWgmmaGemmVersions));
    SCOPED_TRACE(::testing::Message() << "T " << T << " N " << N << " K " << K << " ldy " << ldy
                                      << " mode " << mode << " version " << version);
    bool same_bits = false;
    auto run = [&](const cuda::GemvArgs& a) { cuda::wgmma_gemm(a, nullptr, version); };
    EXPECT_EQ(test::check_product(g, T, N, K, ldy, mode, run, 2, &same_bits), 0);
    // The K slices are summed in a fixed order: the same bits every call.
    EXPECT_TRUE(same_bits);
  }
}

// gate/up and SwiGLU in one launch: checked against double precision on the bf16-rounded gate
// and up (the unfused path's roundings), with inter not a multiple of the 64-row blocks.
TEST(WgmmaGemmCuda, SwigluMatchesDoublePrecision) {
  PA_SKIP_WITHOUT_GPU();
  if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(23);
  for (int trial = 0; trial < 36; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kWgmmaGemmMaxTokens));
    const int inter = trial % 4 == 0 ? 64 * (1 + int(g() % 30)) : 1 + int(g() % 1500);
    const int K = 8 * (1 + int(g() % 300));
    SCOPED_TRACE(::testing::Message() << "T " << T << " inter " << inter << " K " << K);
    const int version = trial % 3 == 0 ? 0 : 1 + int(g() % uint32_t(cuda::kWgmmaGemmVersions));
    SCOPED_TRACE(::testing::Message() << "version " << version);
    auto run = [=](const cuda::GemvArgs& a) { cuda::wgmma_gemm_swiglu(a, nullptr, version); };
    EXPECT_EQ(test::check_swiglu(g, T, inter, K, run), 0);
  }
}

// Host checks only: no device needed.
TEST(WgmmaGemmCuda, RefusesWhatItCannotTake) {
  cuda::GemvArgs b;
  const cuda::GemvArgs a =
      test::expect_common_refusals(cuda::wgmma_gemm_supported, cuda::kWgmmaGemmMaxTokens, &b);
  // The pick (unless PAGEDATTN_WGMMA_GEMM overrides it): up to 64 tokens on every weight, never
  // where the device cannot run it.
  if (!std::getenv("PAGEDATTN_WGMMA_GEMM")) {
    const bool can = cuda::wgmma_gemm_available();
    EXPECT_EQ(cuda::wgmma_gemm_pick(8, 4096, 4096), can);
    EXPECT_EQ(cuda::wgmma_gemm_pick(cuda::kWgmmaGemmMaxTokens, 4096, 4096), can);
    EXPECT_EQ(cuda::wgmma_gemm_pick(64, 576, 576), can);  // SmolLM2's o
    EXPECT_FALSE(cuda::wgmma_gemm_pick(cuda::kWgmmaGemmMaxTokens + 1, 128256, 4096));
    EXPECT_FALSE(cuda::wgmma_gemm_pick(0, 4096, 4096));
    EXPECT_FALSE(cuda::wgmma_gemm_swiglu_takes(cuda::kWgmmaGemmMaxTokens + 1, 4096, 4096));
    EXPECT_EQ(cuda::wgmma_gemm_swiglu_takes(32, 14336, 4096), can);
  }
  EXPECT_FALSE(cuda::wgmma_gemm_pick(8, 4096, 12));
  test::expect_error_naming([&] { cuda::wgmma_gemm(b, nullptr); }, "wgmma_gemm", "a misaligned x");
  test::expect_error_naming([&] { cuda::wgmma_gemm(a, nullptr, cuda::kWgmmaGemmVersions + 1); },
                            "wgmma_gemm", "an unknown version");
}

#else

TEST(WgmmaGemmCuda, MatchesDoublePrecisionOnRandomShapes) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
