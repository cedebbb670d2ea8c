// KvCache swap: a sequence's pages copied to host memory and back. Every value comes back, the
// pages it held go back to the pool (its full ones to the prefix cache), swap_in attaches what the
// prefix cache still holds and copies the rest, and a swap_in that cannot be done changes nothing.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <vector>

#include "kv/host_copy.h"
#include "kv_test_util.h"

using namespace pagedattn;
using namespace pagedattn::testing_kv;

namespace {

KvCacheConfig config(int32_t num_pages, DType dtype = DType::f32, bool prefix_cache = true) {
  KvCacheConfig c;
  c.num_layers = 3;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.page_size = 4;
  c.num_pages = num_pages;
  c.dtype = dtype;
  c.enable_prefix_cache = prefix_cache;
  return c;
}

std::vector<int32_t> tokens_from(int32_t n, int32_t start) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

void set_unit_scales(KvCache& cache) {
  const std::vector<float> s(size_t(cache.config().num_kv_heads), 0.5f);
  for (int32_t l = 0; l < cache.config().num_layers; ++l) cache.set_scales(l, s, s);
}

void expect_accounting(const KvCache& cache) {
  const KvCacheStats s = cache.stats();
  EXPECT_EQ(s.pages_used + s.pages_free + s.pages_cached, s.num_pages);
}

}  // namespace

TEST(KvSwap, EveryValueComesBackAfterThePoolIsReused) {
  for (DType dtype : {DType::f32, DType::bf16, DType::fp8_e4m3}) {
    for (bool prefix_cache : {true, false}) {
      SCOPED_TRACE(std::string(dtype_name(dtype)) + (prefix_cache ? " prefix" : " no-prefix"));
      KvCache cache(config(12, dtype, prefix_cache));
      if (dtype == DType::fp8_e4m3) set_unit_scales(cache);
      const std::vector<int32_t> toks = tokens_from(23, 7);  // 5 full pages and a tail of 3
      const SeqId a = cache.create_sequence("salt");
      append_and_write(cache, a, toks);
      cache.commit(a);
      EXPECT_EQ(cache.swap_bytes(23), size_t(6) * 3 * 2 * (2 * 4 * 8) * dtype_size(dtype));

      const SwappedKv kv = cache.swap_out(a);
      EXPECT_FALSE(cache.has_sequence(a));
      EXPECT_EQ(kv.tokens, toks);
      EXPECT_EQ(kv.salt, "salt");
      EXPECT_EQ(kv.bytes, cache.swap_bytes(23));
      EXPECT_EQ(cache.stats().pages_used, 0);
      expect_accounting(cache);

      // Another sequence takes every page and writes other values over them.
      const SeqId b = cache.create_sequence("other");
      append_and_write(cache, b, tokens_from(48, 1000));
      EXPECT_EQ(cache.stats().pages_cached, 0);  // the swapped sequence's cached pages evicted
      cache.free_sequence(b);

      EXPECT_EQ(cache.swap_in_pages(kv), 6);
      const SeqId c = cache.swap_in(kv);
      EXPECT_TRUE(kv_matches(cache, c, "salt", toks));
      EXPECT_EQ(cache.cache_salt(c), "salt");
      // It goes on growing where it stopped.
      append_and_write(cache, c, tokens_from(3, 30));
      std::vector<int32_t> grown = toks;
      for (int32_t t : tokens_from(3, 30)) grown.push_back(t);
      EXPECT_TRUE(kv_matches(cache, c, "salt", grown));
      expect_accounting(cache);
      if (prefix_cache) {
        // Its full pages were hashed again: a new request with the same salt and tokens finds them.
        cache.commit(c);
        const SeqId d = cache.create_sequence("salt");
        EXPECT_EQ(cache.attach_prefix(d, grown), 24);
      }
    }
  }
}

TEST(KvSwap, SwapInAttachesThePagesThePrefixCacheStillHolds) {
  KvCache cache(config(16));
  const std::vector<int32_t> toks = tokens_from(18, 3);  // 4 full pages, tail of 2
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, toks);
  cache.commit(a);
  const SwappedKv kv = cache.swap_out(a);
  EXPECT_EQ(cache.stats().pages_cached, 4);  // its full pages, in the prefix cache
  // The cached pages are revived (they count: nothing else could take them then), the tail copied.
  EXPECT_EQ(cache.swap_in_pages(kv), 5);
  const int64_t resume_before = cache.stats().resume_hits;
  const SeqId b = cache.swap_in(kv);
  EXPECT_EQ(cache.stats().resume_hits - resume_before, 16);
  EXPECT_EQ(cache.stats().pages_cached, 0);
  EXPECT_TRUE(kv_matches(cache, b, "", toks));

  // Pages that a live sequence shares cost nothing: swap out a fork's parent, the child keeps them.
  const SeqId child = cache.fork(b);
  const SwappedKv kb = cache.swap_out(b);
  EXPECT_TRUE(kv_matches(cache, child, "", toks));
  EXPECT_EQ(cache.swap_in_pages(kb), 1);  // only the partial tail page is copied back
  const SeqId b2 = cache.swap_in(kb);
  EXPECT_TRUE(kv_matches(cache, b2, "", toks));
  EXPECT_EQ(cache.block_table(b2).subspan(0, 4)[3], cache.block_table(child)[3]);
  EXPECT_NE(cache.block_table(b2)[4], cache.block_table(child)[4]);
  expect_accounting(cache);
}

TEST(KvSwap, SwapInThatDoesNotFitChangesNothing) {
  KvCache cache(config(8, DType::f32, false));
  const std::vector<int32_t> toks = tokens_from(14, 50);  // 4 pages
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, toks);
  const SwappedKv kv = cache.swap_out(a);
  const SeqId b = cache.create_sequence();
  append_and_write(cache, b, tokens_from(20, 200));  // 5 of the 8 pages: 3 left
  const std::vector<SeqId> seqs = {b};
  const Snapshot before = Snapshot::take(cache, seqs);
  try {
    cache.swap_in(kv);
    FAIL() << "swap_in of 4 pages into 3 did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("need 4 pages but only 3"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(before == Snapshot::take(cache, seqs));
  cache.free_sequence(b);
  const SeqId c = cache.swap_in(kv);
  EXPECT_TRUE(kv_matches(cache, c, "", toks));
}

TEST(KvSwap, RefusesASwappedSequenceOfAnotherShapeOrSequence) {
  KvCache cache(config(8));
  KvCacheConfig wide = config(8);
  wide.head_dim = 16;
  KvCache other(wide);
  const SeqId a = other.create_sequence();
  append_and_write(other, a, tokens_from(6, 1));
  const SwappedKv kv = other.swap_out(a);
  const Snapshot before = Snapshot::take(cache, {});
  try {
    cache.swap_in(kv);
    FAIL() << "a swapped sequence of head_dim 16 went into a cache of head_dim 8";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("swap_in"), std::string::npos) << e.what();
  }
  EXPECT_TRUE(before == Snapshot::take(cache, {}));
  try {
    cache.swap_out(42);
    FAIL() << "swap_out of an unknown sequence did not throw";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("unknown seq 42"), std::string::npos) << e.what();
  }
}

TEST(KvSwap, AnEmptySequenceSwapsToNothing) {
  KvCache cache(config(4));
  const SeqId a = cache.create_sequence("s");
  const SwappedKv kv = cache.swap_out(a);
  EXPECT_EQ(kv.bytes, 0u);
  EXPECT_EQ(cache.swap_in_pages(kv), 0);
  const SeqId b = cache.swap_in(kv);
  EXPECT_EQ(cache.kv_len(b), 0);
  EXPECT_EQ(cache.cache_salt(b), "s");
}

TEST(KvSwapHostPool, PagesGivenBackServeTheNextSwap) {
  auto pool = std::make_shared<kv::HostPool>(Device::cpu, 1000);
  auto a = kv::HostPool::take(pool, 3);
  ASSERT_EQ(a->size(), 3u);
  const std::vector<uint8_t*> first = *a;
  for (uint8_t* p : first) std::memset(p, 1, 1000);  // each page holds its 1000 bytes
  auto b = kv::HostPool::take(pool, 2);
  for (uint8_t* p : *b)
    for (uint8_t* q : first) EXPECT_NE(p, q) << "a page handed out twice";
  a.reset();  // back to the pool
  auto c = kv::HostPool::take(pool, 3);
  std::vector<uint8_t*> again = *c;
  std::sort(again.begin(), again.end());
  std::vector<uint8_t*> sorted = first;
  std::sort(sorted.begin(), sorted.end());
  EXPECT_EQ(again, sorted);
  // The pages outlive the pool's last other owner; a request larger than a chunk is served.
  pool.reset();
  for (uint8_t* p : *c) std::memset(p, 2, 1000);
  auto big = std::make_shared<kv::HostPool>(Device::cpu, size_t(8) << 20);
  EXPECT_EQ(kv::HostPool::take(big, 9)->size(), 9u);
}

// Memory reserved ahead serves the swaps: they take no more.
TEST(KvSwapHostPool, ReservedMemoryServesTheSwaps) {
  auto pool = std::make_shared<kv::HostPool>(Device::cpu, size_t(1) << 20);
  const size_t reserved = pool->reserve(size_t(40) << 20);
  // Whole chunks of 32 pages until at least the bytes asked for, and no more.
  EXPECT_EQ(reserved, size_t(64) << 20);
  EXPECT_EQ(pool->reserved_bytes(), reserved);
  EXPECT_EQ(pool->reserve(size_t(10) << 20), reserved) << "already held: nothing more taken";
  auto a = kv::HostPool::take(pool, 40);
  auto b = kv::HostPool::take(pool, 20);
  EXPECT_EQ(pool->reserved_bytes(), reserved) << "the swaps should have used the reserve";
  for (uint8_t* p : *a) std::memset(p, 3, size_t(1) << 20);
  auto c = kv::HostPool::take(pool, 5);  // beyond the reserve: one more chunk
  EXPECT_EQ(pool->reserved_bytes(), reserved + (size_t(32) << 20));
}
