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
#include "model/cuda/gemv.h"
#include "model/product_check.h"
#endif

namespace {

#ifdef PAGEDATTN_HAVE_CUDA

using namespace pagedattn;

TEST(GemvCuda, MatchesDoublePrecisionOnRandomShapes) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937 g(7);
  for (int trial = 0; trial < 60; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kGemvMaxTokens));
    const int N = 1 + int(g() % 700);
    const int K = 8 * (1 + int(g() % 300));
    const int ldy = N + int(g() % 5);
    const int mode = int(g() % 3);  // f32, f32 accumulated, bf16
    const int version = 1 + int(g() % uint32_t(cuda::kGemvVersions));
    SCOPED_TRACE(::testing::Message() << "T " << T << " N " << N << " K " << K << " ldy " << ldy
                                      << " mode " << mode << " version " << version);
    auto run = [&](const cuda::GemvArgs& a) { cuda::gemv(a, nullptr, version); };
    EXPECT_EQ(test::check_product(g, T, N, K, ldy, mode, run), 0);
  }
}

// gate/up and SwiGLU in one launch: the same bits as the product into bf16 followed by the
// model's swiglu, checked here against double precision on the bf16-rounded gate and up.
TEST(GemvCuda, SwigluMatchesDoublePrecision) {
  PA_SKIP_WITHOUT_GPU();
  std::mt19937 g(11);
  for (int trial = 0; trial < 20; ++trial) {
    const int T = 1 + int(g() % 2);
    const int inter = 1 + int(g() % 1500);
    const int K = 8 * (1 + int(g() % 200));
    SCOPED_TRACE(::testing::Message() << "T " << T << " inter " << inter << " K " << K);
    ASSERT_TRUE(cuda::gemv_swiglu_takes(T, inter, K));
    auto run = [](const cuda::GemvArgs& a) { cuda::gemv_swiglu(a, nullptr); };
    EXPECT_EQ(test::check_swiglu(g, T, inter, K, run), 0);
  }
}

// Host checks only: no device needed.
TEST(GemvCuda, RefusesWhatItCannotTake) {
  cuda::GemvArgs b;
  test::expect_common_refusals(cuda::gemv_supported, cuda::kGemvMaxTokens, &b);
  // The pick takes gemv only at one or two tokens.
  EXPECT_EQ(cuda::gemv_pick(4, 4096, 4096), 0);
  EXPECT_EQ(cuda::gemv_pick(1, 4096, 12), 0);
  EXPECT_NE(cuda::gemv_pick(1, 576, 576), 0);
  EXPECT_FALSE(cuda::gemv_swiglu_takes(3, 1536, 576));
  EXPECT_FALSE(cuda::gemv_swiglu_takes(1, 14336, 4096));  // 28672 rows: version 1's
  EXPECT_TRUE(cuda::gemv_swiglu_takes(1, 1536, 576));
  test::expect_error_naming([&] { cuda::gemv(b, nullptr); }, "gemv", "a misaligned x");
}

#else

TEST(GemvCuda, MatchesDoublePrecisionOnRandomShapes) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
