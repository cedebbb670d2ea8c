// The oracle checked on its own: tiny cases worked out by hand, and a naive direct formula (long
// double, one key at a time) on random problems. Also the kernel's branch-free f16 decode.
#include <gtest/gtest.h>

#include <cmath>
#include <random>
#include <vector>

#include "attention/cpu/kernel_types.h"
#include "problem.h"

using namespace pagedattn;
using namespace pagedattn::testing;

namespace {

// A hand-built f32 problem: one KV head, head_dim D, page size 1, pages in reverse order.
struct Tiny {
  int32_t D, Hq;
  std::vector<float> q, k, v;  // q: [tokens][Hq][D]; k, v: [positions][D] (logical order)
  std::vector<int32_t> q_len, kv_len;
  AttentionOptions opt;
  DType kv_dtype = DType::f32;
  std::vector<float> k_scale{1.f}, v_scale{1.f};

  std::vector<float> run() const {
    const int32_t L = int32_t(k.size()) / D;
    std::vector<uint8_t> kp(size_t(L) * D * dtype_size(kv_dtype)), vp = kp;
    for (int32_t p = 0; p < L; ++p)  // position p in physical page L - 1 - p
      for (int32_t d = 0; d < D; ++d) {
        store_from_f32(kp.data(), kv_dtype, int64_t(L - 1 - p) * D + d, k[size_t(p * D + d)]);
        store_from_f32(vp.data(), kv_dtype, int64_t(L - 1 - p) * D + d, v[size_t(p * D + d)]);
      }
    std::vector<int32_t> table(q_len.size() * size_t(L));
    std::vector<int32_t> indptr{0};
    for (size_t b = 0; b < q_len.size(); ++b) {
      indptr.push_back(indptr.back() + q_len[b]);
      for (int32_t i = 0; i < L; ++i) table[b * size_t(L) + size_t(i)] = L - 1 - i;
    }
    PagedKVView kv{kp.data(), vp.data(), kv_dtype, L, 1, 1, D, k_scale.data(), v_scale.data()};
    const BatchLayout batch{int32_t(q_len.size()), indptr.data(), kv_len.data(), table.data(), L};
    const QKVTensor qt{const_cast<float*>(q.data()), DType::f32, indptr.back(), Hq, D};
    std::vector<float> out(q.size(), NAN);
    QKVTensor ot{out.data(), DType::f32, indptr.back(), Hq, D};
    paged_attention_reference(qt, kv, batch, opt, ot);
    return out;
  }
};

TEST(Reference, TwoKeysByHand) {
  Tiny t{2, 1, {1, 0}, {1, 0, 0, 1}, {1, 2, 3, 4}, {1}, {2}, {}};
  t.opt.scale = 1.f;
  const double e = std::exp(1.0), w0 = e / (e + 1), w1 = 1 / (e + 1);
  const std::vector<float> out = t.run();
  EXPECT_NEAR(out[0], w0 * 1 + w1 * 3, 1e-6);
  EXPECT_NEAR(out[1], w0 * 2 + w1 * 4, 1e-6);
}

TEST(Reference, CausalChunkWindowAndGqaByHand) {
  // Zero queries: uniform weights over the visible keys. V = 1, 2, 4 at positions 0, 1, 2.
  // Two query rows with kv_len 3 sit at positions 1 and 2.
  Tiny t{1, 2, {0, 0, 0, 0}, {5, -3, 2}, {1, 2, 4}, {2}, {3}, {}};
  std::vector<float> out = t.run();  // causal: row 0 sees 0..1, row 1 sees 0..2 (both heads)
  EXPECT_NEAR(out[0], 1.5, 1e-6);
  EXPECT_NEAR(out[1], 1.5, 1e-6);
  EXPECT_NEAR(out[2], 7.0 / 3, 1e-6);
  EXPECT_NEAR(out[3], 7.0 / 3, 1e-6);
  t.opt.causal = false;  // every row sees all three
  out = t.run();
  for (float x : out) EXPECT_NEAR(x, 7.0 / 3, 1e-6);
  t.opt.causal = true, t.opt.window = 1;  // only itself
  out = t.run();
  EXPECT_NEAR(out[0], 2.0, 1e-6);
  EXPECT_NEAR(out[2], 4.0, 1e-6);
  t.opt.window = 2;  // itself and the one before
  out = t.run();
  EXPECT_NEAR(out[0], 1.5, 1e-6);
  EXPECT_NEAR(out[2], 3.0, 1e-6);
  // GQA: head 1 shares the KV head but has its own query; q = 1 on head 1 of row 1 weights keys
  // by exp(k): 5, -3, 2.
  t.opt.window = 0, t.opt.scale = 1.f;
  t.q = {0, 0, 0, 1};
  out = t.run();
  const double a = std::exp(5.0), b = std::exp(-3.0), c = std::exp(2.0);
  EXPECT_NEAR(out[2], 7.0 / 3, 1e-6);
  EXPECT_NEAR(out[3], (a * 1 + b * 2 + c * 4) / (a + b + c), 1e-6);
}

TEST(Reference, SoftcapByHand) {
  Tiny t{1, 1, {10}, {1, 0}, {1, 0}, {1}, {2}, {}};
  t.opt.scale = 1.f, t.opt.softcap = 5.f;
  const double x0 = 5 * std::tanh(10.0 / 5), w0 = std::exp(x0) / (std::exp(x0) + 1);
  EXPECT_NEAR(t.run()[0], w0, 1e-6);
}

TEST(Reference, Fp8ScalesMultiplyStoredValues) {
  // Stored k = 1, 0 and v = 1, 0; k_scale ln 3 gives logits ln 3, 0 (weights 3/4, 1/4) and
  // v_scale 4 gives values 4, 0: out = 3.
  Tiny t{1, 1, {1}, {1, 0}, {1, 0}, {1}, {2}, {}};
  t.opt.scale = 1.f, t.kv_dtype = DType::fp8_e4m3;
  t.k_scale = {float(std::log(3.0))}, t.v_scale = {4.f};
  EXPECT_NEAR(t.run()[0], 3.0, 1e-6);
}

// Naive direct formula, independent of the reference's code: for every (row, head), list the
// visible keys straight from the pools, softmax in long double.
TEST(Reference, MatchesNaiveFormulaOnRandomProblems) {
  std::mt19937_64 rng(5);
  for (int iter = 0; iter < 40; ++iter) {
    ProblemSpec s;
    s.num_kv_heads = 1 + int(rng() % 2), s.num_q_heads = s.num_kv_heads * (1 + int(rng() % 3));
    s.head_dim = 8 + 8 * int(rng() % 3), s.page_size = 1 + int(rng() % 5);
    s.kv_dtype = iter % 2 ? DType::bf16 : DType::fp8_e4m3;
    for (int b = 0; b < 3; ++b) {
      const int32_t L = 1 + int32_t(rng() % 30);
      s.kv_len.push_back(L), s.q_len.push_back(1 + int32_t(rng() % L));
    }
    s.opt.causal = iter % 3 != 0;
    s.opt.window = iter % 4 == 0 ? 3 : 0;
    s.opt.softcap = iter % 5 == 0 ? 2.f : 0.f;
    const Problem pr(s, uint64_t(iter));
    OutBuffer out(pr, DType::f32);
    paged_attention_reference(pr.q_tensor(), pr.view(), pr.batch(), s.opt, out.t);
    const std::vector<double> got = out.values();

    const PagedKVView kv = pr.view();
    const int32_t D = s.head_dim, G = s.num_q_heads / s.num_kv_heads;
    const long double scale = 1.0L / std::sqrt((long double)D);
    for (int32_t b = 0; b < 3; ++b) {
      const int32_t L = s.kv_len[size_t(b)], ql = s.q_len[size_t(b)];
      for (int32_t j = 0; j < ql; ++j) {
        const int32_t pos = L - ql + j, row = pr.q_indptr[size_t(b)] + j;
        for (int32_t h = 0; h < s.num_q_heads; ++h) {
          const int32_t g = h / G;
          const auto elem = [&](const std::vector<uint8_t>& pool, int32_t t, int32_t d) {
            const int32_t page = pr.block_table[size_t(b) * pr.max_pages_per_seq + t / s.page_size];
            const long double sc = s.kv_dtype == DType::fp8_e4m3
                                       ? (&pool == &pr.k_pages ? pr.k_scale : pr.v_scale)[size_t(g)]
                                       : 1.0L;
            return sc *
                   load_as_f32(pool.data(), s.kv_dtype, kv.offset(page, g, t % s.page_size) + d);
          };
          std::vector<long double> w;
          std::vector<int32_t> keys;
          for (int32_t t = 0; t < L; ++t) {
            if (s.opt.causal && t > pos) continue;
            if (s.opt.window && t <= pos - s.opt.window) continue;
            long double x = 0;
            for (int32_t d = 0; d < D; ++d)
              x += load_as_f32(pr.q.data(), s.q_dtype, (int64_t(row) * s.num_q_heads + h) * D + d) *
                   elem(pr.k_pages, t, d);
            x *= scale;
            if (s.opt.softcap > 0) x = s.opt.softcap * std::tanh(x / s.opt.softcap);
            w.push_back(std::exp(x));
            keys.push_back(t);
          }
          long double total = 0;
          for (long double x : w) total += x;
          for (int32_t d = 0; d < D; ++d) {
            long double o = 0;
            for (size_t i = 0; i < w.size(); ++i) o += w[i] / total * elem(pr.v_pages, keys[i], d);
            const double ref = got[size_t((int64_t(row) * s.num_q_heads + h) * D + d)];
            ASSERT_NEAR(ref, double(o), 1e-5 * (1 + std::fabs(double(o))))
                << describe(s) << " b=" << b << " j=" << j << " h=" << h << " d=" << d;
          }
        }
      }
    }
  }
}

TEST(KernelHelpers, BranchFreeF16DecodeIsBitExact) {
  for (uint32_t h = 0; h < 65536; ++h) {
    const uint32_t want = f32_bits(f16_to_f32(uint16_t(h)));
    const uint32_t got = f32_bits(cpu::f16_to_f32_fast(uint16_t(h)));
    ASSERT_EQ(got, want) << "f16 bits 0x" << std::hex << h;
  }
}

}  // namespace
