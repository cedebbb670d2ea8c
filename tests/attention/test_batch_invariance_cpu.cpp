// The fused CPU kernel is batch-invariant, bit for bit: a query's output is the same computed in a
// decode step (q_len 1), inside a prefill of the whole sequence, inside a chunk, and beside other
// sequences (the scores of a transposed tile are reduced like the per-key dot products, and key
// tiles start at fixed positions), and a decode item split into per-chunk parts across the pool's
// threads gives the output of the same item walked whole.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <random>
#include <vector>

#include "pagedattn/attention.h"

using namespace pagedattn;

namespace {

struct Case {
  int32_t head_dim;
  int32_t window;
};

class CpuAttentionInvariance : public ::testing::TestWithParam<Case> {};

TEST_P(CpuAttentionInvariance, QueryOutputIndependentOfBatchShape) {
  // NOTE: L spans three softmax chunks (kChunk = 256 keys), so a lone decode query is split.
  const int32_t D = GetParam().head_dim, Hq = 9, Hk = 3, P = 16, L = 600;
  const int32_t seq_pages = (L + P - 1) / P, pages = seq_pages + 8;
  std::mt19937_64 g(3);
  std::normal_distribution<float> n(0.f, 1.f);
  std::vector<float> k(size_t(pages) * Hk * P * D), v(k.size()), q(size_t(L) * Hq * D);
  for (auto* b : {&k, &v, &q})
    for (float& x : *b) x = n(g);
  // The sequence's pages in shuffled order; a second sequence uses the last pages.
  std::vector<int32_t> table(static_cast<size_t>(seq_pages));
  std::iota(table.begin(), table.end(), 0);
  std::shuffle(table.begin(), table.end(), std::mt19937(7));
  std::vector<int32_t> other_table(8);
  std::iota(other_table.begin(), other_table.end(), seq_pages);
  PagedKVView kv{k.data(), v.data(), DType::f32, pages, Hk, P, D};
  AttentionOptions opt;
  opt.window = GetParam().window;

  // Runs queries [q0, q0 + q_len) of the sequence (kv_len q0 + q_len), optionally after a second
  // sequence of `other` new tokens; returns the sequence's output rows.
  auto run = [&](int32_t q0, int32_t q_len, int32_t other) {
    const int32_t width = int32_t(std::max(table.size(), other_table.size()));
    std::vector<int32_t> bt(size_t(2 * width), 0), indptr = {0}, kv_len;
    std::vector<float> qb;
    int32_t seqs = 0;
    if (other > 0) {
      std::copy(other_table.begin(), other_table.end(), bt.begin());
      for (int32_t i = 0; i < other * Hq * D; ++i) qb.push_back(n(g));
      indptr.push_back(other);
      kv_len.push_back(other + 7);
      ++seqs;
    }
    std::copy(table.begin(), table.end(), bt.begin() + ptrdiff_t(seqs * width));
    qb.insert(qb.end(), q.begin() + ptrdiff_t(q0) * Hq * D,
              q.begin() + ptrdiff_t(q0 + q_len) * Hq * D);
    indptr.push_back(indptr.back() + q_len);
    kv_len.push_back(q0 + q_len);
    ++seqs;
    std::vector<float> out(qb.size());
    const int32_t T = indptr.back();
    const QKVTensor qt{qb.data(), DType::f32, T, Hq, D};
    QKVTensor ot{out.data(), DType::f32, T, Hq, D};
    const BatchLayout layout{seqs, indptr.data(), kv_len.data(), bt.data(), width};
    paged_attention_cpu(qt, kv, layout, opt, ot);
    return std::vector<float>(out.end() - ptrdiff_t(q_len) * Hq * D, out.end());
  };
  const std::vector<float> prefill = run(0, L, 0);
  const size_t row = size_t(Hq) * D;
  for (int32_t p : {0, 1, 15, 16, 63, 64, 65, 100, 149, 255, 256, 257, 400, 511, 512, 599}) {
    const std::vector<float> one = run(p, 1, 0);  // 3 items: split past position 255
    EXPECT_EQ(std::memcmp(one.data(), prefill.data() + size_t(p) * row, row * 4), 0)
        << "decode of position " << p << " differs from the prefill's row";
    const std::vector<float> beside = run(p, 1, 5);
    EXPECT_EQ(std::memcmp(beside.data(), one.data(), row * 4), 0)
        << "position " << p << " beside another sequence";
    const std::vector<float> many = run(p, 1, 100);  // 18 items: never split
    EXPECT_EQ(std::memcmp(many.data(), one.data(), row * 4), 0)
        << "position " << p << " beside a prefill of 100 tokens";
  }
  const std::vector<float> chunk = run(240, 70, 3);  // a chunked prefill beside another prefill
  EXPECT_EQ(std::memcmp(chunk.data(), prefill.data() + 240 * row, chunk.size() * 4), 0)
      << "a chunk differs from the prefill's rows";
}

INSTANTIATE_TEST_SUITE_P(Shapes, CpuAttentionInvariance,
                         ::testing::Values(Case{64, 0}, Case{64, 40}, Case{48, 0}, Case{128, 0}),
                         [](const auto& p) {
                           return "D" + std::to_string(p.param.head_dim) + "_window" +
                                  std::to_string(p.param.window);
                         });

}  // namespace
