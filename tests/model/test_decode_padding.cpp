// Decode steps padded to a few row counts (src/model/decode_padding.h): the counts, the dummy rows,
// and that the padded batch is a valid attention batch whose real rows attend exactly as before.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <random>
#include <vector>

#include "model/decode_padding.h"
#include "pagedattn/attention.h"
#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"
#include "step_batch.h"

namespace pagedattn {
namespace {

TEST(DecodePadding, RowCounts) {
  const std::vector<std::pair<int32_t, int32_t>> want = {
      {0, 0},   {1, 1},     {2, 2},     {3, 4},     {4, 4},     {5, 8},     {8, 8},
      {9, 16},  {31, 32},   {32, 32},   {33, 40},   {63, 64},   {64, 64},   {65, 96},
      {96, 96}, {200, 224}, {256, 256}, {257, 320}, {1000, 1024}};
  for (const auto& [n, rows] : want) EXPECT_EQ(padded_decode_rows(n), rows) << n;
  for (int32_t n = 1; n <= 2048; ++n) {
    const int32_t r = padded_decode_rows(n);
    EXPECT_GE(r, n);
    EXPECT_EQ(padded_decode_rows(r), r) << "a padded count pads to itself";
    EXPECT_EQ(n <= 32, r <= 32) << "crosses 32 at " << n;
  }
  EXPECT_THROW(padded_decode_rows(-1), Error);
}

TEST(DecodePadding, OnlyDecodeBatches) {
  KvCacheConfig kc;
  kc.num_pages = 16;
  KvCache cache(kc);
  const SeqId a = cache.create_sequence(), b = cache.create_sequence();
  const ForwardBatch prefill = make_step_batch(cache, {a, b}, {{1, 2, 3}, {4}});
  EXPECT_FALSE(is_decode_batch(prefill));
  EXPECT_FALSE(is_decode_batch(ForwardBatch{}));
  EXPECT_THROW(pad_decode_batch(prefill, 4), Error);
  for (SeqId s : {a, b}) cache.commit(s);
  const ForwardBatch decode = make_step_batch(cache, {a, b}, {{5}, {6}});
  EXPECT_TRUE(is_decode_batch(decode));
  EXPECT_THROW(pad_decode_batch(decode, 1), Error);  // fewer rows than the batch
  const ForwardBatch same = pad_decode_batch(decode, 2);
  EXPECT_EQ(same.tokens, decode.tokens);
  EXPECT_EQ(same.block_table, decode.block_table);
}

// Random K/V in the pages, a decode step of three sequences padded to eight rows: the dummy rows
// write nothing, read one position of a page the batch holds, and the real rows' attention is
// bit for bit what it is unpadded.
TEST(DecodePadding, PaddedRowsAreHarmless) {
  KvCacheConfig kc;
  kc.num_kv_heads = 2;
  kc.head_dim = 64;
  kc.page_size = 16;
  kc.num_pages = 32;
  KvCache cache(kc);
  std::vector<SeqId> seqs;
  std::vector<std::vector<int32_t>> prompts;
  for (int s = 0; s < 3; ++s) {
    seqs.push_back(cache.create_sequence());
    prompts.push_back(std::vector<int32_t>(size_t(5 + 13 * s), 7));
  }
  (void)make_step_batch(cache, seqs, prompts);
  for (SeqId s : seqs) cache.commit(s);
  const ForwardBatch b = make_step_batch(cache, seqs, {{1}, {2}, {3}});
  const ForwardBatch p = pad_decode_batch(b, 8);
  ASSERT_EQ(p.seqs.size(), 8u);
  ASSERT_EQ(p.tokens.size(), 8u);
  ASSERT_EQ(p.logit_rows.size(), 8u);
  for (size_t i = 0; i < 3; ++i) {
    EXPECT_EQ(p.tokens[i], b.tokens[i]);
    EXPECT_EQ(p.slots[i], b.slots[i]);
    EXPECT_EQ(p.logit_rows[i], b.logit_rows[i]);
    EXPECT_EQ(p.kv_len[i], b.kv_len[i]);
  }
  for (size_t i = 3; i < 8; ++i) {
    EXPECT_EQ(p.tokens[i], 0);
    EXPECT_EQ(p.positions[i], 0);
    EXPECT_EQ(p.slots[i], -1);
    EXPECT_EQ(p.kv_len[i], 1);
    EXPECT_EQ(p.q_indptr[i + 1], int32_t(i + 1));
    EXPECT_EQ(p.logit_rows[i], int32_t(i));
    EXPECT_EQ(p.block_table[i * size_t(p.max_pages)], b.block_table[0]);
  }

  // Pools of random values; q of the padded rows random too.
  const PagedKVView view = cache.layer_view(0);
  const int64_t pool = int64_t(kc.num_pages) * kc.num_kv_heads * kc.page_size * kc.head_dim;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd;
  for (int64_t i = 0; i < pool; ++i) {
    static_cast<float*>(view.k_pages)[i] = nd(rng);
    static_cast<float*>(view.v_pages)[i] = nd(rng);
  }
  const int32_t Hq = 4, D = kc.head_dim;
  std::vector<float> q(size_t(8) * Hq * D);
  for (float& x : q) x = nd(rng);
  std::vector<float> out_b(size_t(3) * Hq * D), out_p(size_t(8) * Hq * D, NAN);
  QKVTensor qb{q.data(), DType::f32, 3, Hq, D}, qp{q.data(), DType::f32, 8, Hq, D};
  QKVTensor ob{out_b.data(), DType::f32, 3, Hq, D}, op{out_p.data(), DType::f32, 8, Hq, D};
  paged_attention_cpu(qb, view, attention_layout(b), AttentionOptions{}, ob);
  paged_attention_cpu(qp, view, attention_layout(p), AttentionOptions{}, op);
  EXPECT_EQ(std::memcmp(out_b.data(), out_p.data(), out_b.size() * 4), 0);
  // A dummy row sees one key: its output is that position's V row of its KV head.
  const float* v0 = static_cast<const float*>(view.v_pages) +
                    int64_t(b.block_table[0]) * kc.num_kv_heads * kc.page_size * D;
  for (int32_t h = 0; h < Hq; ++h) {
    const float* o = out_p.data() + (size_t(5) * Hq + h) * D;
    const float* v = v0 + int64_t(h / (Hq / kc.num_kv_heads)) * kc.page_size * D;
    for (int32_t d = 0; d < D; ++d) ASSERT_NEAR(o[d], v[d], 1e-5f) << h << " " << d;
  }
}

}  // namespace
}  // namespace pagedattn
