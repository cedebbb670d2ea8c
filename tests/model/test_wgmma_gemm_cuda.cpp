// The few-dozen-token product on Hopper (model/cuda/wgmma_gemm.h) against a double-precision
// product on the host: random shapes (rows not a multiple of its 128-row blocks, K not a multiple
// of its 64-element stages, every token tile), f32 output, accumulation into f32, bf16 output, a
// row stride wider than N, the same bits twice; gate/up with SwiGLU in one launch; the greedy
// lm_head's argmax without logits, over the whole vocabulary and a rank's slice of it; and the
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

#else

TEST(WgmmaGemmCuda, MatchesDoublePrecisionOnRandomShapes) { GTEST_SKIP() << "built without CUDA"; }

#endif

}  // namespace
