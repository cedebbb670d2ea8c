// KvCache: fp8 e4m3 pools with per-head scales, and pools of more than 65,536 pages.
#include <gtest/gtest.h>

#include <cmath>
#include <string>
#include <vector>

#include "kv_test_util.h"

using namespace pagedattn;
using namespace pagedattn::testing_kv;

namespace {

KvCacheConfig fp8_config() {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 3;
  c.head_dim = 8;
  c.page_size = 4;
  c.num_pages = 8;
  c.dtype = DType::fp8_e4m3;
  return c;
}

}  // namespace

TEST(KvCacheFp8, WritesNeedScalesFirst) {
  KvCache cache(fp8_config());
  EXPECT_FALSE(cache.scales_set());
  const SeqId s = cache.create_sequence();
  const std::vector<SeqId> seqs = {s};
  const Snapshot before = Snapshot::take(cache, seqs);
  EXPECT_THROW(cache.append_slots(s, std::vector<int32_t>{1}), Error);
  EXPECT_TRUE(Snapshot::take(cache, seqs) == before);
  // The view has no scale pointers, and the write path refuses it (never a default of 1.0).
  const PagedKVView v = cache.layer_view(0);
  EXPECT_EQ(v.k_scale, nullptr);
  EXPECT_EQ(v.v_scale, nullptr);
  const int32_t slot = 0;
  std::vector<float> kv(size_t(3 * 8), 0.5f);
  EXPECT_THROW(write_kv_cpu(v, &slot, 1, kv.data(), kv.data(), DType::f32), Error);

  const std::vector<float> k = {1.f, 2.f, 0.5f}, vs = {0.25f, 1.f, 4.f};
  cache.set_scales(0, k, vs);
  EXPECT_FALSE(cache.scales_set()) << "layer 1 still has none";
  try {
    cache.append_slots(s, std::vector<int32_t>{1});
    ADD_FAILURE() << "append before every layer has scales";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind("append_slots:", 0), 0u) << e.what();
    EXPECT_NE(std::string(e.what()).find("layer 1"), std::string::npos) << e.what();
  }
  cache.set_scales(1, k, vs);
  EXPECT_TRUE(cache.scales_set());
  EXPECT_EQ(cache.append_slots(s, std::vector<int32_t>{1}).size(), 1u);
}

TEST(KvCacheFp8, SetScalesValidates) {
  KvCache cache(fp8_config());
  const std::vector<float> good = {1.f, 1.f, 1.f};
  auto expect_bad = [&](int32_t layer, std::vector<float> k, std::vector<float> v,
                        const std::string& arg) {
    try {
      cache.set_scales(layer, k, v);
      ADD_FAILURE() << "accepted bad scales (" << arg << ")";
    } catch (const Error& e) {
      const std::string msg = e.what();
      EXPECT_EQ(msg.rfind("set_scales:", 0), 0u) << msg;
      EXPECT_NE(msg.find(arg), std::string::npos) << msg;
    }
    EXPECT_FALSE(cache.scales_set());
  };
  const float nan = std::numeric_limits<float>::quiet_NaN();
  const float inf = std::numeric_limits<float>::infinity();
  expect_bad(-1, good, good, "layer");
  expect_bad(2, good, good, "layer");
  expect_bad(0, {1.f, 1.f}, good, "k_scale");
  expect_bad(0, good, {1.f, 1.f, 1.f, 1.f}, "v_scale");
  expect_bad(0, {1.f, 0.f, 1.f}, good, "k_scale[1]");
  expect_bad(0, good, {1.f, 1.f, -2.f}, "v_scale[2]");
  expect_bad(0, {nan, 1.f, 1.f}, good, "k_scale[0]");
  expect_bad(0, good, {1.f, inf, 1.f}, "v_scale[1]");
  EXPECT_EQ(cache.layer_view(0).k_scale, nullptr) << "a rejected call sets nothing";
  cache.set_scales(0, good, good);
  try {
    cache.set_scales(0, good, good);
    ADD_FAILURE() << "scales changed after being set";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("already"), std::string::npos) << e.what();
  }
}

TEST(KvCacheFp8, RoundTripWithinFp8Tolerance) {
  KvCache cache(fp8_config());
  // Per-layer, per-head scales chosen so that the values (|x| < 2) use different parts of the
  // e4m3 range, including the subnormals.
  const std::vector<std::vector<float>> kscales = {{2.f / 448.f, 1.f / 64.f, 0.5f},
                                                   {1.f / 200.f, 3.f, 2.f / 448.f}};
  const std::vector<std::vector<float>> vscales = {{0.01f, 0.02f, 0.03f}, {1.f, 2.f / 448.f, 0.1f}};
  for (int32_t l = 0; l < 2; ++l) cache.set_scales(l, kscales[size_t(l)], vscales[size_t(l)]);
  const PagedKVView v0 = cache.layer_view(0);
  ASSERT_NE(v0.k_scale, nullptr);
  EXPECT_EQ(v0.k_scale[1], 1.f / 64.f);
  EXPECT_EQ(v0.v_scale[2], 0.03f);

  const SeqId s = cache.create_sequence();
  std::vector<int32_t> tokens;
  for (int32_t i = 0; i < 23; ++i) tokens.push_back(i * 7 + 1);
  append_and_write(cache, s, tokens);
  const std::vector<uint64_t> keys = prefix_keys("", tokens);
  for (int32_t l = 0; l < 2; ++l) {
    for (int32_t p = 0; p < 23; ++p) {
      for (int32_t h = 0; h < 3; ++h) {
        for (int32_t d = 0; d < 8; ++d) {
          for (int which : {0, 1}) {
            const float x = kv_value(keys[size_t(p)], l, h, d, which);
            const float scale = (which ? vscales : kscales)[size_t(l)][size_t(h)];
            const float got = read_kv(cache, s, l, p, h, d, which);
            // Exactly the e4m3 rounding of x / scale (saturating), times the scale.
            const float q = fp8e4m3_to_f32(f32_to_fp8e4m3(x * (1.f / scale)));
            ASSERT_EQ(got, q * scale) << l << " " << p << " " << h << " " << d;
            // And within fp8's error: half an ulp (2^-4 relative) or half the subnormal step.
            const float xs = x / scale;
            if (std::fabs(xs) <= 448.f) {
              const float tol = std::max(std::fabs(x) * 0.0625f, scale * std::ldexp(1.f, -10));
              ASSERT_LE(std::fabs(got - x), tol * 1.0001f) << x << " scale " << scale;
            } else {
              ASSERT_EQ(std::fabs(got), 448.f * scale) << "saturated";
            }
          }
        }
      }
    }
  }
  // A fork with copy-on-write keeps the fp8 bytes exactly.
  const SeqId c = cache.fork(s);
  std::vector<int32_t> longer = tokens;
  longer.push_back(5);
  append_and_write(cache, c, std::vector<int32_t>{5});
  EXPECT_NE(cache.block_table(c).back(), cache.block_table(s).back());
  EXPECT_TRUE(kv_matches(cache, c, "", longer));
  EXPECT_TRUE(kv_matches(cache, s, "", tokens));
}

TEST(KvCacheLarge, MoreThan65536PagesEndToEnd) {
  KvCacheConfig c;
  c.num_layers = 1;
  c.num_kv_heads = 1;
  c.head_dim = 2;
  c.page_size = 1;
  c.num_pages = 70000;
  KvCache cache(c);
  // One sequence fills every page: the last ~4,500 pages have ids above 65,535.
  std::vector<int32_t> tokens(70000);
  for (int32_t i = 0; i < 70000; ++i) tokens[size_t(i)] = (i * 2654435761u) % 50000;
  const SeqId s = cache.create_sequence();
  const std::vector<int32_t> slots = append_and_write(cache, s, tokens);
  EXPECT_EQ(cache.stats().pages_free, 0);
  int32_t high = 0;
  for (int32_t p : cache.block_table(s)) high += p > 65535;
  EXPECT_EQ(high, 70000 - 65536);
  EXPECT_TRUE(kv_matches(cache, s, "", tokens));
  // The raw pool at a high page id holds exactly what was written there.
  const PagedKVView v = cache.layer_view(0);
  const std::vector<uint64_t> keys = prefix_keys("", tokens);
  for (int32_t pos = 0; pos < 70000; ++pos) {
    const int32_t page = cache.block_table(s)[size_t(pos)];
    if (page < 69990) continue;
    EXPECT_EQ(slots[size_t(pos)], page);
    const float* k = static_cast<const float*>(v.k_pages) + v.offset(page, 0, 0);
    EXPECT_EQ(k[1], kv_value(keys[size_t(pos)], 0, 0, 1, 0)) << "page " << page;
  }
  // Prefix cache over high page ids: commit, free, reattach everything but the last token.
  cache.commit(s);
  const std::vector<int32_t> table(cache.block_table(s).begin(), cache.block_table(s).end());
  cache.free_sequence(s);
  EXPECT_EQ(cache.stats().pages_cached, 70000);
  const SeqId r = cache.create_sequence();
  ASSERT_EQ(cache.attach_prefix(r, tokens), 69999);
  EXPECT_TRUE(std::equal(cache.block_table(r).begin(), cache.block_table(r).end(), table.begin()));
  EXPECT_TRUE(kv_matches(cache, r, "", std::span(tokens).first(69999)));
  // The last token takes the one cached page left (an eviction).
  append_and_write(cache, r, std::span(tokens).last(1));
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_TRUE(kv_matches(cache, r, "", tokens));
}

TEST(KvCacheLarge, InterleavedSequencesOnHighPageIds) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 2;
  c.page_size = 2;
  c.num_pages = 70000;
  KvCache cache(c);
  // Burn through the low ids, then write two interleaved sequences onto pages above 65,535.
  const SeqId low = cache.create_sequence();
  cache.append_slots(low, std::vector<int32_t>(2 * 65536, 3));
  std::vector<SeqId> seqs = {cache.create_sequence(), cache.create_sequence("s")};
  std::vector<std::vector<int32_t>> model(2);
  for (int round = 0; round < 300; ++round) {
    for (size_t i = 0; i < 2; ++i) {
      const std::vector<int32_t> t(size_t(1 + (round + int(i)) % 5), round * 10 + int32_t(i));
      append_and_write(cache, seqs[i], t);
      model[i].insert(model[i].end(), t.begin(), t.end());
    }
  }
  for (size_t i = 0; i < 2; ++i) {
    for (int32_t p : cache.block_table(seqs[i])) ASSERT_GT(p, 65535);
    EXPECT_TRUE(kv_matches(cache, seqs[i], cache.cache_salt(seqs[i]), model[i]));
  }
}
