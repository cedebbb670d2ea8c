// The few-dozen-token product on Hopper (model/cuda/wgmma_gemm.h) against a double-precision
// product on the host: random shapes (rows not a multiple of its 128-row blocks, K not a multiple
// of its 64-element stages, every token tile), f32 output, accumulation into f32, bf16 output, a
// row stride wider than N, the same bits twice; gate/up with SwiGLU in one launch; the greedy
// lm_head's argmax without logits, over the whole vocabulary and a rank's slice of it; the qkv
// product ending in qkv_post's work; and the arguments they refuse.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <random>

#include "gpu_skip.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#ifdef PAGEDATTN_HAVE_CUDA
#include "model/cuda/llama_kernels.h"
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

// A folded RMSNorm (NormFold) through two products, as a decode step runs it: the producer
// h = h0 + x W1^T also writes bf16(h * g) and h's sums of squares per 64 rows; the consumer
// y = r (bf16(h * g) W2^T), r = rsqrt(mean(h^2) + eps), as f32 and through SwiGLU. Each checked
// against double precision on the host from the device's own intermediate values (poisoned
// first), for random versions, token counts and widths not a multiple of 64.
TEST(WgmmaGemmCuda, FoldedNormMatchesDoublePrecision) {
  PA_SKIP_WITHOUT_GPU();
  if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(29);
  std::normal_distribution<float> nd(0.f, 1.f);
  for (int trial = 0; trial < 30; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kWgmmaGemmMaxTokens));
    const int H = 8 * (1 + int(g() % (trial % 3 == 0 ? 600 : 100)));  // hidden: N1 = K2
    const int K1 = 8 * (1 + int(g() % 200)), N2 = 1 + int(g() % 700);
    const int v1 = 1 + int(g() % uint32_t(cuda::kWgmmaGemmVersions));
    const int v2 = 1 + int(g() % uint32_t(cuda::kWgmmaGemmVersions));
    const bool glu = trial % 2 == 1;
    SCOPED_TRACE(::testing::Message() << "T " << T << " H " << H << " K1 " << K1 << " N2 " << N2
                                      << " versions " << v1 << ", " << v2 << " glu " << glu);
    const int ld_sq = ((H + 63) / 64 + 3) / 4 * 4 + 4 * int(g() % 2);
    test::DeviceOperands p1(g, T, H, K1, size_t(T) * H);  // x [T, K1], W1 [H, K1], h [T, H]
    std::vector<float> h0(size_t(T) * H), gw(H);
    for (auto& v : h0) v = nd(g);
    for (auto& v : gw) v = 1.f + 0.2f * nd(g);
    float *dg = nullptr, *dsq = nullptr, *dy = nullptr;
    uint16_t* dhn = nullptr;
    ASSERT_EQ(cudaMalloc(&dg, size_t(H) * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dsq, size_t(T) * ld_sq * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dhn, size_t(T) * H * 2), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&dy, size_t(T) * N2 * 4), cudaSuccess);  // f32 or bf16 [T, N2]
    cudaMemcpy(p1.dy, h0.data(), h0.size() * 4, cudaMemcpyHostToDevice);
    cudaMemcpy(dg, gw.data(), gw.size() * 4, cudaMemcpyHostToDevice);
    cudaMemset(dsq, 0xff, size_t(T) * ld_sq * 4);  // NaN
    cudaMemset(dhn, 0xff, size_t(T) * H * 2);
    cudaMemset(dy, 0xff, size_t(T) * N2 * 4);

    cuda::GemvArgs a1 = cuda::product_args(p1.dx, p1.dw, p1.dy, T, H, K1, H);
    a1.accumulate = true;
    cuda::NormFold produce;
    produce.mode = cuda::NormFold::kProduce;
    produce.weight = dg;
    produce.out = dhn;
    produce.sq = dsq;
    produce.sq_ld = ld_sq;
    cuda::wgmma_gemm(a1, nullptr, v1, &produce);

    // The second product's weights: [N2, H] (GLU: [2 N2, H]).
    const int rows2 = glu ? 2 * N2 : N2;
    std::vector<uint16_t> w2(size_t(rows2) * H);
    for (auto& v : w2) v = f32_to_bf16(0.1f * nd(g));
    uint16_t* dw2 = nullptr;
    ASSERT_EQ(cudaMalloc(&dw2, w2.size() * 2), cudaSuccess);
    cudaMemcpy(dw2, w2.data(), w2.size() * 2, cudaMemcpyHostToDevice);
    cuda::GemvArgs a2 = cuda::product_args(dhn, dw2, dy, T, N2, H, N2);
    a2.y_bf16 = glu;
    cuda::NormFold consume;
    consume.mode = cuda::NormFold::kConsume;
    consume.sq = dsq;
    consume.sq_ld = ld_sq;
    consume.eps = 1e-5f;
    if (glu) {
      cuda::wgmma_gemm_swiglu(a2, nullptr, v2, &consume);
    } else {
      cuda::wgmma_gemm(a2, nullptr, v2, &consume);
    }
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);

    std::vector<float> h(size_t(T) * H), sq(size_t(T) * ld_sq), y(size_t(T) * N2);
    std::vector<uint16_t> hn(size_t(T) * H);
    cudaMemcpy(h.data(), p1.dy, h.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(sq.data(), dsq, sq.size() * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(hn.data(), dhn, hn.size() * 2, cudaMemcpyDeviceToHost);
    cudaMemcpy(y.data(), dy, y.size() * 4, cudaMemcpyDeviceToHost);
    int bad = 0;
    auto near = [&](double got, double want, double tol) {
      if (!(std::fabs(got - want) <= tol)) ++bad;
    };
    for (int t = 0; t < T && bad < 10; ++t) {
      double total = 0;
      for (int i = 0; i < (H + 63) / 64; ++i) {
        double part = 0;
        for (int n = 64 * i; n < std::min(H, 64 * i + 64); ++n) {
          const size_t at = size_t(t) * H + n;
          const double want = h0[at] + p1.dot(t, n, K1);
          near(h[at], want, 1e-4 * (1 + std::fabs(want)));
          // bf16(h * g) from the device's own h: one rounding (2^-8 relative).
          const double hg = double(h[at]) * gw[n];
          near(bf16_to_f32(hn[at]), hg, std::fabs(hg) / 256 + 1e-30);
          part += double(h[at]) * h[at];
        }
        near(sq[size_t(t) * ld_sq + i], part, 1e-5 * (1 + part));
        total += sq[size_t(t) * ld_sq + i];
      }
      const double r = 1 / std::sqrt(total / H + 1e-5);
      for (int n = 0; n < N2; ++n) {
        auto dot2 = [&](int row) {
          double d = 0;
          for (int k = 0; k < H; ++k)
            d += double(bf16_to_f32(hn[size_t(t) * H + k])) * bf16_to_f32(w2[size_t(row) * H + k]);
          return r * d;
        };
        double want, got;
        if (glu) {
          const double gate = bf16_to_f32(f32_to_bf16(float(dot2(n))));
          const double up = bf16_to_f32(f32_to_bf16(float(dot2(N2 + n))));
          want = gate / (1 + std::exp(-gate)) * up;
          got = bf16_to_f32(reinterpret_cast<const uint16_t*>(y.data())[size_t(t) * N2 + n]);
          // The gate's and up's bf16 roundings may fall either side: 2^-7 relative.
          near(got, want, std::fabs(want) / 64 + 1e-3);
        } else {
          want = dot2(n);
          got = y[size_t(t) * N2 + n];
          near(got, want, 1e-4 * (1 + std::fabs(want)));
        }
      }
    }
    EXPECT_EQ(bad, 0);
    cudaFree(dg);
    cudaFree(dsq);
    cudaFree(dhn);
    cudaFree(dy);
    cudaFree(dw2);
  }
}

// The greedy lm_head (wgmma_gemm_argmax): each token's id against argmax_rows over the same
// product's f32 outputs (version 1, the configuration it runs: the same sums, the same ids), and
// against the largest of the double-precision products (the id's product within the bf16
// operands' error of it). Rows not a multiple of 128, one block (the cluster's CTAs splitting the
// tokens) to a thousand; ties planted across blocks (the lowest index wins), NaN rows (never win)
// and a NaN output 0 (id 0, as argmax_rows gives).
TEST(WgmmaGemmCuda, ArgmaxMatchesTheProductsArgmax) {
  PA_SKIP_WITHOUT_GPU();
  if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(29);
  for (int trial = 0; trial < 40; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kWgmmaGemmMaxTokens));
    // (Every eighth a vocabulary's width: a thousand row blocks, the fold's unrolled loop.)
    const int N = trial % 8 == 7   ? 100000 + int(g() % 40000)
                  : trial % 4 == 0 ? 64 * (1 + int(g() % 300))
                                   : 1 + int(g() % 20000);
    const int K = 8 * (1 + int(g() % (N > 4096 ? 64 : 200)));
    const int kind = trial % 5;  // 0 plain, 1 ties, 2 NaN rows, 3 NaN output 0, 4 ties and NaNs
    SCOPED_TRACE(::testing::Message() << "T " << T << " N " << N << " K " << K << " kind " << kind);
    test::DeviceOperands d(g, T, N, K, size_t(T) * N);
    std::vector<int> nan_rows;
    auto set_row = [&](int row, const std::vector<uint16_t>& v) {
      std::copy(v.begin(), v.end(), d.w.begin() + int64_t(row) * K);
    };
    if ((kind == 1 || kind == 4) && N > 1) {
      // Token 0's best row by far (x's signs), copied to a few other rows: a tie among them.
      std::vector<uint16_t> best(static_cast<size_t>(K));
      for (int k = 0; k < K; ++k)
        best[size_t(k)] = f32_to_bf16(bf16_to_f32(d.x[size_t(k)]) > 0 ? 1.f : -1.f);
      for (int c = 0; c < 3; ++c) set_row(int(g() % uint32_t(N)), best);
    }
    if ((kind == 2 || kind == 4) && N > 2) {
      for (int c = 0; c < 3; ++c) nan_rows.push_back(1 + int(g() % uint32_t(N - 1)));
      for (int r : nan_rows) d.w[size_t(r) * K + size_t(g() % uint32_t(K))] = 0x7fc0;  // NaN
    }
    if (kind == 3) d.w[size_t(g() % uint32_t(K))] = 0x7fc0;  // row 0: output 0 NaN for every token
    cudaMemcpy(d.dw, d.w.data(), d.w.size() * 2, cudaMemcpyHostToDevice);

    cuda::GemvArgs a = cuda::product_args(d.dx, d.dw, d.dy, T, N, K, N);
    cuda::wgmma_gemm(a, nullptr, 1);
    int32_t *ids_ref = nullptr, *ids = nullptr;
    cuda::ArgmaxPair* pairs = nullptr;
    ASSERT_EQ(cudaMalloc(&ids_ref, size_t(T) * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&ids, size_t(T) * 4), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&pairs, size_t(cuda::wgmma_gemm_argmax_blocks(N)) * T * 8), cudaSuccess);
    cuda::argmax_rows(static_cast<const float*>(d.dy), T, N, ids_ref, nullptr);
    cudaMemset(ids, 0x7f, size_t(T) * 4);  // poisoned: an id never written fails
    cudaMemset(pairs, 0xff, size_t(cuda::wgmma_gemm_argmax_blocks(N)) * T * 8);
    cuda::wgmma_gemm_argmax(a, pairs, ids, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<int32_t> got(static_cast<size_t>(T)), want(static_cast<size_t>(T));
    cudaMemcpy(got.data(), ids, size_t(T) * 4, cudaMemcpyDeviceToHost);
    cudaMemcpy(want.data(), ids_ref, size_t(T) * 4, cudaMemcpyDeviceToHost);
    cudaFree(ids_ref);
    cudaFree(ids);
    cudaFree(pairs);
    for (int t = 0; t < T; ++t) {
      SCOPED_TRACE(::testing::Message() << "token " << t);
      EXPECT_EQ(got[size_t(t)], want[size_t(t)]);
      if (kind == 3) {
        EXPECT_EQ(got[size_t(t)], 0);
      }
      // The host's double-precision check on the first and last tokens (and a third).
      if (kind == 3 || !(t == 0 || t == T - 1 || t == T / 2)) continue;
      // The double-precision products: the id's is the largest (within the error of bf16
      // operands summed in fp32), the id no NaN row's, and no row of the same value comes first.
      const int id = got[size_t(t)];
      ASSERT_TRUE(id >= 0 && id < N);
      double best = -INFINITY;
      for (int r = 0; r < N; ++r) {
        const double v = d.dot(t, r, K);
        if (!std::isnan(v)) best = std::max(best, v);
      }
      const double mine = d.dot(t, id, K);
      EXPECT_FALSE(std::isnan(mine));
      EXPECT_LE(best - mine, 1e-3 * (1.0 + std::fabs(best)));
      if ((kind == 1 || kind == 4) && t == 0) {  // the planted tie: its first row
        for (int r = 0; r < id; ++r) EXPECT_NE(d.dot(t, r, K), mine) << "row " << r;
      }
    }
  }
}

// A tensor-parallel rank's greedy lm_head on its vocabulary slice (wgmma_gemm_argmax_slice):
// each token's pair bit for bit as argmax_rows_slice gives it over the same product's f32 outputs
// (version 1: the same sums), for slices at id 0 and past it, with ties, NaN rows and a NaN
// output 0 (which takes the row only in the slice at id 0).
TEST(WgmmaGemmCuda, ArgmaxSliceMatchesArgmaxRowsSlice) {
  PA_SKIP_WITHOUT_GPU();
  if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(37);
  for (int trial = 0; trial < 24; ++trial) {
    const int T = 1 + int(g() % uint32_t(cuda::kWgmmaGemmMaxTokens));
    const int N = trial % 6 == 5 ? 60000 + int(g() % 8000) : 1 + int(g() % 9000);
    const int K = 8 * (1 + int(g() % (N > 4096 ? 64 : 200)));
    const int32_t vocab0 = trial % 2 == 0 ? 0 : 1 + int32_t(g() % 100000);
    const int kind = trial % 4;  // 0 plain, 1 ties, 2 NaN rows, 3 NaN output 0
    SCOPED_TRACE(::testing::Message() << "T " << T << " N " << N << " K " << K << " vocab0 "
                                      << vocab0 << " kind " << kind);
    test::DeviceOperands d(g, T, N, K, size_t(T) * N);
    if (kind == 1 && N > 1) {
      std::vector<uint16_t> best(static_cast<size_t>(K));
      for (int k = 0; k < K; ++k)
        best[size_t(k)] = f32_to_bf16(bf16_to_f32(d.x[size_t(k)]) > 0 ? 1.f : -1.f);
      for (int c = 0; c < 3; ++c)
        std::copy(best.begin(), best.end(), d.w.begin() + int64_t(g() % uint32_t(N)) * K);
    }
    if (kind == 2 && N > 2) {
      for (int c = 0; c < 3; ++c)
        d.w[size_t(1 + g() % uint32_t(N - 1)) * K + size_t(g() % uint32_t(K))] = 0x7fc0;
    }
    if (kind == 3) d.w[size_t(g() % uint32_t(K))] = 0x7fc0;  // output 0 NaN for every token
    cudaMemcpy(d.dw, d.w.data(), d.w.size() * 2, cudaMemcpyHostToDevice);
    cuda::GemvArgs a = cuda::product_args(d.dx, d.dw, d.dy, T, N, K, N);
    cuda::wgmma_gemm(a, nullptr, 1);
    const size_t blocks = size_t(cuda::wgmma_gemm_argmax_blocks(N));
    cuda::ArgmaxPair *want_d = nullptr, *got_d = nullptr, *pairs = nullptr;
    ASSERT_EQ(cudaMalloc(&want_d, size_t(T) * 8), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&got_d, size_t(T) * 8), cudaSuccess);
    ASSERT_EQ(cudaMalloc(&pairs, blocks * T * 8), cudaSuccess);
    cuda::argmax_rows_slice(static_cast<const float*>(d.dy), T, N, N, vocab0, want_d, nullptr);
    cudaMemset(got_d, 0x7f, size_t(T) * 8);  // poisoned: a pair never written fails
    cuda::wgmma_gemm_argmax_slice(a, vocab0, pairs, got_d, nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    std::vector<cuda::ArgmaxPair> got(static_cast<size_t>(T)), want(static_cast<size_t>(T));
    cudaMemcpy(got.data(), got_d, size_t(T) * 8, cudaMemcpyDeviceToHost);
    cudaMemcpy(want.data(), want_d, size_t(T) * 8, cudaMemcpyDeviceToHost);
    cudaFree(want_d);
    cudaFree(got_d);
    cudaFree(pairs);
    for (int t = 0; t < T; ++t) {
      SCOPED_TRACE(::testing::Message() << "token " << t);
      EXPECT_EQ(got[size_t(t)].index, want[size_t(t)].index);
      const bool both_nan = std::isnan(got[size_t(t)].value) && std::isnan(want[size_t(t)].value);
      if (!both_nan) EXPECT_EQ(got[size_t(t)].value, want[size_t(t)].value);
      if (kind == 3 && vocab0 == 0) EXPECT_TRUE(both_nan && got[size_t(t)].index == 0);
      if (kind == 3 && vocab0 > 0) EXPECT_FALSE(std::isnan(got[size_t(t)].value));
    }
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
  // A folded norm: the producer must accumulate into f32 and have its buffers, the consumer's
  // sums must cover K.
  cuda::NormFold f;
  EXPECT_TRUE(cuda::norm_fold_ok(a, f));
  f.mode = cuda::NormFold::kProduce;
  EXPECT_FALSE(cuda::norm_fold_ok(a, f));  // a does not accumulate; no buffers
  cuda::GemvArgs acc = a;
  acc.accumulate = true;
  acc.y_bf16 = false;
  alignas(16) float sq[4] = {};
  uint16_t out = 0;
  f.weight = sq;
  f.out = &out;
  f.sq = sq;
  f.sq_ld = 4;  // a.N = 4: one part, rounded up to a vector
  EXPECT_TRUE(cuda::norm_fold_ok(acc, f));
  f.sq_ld = 1;  // not whole vectors
  EXPECT_FALSE(cuda::norm_fold_ok(acc, f));
  f.sq_ld = 4;
  f.sq = sq + 1;  // misaligned
  EXPECT_FALSE(cuda::norm_fold_ok(acc, f));
  f.sq = sq;
  cuda::NormFold c;
  c.mode = cuda::NormFold::kConsume;
  c.sq = sq;
  c.sq_ld = 4;
  EXPECT_EQ(cuda::norm_fold_ok(a, c), !a.accumulate);
  EXPECT_FALSE(cuda::norm_fold_ok(acc, c));  // a consumer does not accumulate
  c.sq_ld = 0;
  EXPECT_FALSE(cuda::norm_fold_ok(a, c));
  test::expect_error_naming([&] { cuda::wgmma_gemm(a, nullptr, 0, &c); }, "wgmma_gemm",
                            "a consumer whose sums do not cover K");
  test::expect_error_naming([&] { cuda::wgmma_gemm(a, nullptr, cuda::kWgmmaGemmVersions + 1); },
                            "wgmma_gemm", "an unknown version");
}

// Device memory of n elements of T filled with `fill` (bytes of each element the same), freed at
// the end of the scope.
template <class T>
struct DeviceBuffer {
  T* p = nullptr;
  size_t n = 0;
  DeviceBuffer(size_t count, uint8_t fill) : n(count) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1) * sizeof(T)), cudaSuccess);
    cudaMemset(p, fill, n * sizeof(T));
  }
  explicit DeviceBuffer(const std::vector<T>& v) : DeviceBuffer(v.size(), 0) {
    cudaMemcpy(p, v.data(), n * sizeof(T), cudaMemcpyHostToDevice);
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  std::vector<T> get() const {
    std::vector<T> v(n);
    cudaMemcpy(v.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost);
    return v;
  }
};

// The qkv product with qkv_post's work in its epilogue (wgmma_gemm_qkv) against the product into
// f32 followed by qkv_post reading the same rows in their interleaved order (the two checked
// against double precision by MatchesDoublePrecisionOnRandomShapes and
// LlamaCudaKernels.QkvPostIsTheHostComputation): q and every byte of both pools the same, bf16
// and fp8 pools, with and without a bias and a folded norm's r, at each head size and each
// version it runs; slots outside the pools skipped and every other slot left alone.
TEST(WgmmaGemmCuda, QkvEpilogueIsTheProductThenQkvPost) {
  PA_SKIP_WITHOUT_GPU();
  if (!cuda::wgmma_gemm_available()) GTEST_SKIP() << "not an sm_90 device";
  std::mt19937 g(31);
  std::normal_distribution<float> nd(0.f, 1.f);
  const int versions[] = {0, 1, 5, 6};
  for (int trial = 0; trial < 32; ++trial) {
    const int D = 64 << (trial % 3), half = D / 2;
    const int Hkv = 1 + int(g() % 4), Hq = Hkv * (1 + int(g() % 4)), N = (Hq + 2 * Hkv) * D;
    const int T = 1 + int(g() % uint32_t(cuda::kWgmmaGemmMaxTokens));
    const int K = 8 * (1 + int(g() % (trial % 4 == 0 ? 600 : 120)));
    const int version = versions[trial % 4];
    const bool bias = g() % 2 == 0, fp8 = trial % 5 >= 3, fold = trial % 2 == 1;
    SCOPED_TRACE(::testing::Message() << "T " << T << " Hq " << Hq << " Hkv " << Hkv << " D " << D
                                      << " K " << K << " version " << version << " bias " << bias
                                      << " fp8 " << fp8 << " fold " << fold);
    test::DeviceOperands d(g, T, N, K, size_t(T) * N);  // x [T, K], W [N, K], y [T, N] f32
    std::vector<float> b(static_cast<size_t>(N)), rows(size_t(2) * T * half);
    for (float& v : b) v = nd(g);
    for (int t = 0; t < T; ++t)  // each token's cos and sin rows of some angle
      for (int i = 0; i < half; ++i) {
        const double angle = 0.37 * (t + 1) * (i + 1);
        rows[size_t(t) * half + size_t(i)] = float(std::cos(angle));
        rows[(size_t(T) + size_t(t)) * half + size_t(i)] = float(std::sin(angle));
      }
    const int page = 16, pages = (T + page - 1) / page + 2;
    std::vector<int32_t> slots(size_t(pages) * page);
    for (size_t j = 0; j < slots.size(); ++j) slots[j] = int32_t(j);
    std::shuffle(slots.begin(), slots.end(), g);  // distinct slots in any order
    slots.resize(static_cast<size_t>(T));
    for (int t = 3; t < T; t += 5) slots[size_t(t)] = -1;  // skipped
    if (T > 1) slots[1] = pages * page;                    // past the pools: skipped too
    std::vector<float> scales(size_t(2) * Hkv);
    for (int h = 0; h < Hkv; ++h)  // k's, then v's; some values saturate, some round to zero
      scales[size_t(h)] = 0.004f * (h + 1), scales[size_t(Hkv + h)] = 0.02f;
    // A folded norm's sums of squares (any positive values: r = rsqrt(sum / K + eps)).
    const int parts = (K + 63) / 64, sq_ld = (parts + 3) / 4 * 4;
    std::vector<float> sq(size_t(T) * sq_ld);
    for (float& v : sq) v = 64.f * (0.5f + std::fabs(nd(g)));
    DeviceBuffer<float> db(b), drows(rows), dscales(scales), dsq(sq);
    DeviceBuffer<int32_t> dslots(slots);
    const size_t elem = fp8 ? 1 : 2, nq = size_t(T) * Hq * D;
    const size_t pool_bytes = size_t(pages) * Hkv * page * D * elem;
    DeviceBuffer<uint16_t> q0(nq, 0x5a), q1(nq, 0x5a);
    DeviceBuffer<uint8_t> pools[2][2] = {{{pool_bytes, 0x5a}, {pool_bytes, 0x5a}},
                                         {{pool_bytes, 0x5a}, {pool_bytes, 0x5a}}};
    cuda::QkvParams p;
    p.num_tokens = T;
    p.num_q_heads = Hq;
    p.num_kv_heads = Hkv;
    p.head_dim = D;
    p.fp8 = fp8;
    p.k_scale = dscales.p;
    p.v_scale = dscales.p + Hkv;
    p.slots = dslots.p;
    p.page_size = page;
    p.num_pages = pages;
    p.interleaved = true;
    cuda::NormFold nf;
    nf.mode = cuda::NormFold::kConsume;
    nf.sq = dsq.p;
    nf.sq_ld = sq_ld;
    nf.eps = 1e-5f;
    const cuda::GemvArgs a = cuda::product_args(d.dx, d.dw, d.dy, T, N, K, N);
    // Path 0: the product into f32, then qkv_post.
    cuda::wgmma_gemm(a, nullptr, version, fold ? &nf : nullptr);
    cuda::QkvParams p0 = p;
    p0.k_pool = pools[0][0].p;
    p0.v_pool = pools[0][1].p;
    cuda::qkv_post(static_cast<const float*>(d.dy), bias ? db.p : nullptr, nullptr, nullptr,
                   drows.p, drows.p + size_t(T) * half, p0, q0.p, nullptr, nullptr, nullptr);
    // Path 1: one launch (y poisoned first: it must not be needed).
    cudaMemset(d.dy, 0xff, size_t(T) * N * 4);
    cuda::QkvEpilogue e;
    e.p = p;
    e.p.k_pool = pools[1][0].p;
    e.p.v_pool = pools[1][1].p;
    e.bias = bias ? db.p : nullptr;
    e.cos = drows.p;
    e.sin = drows.p + size_t(T) * half;
    e.q = q1.p;
    cuda::wgmma_gemm_qkv(a, e, nullptr, version, fold ? &nf : nullptr);
    ASSERT_EQ(cudaDeviceSynchronize(), cudaSuccess);
    const std::vector<uint16_t> want_q = q0.get(), got_q = q1.get();
    for (size_t i = 0; i < nq; ++i) {
      ASSERT_EQ(got_q[i], want_q[i]) << "q element " << i;
      ASSERT_NE(got_q[i], 0x5a5a) << "q element " << i << " not written";
    }
    // The bytes of the tokens' slots (the others keep the poison).
    std::vector<bool> in_slot(pool_bytes, false);
    for (int32_t slot : slots) {
      if (slot < 0 || slot >= pages * page) continue;
      for (int h = 0; h < Hkv; ++h) {
        const size_t at =
            ((size_t(slot / page) * Hkv + size_t(h)) * page + size_t(slot % page)) * D;
        for (size_t j = 0; j < size_t(D) * elem; ++j) in_slot[at * elem + j] = true;
      }
    }
    for (int kv = 0; kv < 2; ++kv) {
      const std::vector<uint8_t> want = pools[0][kv].get(), got = pools[1][kv].get();
      size_t changed = 0, slot_bytes = 0;
      for (size_t i = 0; i < pool_bytes; ++i) {
        ASSERT_EQ(got[i], want[i]) << (kv ? "V" : "K") << " pool byte " << i;
        if (!in_slot[i]) {
          ASSERT_EQ(got[i], 0x5a) << (kv ? "V" : "K") << " pool byte " << i << " outside a slot";
        }
        slot_bytes += in_slot[i];
        changed += got[i] != 0x5a;
      }
      // (A value may round to the poison's byte; most do not.)
      EXPECT_GT(changed, slot_bytes / 2) << (kv ? "V" : "K") << " pool";
    }
  }
}

// What wgmma_gemm_qkv refuses, before it needs a device: parameters that do not describe the
// product, missing outputs, a norm it cannot take.
TEST(WgmmaGemmCuda, QkvEpilogueRefusesWhatDoesNotDescribeIt) {
  const auto* x = reinterpret_cast<const uint16_t*>(uintptr_t(1) << 20);
  const auto* w = reinterpret_cast<const uint16_t*>(uintptr_t(1) << 21);
  void* y = reinterpret_cast<void*>(uintptr_t(1) << 22);
  auto* out = reinterpret_cast<uint16_t*>(uintptr_t(1) << 23);
  const auto* rows = reinterpret_cast<const float*>(uintptr_t(1) << 24);
  const auto* slots = reinterpret_cast<const int32_t*>(uintptr_t(1) << 25);
  const int T = 8, Hq = 4, Hkv = 2, D = 128, N = (Hq + 2 * Hkv) * D, K = 256;
  const cuda::GemvArgs a = cuda::product_args(x, w, y, T, N, K, N);
  cuda::QkvEpilogue e;
  e.p.num_tokens = T;
  e.p.num_q_heads = Hq;
  e.p.num_kv_heads = Hkv;
  e.p.head_dim = D;
  e.p.k_pool = out;
  e.p.v_pool = out;
  e.p.slots = slots;
  e.p.page_size = 16;
  e.p.num_pages = 4;
  e.p.interleaved = true;
  e.q = out;
  e.cos = rows;
  e.sin = rows;
  auto refused = [&](const cuda::GemvArgs& args, const cuda::QkvEpilogue& ep, const char* what,
                     const cuda::NormFold* fold = nullptr) {
    test::expect_error_naming([&] { cuda::wgmma_gemm_qkv(args, ep, nullptr, 0, fold); },
                              "wgmma_gemm_qkv", what);
  };
  cuda::GemvArgs b = a;
  b.N = N - D;
  refused(b, e, "rows that are not the heads'");
  b = a;
  b.accumulate = true;
  refused(b, e, "an accumulated product");
  b = a;
  b.y_bf16 = true;
  refused(b, e, "a bf16 product");
  cuda::QkvEpilogue f = e;
  f.p.head_dim = 96;
  f.p.num_q_heads = N / 96 - 2 * Hkv;
  refused(a, f, "a head size without a kernel");
  f = e;
  f.p.num_tokens = T + 1;
  refused(a, f, "another token count");
  f = e;
  f.p.k_pool = nullptr;
  refused(a, f, "no pools");
  f = e;
  f.cos = nullptr;
  refused(a, f, "no RoPE rows");
  f = e;
  f.p.fp8 = true;
  refused(a, f, "fp8 pools without scales");
  f = e;
  f.p.interleaved = false;
  refused(a, f, "weights in the heads' own order");
  cuda::NormFold produce;
  produce.mode = cuda::NormFold::kProduce;
  refused(a, e, "a norm's producer", &produce);
  EXPECT_TRUE(cuda::wgmma_gemm_qkv_version_ok(1) && cuda::wgmma_gemm_qkv_version_ok(5) &&
              cuda::wgmma_gemm_qkv_version_ok(6));
  EXPECT_FALSE(cuda::wgmma_gemm_qkv_version_ok(2) || cuda::wgmma_gemm_qkv_version_ok(0));
}

#else

TEST(WgmmaGemmCuda, MatchesDoublePrecisionOnRandomShapes) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
