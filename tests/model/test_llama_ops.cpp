// The CPU building blocks of the forward pass against plain double-precision loops.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <numbers>
#include <random>

#include "model/cpu_ops.h"
#include "model/rope.h"
#include "pagedattn/error.h"

using namespace pagedattn;

namespace {

std::vector<float> random_vec(size_t n, uint64_t seed) {
  std::mt19937_64 g(seed);
  std::uniform_real_distribution<float> u(-1.f, 1.f);
  std::vector<float> v(n);
  for (float& x : v) x = u(g);
  return v;
}

TEST(CpuOps, MatmulMatchesDoubleLoops) {
  // Odd sizes exercise the block and vector-width tails.
  for (auto [m, k, n] : {std::tuple{1, 7, 5}, {3, 64, 17}, {9, 131, 33}, {33, 576, 70}}) {
    const auto x = random_vec(size_t(m * k), 1), w = random_vec(size_t(n * k), 2);
    std::vector<float> blas(static_cast<size_t>(m * n)), blocked(static_cast<size_t>(m * n));
    cpu::matmul_wt(x.data(), m, k, w.data(), n, blas.data());
    cpu::matmul_wt_blocked(x.data(), m, k, w.data(), n, blocked.data());
    for (int r = 0; r < m; ++r) {
      for (int c = 0; c < n; ++c) {
        double want = 0.0;
        for (int i = 0; i < k; ++i) want += double(x[size_t(r * k + i)]) * w[size_t(c * k + i)];
        const double tol = 1e-5 * std::sqrt(double(k));
        ASSERT_NEAR(blas[size_t(r * n + c)], want, tol) << m << "x" << k << "x" << n;
        ASSERT_NEAR(blocked[size_t(r * n + c)], want, tol) << m << "x" << k << "x" << n;
      }
    }
  }
}

TEST(CpuOps, BlockedMatmulRowsDoNotDependOnBatch) {
  const int k = 200, n = 40;
  const auto x = random_vec(size_t(8 * k), 3), w = random_vec(size_t(n * k), 4);
  std::vector<float> all(static_cast<size_t>(8 * n)), one(static_cast<size_t>(n));
  cpu::matmul_wt_blocked(x.data(), 8, k, w.data(), n, all.data());
  for (int r = 0; r < 8; ++r) {
    cpu::matmul_wt_blocked(x.data() + r * k, 1, k, w.data(), n, one.data());
    for (int c = 0; c < n; ++c) ASSERT_EQ(one[size_t(c)], all[size_t(r * n + c)]);
  }
}

TEST(CpuOps, RmsNormSiluBias) {
  const auto x = random_vec(3 * 10, 5), g = random_vec(10, 6), up = random_vec(30, 7);
  std::vector<float> y(30);
  cpu::rms_norm(x.data(), g.data(), 3, 10, 1e-6f, y.data());
  for (int r = 0; r < 3; ++r) {
    double ss = 0.0;
    for (int i = 0; i < 10; ++i) ss += double(x[size_t(r * 10 + i)]) * x[size_t(r * 10 + i)];
    for (int i = 0; i < 10; ++i) {
      const double want = x[size_t(r * 10 + i)] / std::sqrt(ss / 10 + 1e-6) * g[size_t(i)];
      EXPECT_NEAR(y[size_t(r * 10 + i)], want, 1e-6);
    }
  }
  std::vector<float> gate = x;
  cpu::silu_mul(gate.data(), up.data(), 30);
  for (size_t i = 0; i < 30; ++i) {
    EXPECT_NEAR(gate[i], x[i] / (1.0 + std::exp(-double(x[i]))) * up[i], 1e-6);
  }
  std::vector<float> b = x;
  cpu::add_bias(b.data(), g.data(), 3, 10);
  EXPECT_FLOAT_EQ(b[25], x[25] + g[5]);
}

// SwiGLU's gate over the whole range a float activation takes, large magnitudes included (exp of
// -g saturates at either end: silu(g) -> g for large g, -> -0 for very negative g).
TEST(CpuOps, SiluMulAcrossTheRange) {
  std::vector<float> gate, up;
  for (float v = -120.f; v <= 120.f; v += 0.173f) gate.push_back(v), up.push_back(1.5f);
  std::vector<float> y = gate;
  cpu::silu_mul(y.data(), up.data(), int64_t(y.size()));
  for (size_t i = 0; i < y.size(); ++i) {
    const double g = gate[i], want = g / (1.0 + std::exp(-g)) * 1.5;
    EXPECT_NEAR(y[i], want, 1e-6 * std::abs(want) + 1e-30) << "gate " << g;
  }
}

TEST(Rope, PlainFrequenciesAndRotation) {
  const auto f = rope_inv_freq(8, 10000.f, RopeScaling{});
  ASSERT_EQ(f.size(), 4u);
  EXPECT_DOUBLE_EQ(f[0], 1.0);
  EXPECT_NEAR(f[1], 0.1, 1e-15);
  EXPECT_NEAR(f[3], 1e-3, 1e-15);
  // One head of dim 8 at position 3: pairs (i, i + 4) rotate by 3 * f[i].
  const int32_t pos = 3;
  std::vector<float> cos(4), sin(4);
  rope_tables(f, &pos, 1, cos.data(), sin.data());
  std::vector<float> x = random_vec(8, 9), y = x;
  rope_apply(y.data(), 1, 1, 8, cos.data(), sin.data());
  for (int i = 0; i < 4; ++i) {
    const double a = 3.0 * f[size_t(i)];
    EXPECT_NEAR(y[size_t(i)], x[size_t(i)] * std::cos(a) - x[size_t(i + 4)] * std::sin(a), 1e-6);
    EXPECT_NEAR(y[size_t(i + 4)], x[size_t(i + 4)] * std::cos(a) + x[size_t(i)] * std::sin(a),
                1e-6);
  }
}

TEST(Rope, Llama3ScalingBands) {
  RopeScaling s;
  s.type = "llama3";
  s.factor = 8.f;
  s.low_freq_factor = 1.f;
  s.high_freq_factor = 4.f;
  s.original_max_position = 8192;
  const auto plain = rope_inv_freq(128, 500000.f, RopeScaling{});
  const auto scaled = rope_inv_freq(128, 500000.f, s);
  int kept = 0, divided = 0, blended = 0;
  for (size_t i = 0; i < plain.size(); ++i) {
    const double wavelen = 2 * std::numbers::pi / plain[i];
    if (wavelen < 8192.0 / 4) {
      EXPECT_DOUBLE_EQ(scaled[i], plain[i]);
      ++kept;
    } else if (wavelen > 8192.0) {
      EXPECT_NEAR(scaled[i], plain[i] / 8, 1e-18);
      ++divided;
    } else {
      EXPECT_LT(scaled[i], plain[i]);
      EXPECT_GT(scaled[i], plain[i] / 8);
      ++blended;
    }
  }
  EXPECT_GT(kept, 0);
  EXPECT_GT(divided, 0);
  EXPECT_GT(blended, 0);
}

TEST(Rope, RejectsBadArguments) {
  EXPECT_THROW(rope_inv_freq(7, 10000.f, RopeScaling{}), Error);
  EXPECT_THROW(rope_inv_freq(8, 0.f, RopeScaling{}), Error);
  RopeScaling s;
  s.type = "llama3";
  s.factor = 0.f;
  EXPECT_THROW(rope_inv_freq(8, 10000.f, s), Error);
}

}  // namespace
