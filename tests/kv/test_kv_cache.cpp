// KvCache: slots and pages, the block table against a dense model, fork and copy-on-write, the
// prefix cache, LRU eviction and salts.
#include <gtest/gtest.h>

#include <algorithm>
#include <cstring>
#include <numeric>
#include <set>
#include <vector>

#include "kv_test_util.h"

using namespace pagedattn;
using namespace pagedattn::testing_kv;

namespace {

KvCacheConfig small_config(int32_t num_pages, int32_t page_size, DType dtype = DType::f32) {
  KvCacheConfig c;
  c.num_layers = 2;
  c.num_kv_heads = 2;
  c.head_dim = 8;
  c.page_size = page_size;
  c.num_pages = num_pages;
  c.dtype = dtype;
  return c;
}

std::vector<int32_t> iota_tokens(int32_t n, int32_t start = 100) {
  std::vector<int32_t> t(static_cast<size_t>(n));
  std::iota(t.begin(), t.end(), start);
  return t;
}

void expect_accounting(const KvCache& cache) {
  const KvCacheStats s = cache.stats();
  EXPECT_EQ(s.pages_used + s.pages_free + s.pages_cached, s.num_pages);
}

// The bytes of one page (all heads, all slots) of layer l's K pool.
std::vector<uint8_t> page_bytes(const KvCache& cache, int32_t layer, int32_t page, int which) {
  const PagedKVView v = cache.layer_view(layer);
  const size_t n = size_t(v.page_stride()) * dtype_size(v.dtype);
  const auto* base = static_cast<const uint8_t*>(which ? v.v_pages : v.k_pages);
  return std::vector<uint8_t>(base + size_t(page) * n, base + size_t(page + 1) * n);
}

}  // namespace

TEST(KvCache, ConfigAndPoolShapes) {
  KvCache cache(small_config(10, 4));
  EXPECT_EQ(cache.config().num_pages, 10);
  const PagedKVView v = cache.layer_view(1);
  EXPECT_EQ(v.num_pages, 10);
  EXPECT_EQ(v.num_kv_heads, 2);
  EXPECT_EQ(v.page_size, 4);
  EXPECT_EQ(v.head_dim, 8);
  EXPECT_EQ(v.dtype, DType::f32);
  EXPECT_EQ(v.k_scale, nullptr);
  EXPECT_NE(v.k_pages, v.v_pages);
  EXPECT_NE(cache.layer_view(0).k_pages, v.k_pages) << "one pool per layer";
  EXPECT_TRUE(cache.scales_set()) << "non-fp8 caches need no scales";
  const KvCacheStats s = cache.stats();
  EXPECT_EQ(s.num_pages, 10);
  EXPECT_EQ(s.pages_free, 10);
  EXPECT_EQ(s.pages_used + s.pages_cached + s.num_sequences, 0);
}

TEST(KvCache, PageTakenOnlyWhenTheTailOverflows) {
  KvCache cache(small_config(8, 4));
  const SeqId s = cache.create_sequence();
  int32_t expected_pages = 0;
  for (int32_t pos = 0; pos < 13; ++pos) {
    const int32_t need = cache.pages_needed(s, 1);
    EXPECT_EQ(need, pos % 4 == 0 ? 1 : 0) << pos;
    const std::vector<int32_t> slots = cache.append_slots(s, std::vector<int32_t>{pos});
    if (pos % 4 == 0) ++expected_pages;
    ASSERT_EQ(slots.size(), 1u);
    ASSERT_EQ(cache.block_table(s).size(), size_t(expected_pages));
    EXPECT_EQ(slots[0], cache.block_table(s)[size_t(pos / 4)] * 4 + pos % 4);
    EXPECT_EQ(cache.kv_len(s), pos + 1);
    EXPECT_EQ(cache.stats().pages_used, expected_pages);
    EXPECT_EQ(cache.stats().tail_slots_wasted, expected_pages * 4 - (pos + 1));
  }
  // A multi-token append crossing two boundaries takes exactly the pages it spills into.
  EXPECT_EQ(cache.pages_needed(s, 3), 0);
  EXPECT_EQ(cache.pages_needed(s, 4), 1);
  EXPECT_EQ(cache.pages_needed(s, 8), 2);
  EXPECT_EQ(cache.pages_needed(s, 0), 0);
  const std::vector<int32_t> slots = cache.append_slots(s, iota_tokens(8));
  ASSERT_EQ(cache.block_table(s).size(), 6u);
  for (size_t i = 0; i < slots.size(); ++i) {
    const int32_t pos = 13 + int32_t(i);
    EXPECT_EQ(slots[i], cache.block_table(s)[size_t(pos / 4)] * 4 + pos % 4);
  }
  EXPECT_EQ(cache.append_slots(s, {}).size(), 0u);
  EXPECT_EQ(cache.kv_len(s), 21);
  const std::set<int32_t> distinct(cache.block_table(s).begin(), cache.block_table(s).end());
  EXPECT_EQ(distinct.size(), 6u);
}

TEST(KvCache, BlockTableReconstructsDenseOrderForEveryDType) {
  for (DType dt : {DType::f32, DType::f16, DType::bf16}) {
    KvCache cache(small_config(40, 3, dt));
    // Three sequences appended in interleaved chunks, so their pages interleave in the pool.
    std::vector<SeqId> seqs = {cache.create_sequence(), cache.create_sequence("x"),
                               cache.create_sequence()};
    std::vector<std::vector<int32_t>> model(3);
    const int chunks[] = {1, 5, 2, 3, 7, 1, 4};
    int32_t next_token = 0;
    for (int round = 0; round < 7; ++round) {
      for (size_t i = 0; i < 3; ++i) {
        const std::vector<int32_t> toks = iota_tokens(chunks[(round + int(i)) % 7], next_token);
        next_token += int32_t(toks.size());
        append_and_write(cache, seqs[i], toks);
        model[i].insert(model[i].end(), toks.begin(), toks.end());
      }
    }
    for (size_t i = 0; i < 3; ++i) {
      EXPECT_EQ(std::vector<int32_t>(cache.tokens(seqs[i]).begin(), cache.tokens(seqs[i]).end()),
                model[i]);
      EXPECT_TRUE(kv_matches(cache, seqs[i], cache.cache_salt(seqs[i]), model[i]))
          << dtype_name(dt) << " seq " << i;
    }
    expect_accounting(cache);
  }
}

TEST(KvCache, ForkSharesPagesAndCopyOnWriteProtectsTheParent) {
  KvCache cache(small_config(16, 4));
  const SeqId parent = cache.create_sequence();
  const std::vector<int32_t> prefix = iota_tokens(6);  // one full page + 2 slots of the tail
  append_and_write(cache, parent, prefix);
  const std::vector<int32_t> parent_table(cache.block_table(parent).begin(),
                                          cache.block_table(parent).end());
  const std::vector<uint8_t> parent_tail_k = page_bytes(cache, 1, parent_table[1], 0);

  const SeqId child = cache.fork(parent);
  EXPECT_EQ(cache.kv_len(child), 6);
  EXPECT_TRUE(
      std::equal(parent_table.begin(), parent_table.end(), cache.block_table(child).begin()));
  for (int32_t p : parent_table) EXPECT_EQ(cache.refcount(p), 2);
  EXPECT_EQ(cache.stats().pages_used, 2);
  EXPECT_EQ(cache.stats().num_sequences, 2);
  EXPECT_EQ(cache.cache_salt(child), cache.cache_salt(parent));

  // The child writes into the shared partial tail: it gets its own copy (one page), the parent
  // keeps its page and bytes.
  EXPECT_EQ(cache.pages_needed(child, 1), 1);
  std::vector<int32_t> child_tokens = prefix;
  child_tokens.push_back(7777);
  append_and_write(cache, child, std::vector<int32_t>{7777});
  EXPECT_EQ(cache.stats().pages_used, 3);
  EXPECT_EQ(cache.block_table(child)[0], parent_table[0]) << "full pages stay shared";
  EXPECT_NE(cache.block_table(child)[1], parent_table[1]) << "the tail was copied";
  EXPECT_EQ(cache.refcount(parent_table[0]), 2);
  EXPECT_EQ(cache.refcount(parent_table[1]), 1);
  EXPECT_EQ(page_bytes(cache, 1, parent_table[1], 0), parent_tail_k);
  EXPECT_TRUE(kv_matches(cache, parent, "", prefix));
  EXPECT_TRUE(kv_matches(cache, child, "", child_tokens)) << "the child sees the parent's prefix";

  // The parent's tail is no longer shared: it appends in place.
  EXPECT_EQ(cache.pages_needed(parent, 2), 0);
  std::vector<int32_t> parent_tokens = prefix;
  parent_tokens.insert(parent_tokens.end(), {11, 12, 13});
  append_and_write(cache, parent, std::vector<int32_t>{11, 12, 13});
  EXPECT_EQ(cache.block_table(parent)[1], parent_table[1]);
  EXPECT_TRUE(kv_matches(cache, parent, "", parent_tokens));
  EXPECT_TRUE(kv_matches(cache, child, "", child_tokens));

  // Forking at a page boundary shares full pages only: the next append takes a fresh page.
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, iota_tokens(8, 500));
  const SeqId b = cache.fork(a);
  EXPECT_EQ(cache.pages_needed(b, 1), 1);
  append_and_write(cache, b, std::vector<int32_t>{1});
  EXPECT_EQ(cache.refcount(cache.block_table(a)[1]), 2);
  EXPECT_EQ(cache.block_table(b).size(), 3u);

  for (SeqId s : {parent, child, a, b}) cache.free_sequence(s);
  EXPECT_EQ(cache.stats().pages_used, 0);
  expect_accounting(cache);
}

TEST(KvCache, ParentWritingFirstAlsoCopies) {
  // The parent appends into the shared tail before the child does; the child must keep the
  // original bytes.
  KvCache cache(small_config(8, 4));
  const SeqId parent = cache.create_sequence();
  append_and_write(cache, parent, iota_tokens(3));
  const SeqId child = cache.fork(parent);
  std::vector<int32_t> ptoks = iota_tokens(3);
  ptoks.push_back(42);
  append_and_write(cache, parent, std::vector<int32_t>{42});
  EXPECT_NE(cache.block_table(parent)[0], cache.block_table(child)[0]);
  EXPECT_TRUE(kv_matches(cache, child, "", iota_tokens(3)));
  EXPECT_TRUE(kv_matches(cache, parent, "", ptoks));
  std::vector<int32_t> ctoks = iota_tokens(3);
  ctoks.push_back(43);
  EXPECT_EQ(cache.pages_needed(child, 1), 0) << "the child is now the page's only user";
  append_and_write(cache, child, std::vector<int32_t>{43});
  EXPECT_TRUE(kv_matches(cache, child, "", ctoks));
  EXPECT_TRUE(kv_matches(cache, parent, "", ptoks));
}

TEST(KvCache, FreeingReturnsEveryPageExactlyOnce) {
  KvCache cache(small_config(12, 2));
  std::vector<SeqId> seqs;
  seqs.push_back(cache.create_sequence());
  append_and_write(cache, seqs[0], iota_tokens(5));
  seqs.push_back(cache.fork(seqs[0]));
  seqs.push_back(cache.fork(seqs[1]));
  append_and_write(cache, seqs[2], iota_tokens(3));
  seqs.push_back(cache.create_sequence());
  append_and_write(cache, seqs[3], iota_tokens(4));
  cache.commit(seqs[3]);
  for (SeqId s : {seqs[1], seqs[3], seqs[0], seqs[2]}) {
    cache.free_sequence(s);
    EXPECT_FALSE(cache.has_sequence(s));
    expect_accounting(cache);
  }
  const KvCacheStats st = cache.stats();
  EXPECT_EQ(st.pages_used, 0);
  EXPECT_EQ(st.pages_cached, 2) << "seqs[3]'s two committed pages stay cached";
  EXPECT_EQ(st.pages_free, 10);
  EXPECT_EQ(st.num_sequences, 0);
  EXPECT_EQ(st.tail_slots_wasted, 0);
  for (int32_t p = 0; p < 12; ++p) EXPECT_EQ(cache.refcount(p), 0);
  // Every page can be handed out again, each once.
  const SeqId big = cache.create_sequence();
  append_and_write(cache, big, iota_tokens(24));
  const std::set<int32_t> distinct(cache.block_table(big).begin(), cache.block_table(big).end());
  EXPECT_EQ(distinct.size(), 12u);
  EXPECT_EQ(cache.stats().evictions, 2);
}

TEST(KvCache, PrefixHitReturnsIdenticalBytes) {
  KvCache cache(small_config(16, 4));
  const std::vector<int32_t> prompt = iota_tokens(10);
  const SeqId a = cache.create_sequence();
  ASSERT_EQ(cache.attach_prefix(a, prompt), 0) << "nothing cached yet";
  append_and_write(cache, a, prompt);
  cache.commit(a);
  const std::vector<int32_t> a_table(cache.block_table(a).begin(), cache.block_table(a).end());
  EXPECT_TRUE(cache.page_has_hash(a_table[0]));
  EXPECT_TRUE(cache.page_has_hash(a_table[1]));
  EXPECT_FALSE(cache.page_has_hash(a_table[2])) << "partial pages get no hash";
  std::vector<std::vector<uint8_t>> bytes;
  for (int32_t l = 0; l < 2; ++l) {
    for (int which : {0, 1}) {
      for (int i = 0; i < 2; ++i) bytes.push_back(page_bytes(cache, l, a_table[size_t(i)], which));
    }
  }

  // While a is alive: b shares its two full pages.
  const SeqId b = cache.create_sequence();
  ASSERT_EQ(cache.attach_prefix(b, prompt), 8);
  EXPECT_EQ(cache.kv_len(b), 8);
  EXPECT_EQ(cache.block_table(b)[0], a_table[0]);
  EXPECT_EQ(cache.block_table(b)[1], a_table[1]);
  EXPECT_EQ(cache.refcount(a_table[0]), 2);
  append_and_write(cache, b, std::span(prompt).subspan(8));
  EXPECT_TRUE(kv_matches(cache, b, "", prompt));
  EXPECT_NE(cache.block_table(b)[2], a_table[2]);

  // After a and b are gone the pages stay cached; c revives them with byte-equal K/V.
  cache.free_sequence(a);
  cache.free_sequence(b);
  EXPECT_EQ(cache.stats().pages_cached, 2);
  const SeqId c = cache.create_sequence();
  ASSERT_EQ(cache.attach_prefix(c, prompt), 8);
  EXPECT_EQ(cache.stats().pages_cached, 0);
  size_t k = 0;
  for (int32_t l = 0; l < 2; ++l) {
    for (int which : {0, 1}) {
      for (int i = 0; i < 2; ++i) {
        EXPECT_EQ(page_bytes(cache, l, cache.block_table(c)[size_t(i)], which), bytes[k++]);
      }
    }
  }
  const KvCacheStats st = cache.stats();
  EXPECT_EQ(st.prefix_queries, 30);
  EXPECT_EQ(st.prefix_hits, 16);
}

TEST(KvCache, PrefixReuseLimitsAndPartialMatches) {
  KvCache cache(small_config(32, 4));
  const std::vector<int32_t> prompt = iota_tokens(12);
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, prompt);
  cache.commit(a);
  auto attach = [&](std::vector<int32_t> toks, const std::string& salt = "") {
    const SeqId s = cache.create_sequence(salt);
    const int32_t n = cache.attach_prefix(s, toks);
    cache.free_sequence(s);
    return n;
  };
  EXPECT_EQ(attach(prompt), 8) << "at most size - 1 tokens: the last page is recomputed";
  std::vector<int32_t> longer = prompt;
  longer.push_back(1);
  EXPECT_EQ(attach(longer), 12);
  EXPECT_EQ(attach(iota_tokens(8)), 4);
  EXPECT_EQ(attach(iota_tokens(7)), 4);
  EXPECT_EQ(attach(iota_tokens(4)), 0);
  EXPECT_EQ(attach({}), 0);
  std::vector<int32_t> diverge = prompt;
  diverge[5] = -3;  // second page differs
  EXPECT_EQ(attach(diverge), 4);
  diverge[0] = -3;  // first page differs: the chain breaks at once
  EXPECT_EQ(attach(diverge), 0);
  EXPECT_EQ(attach(longer, "tenant"), 0) << "another salt never matches";
  // Uncommitted full pages are not reusable.
  const SeqId u = cache.create_sequence();
  append_and_write(cache, u, iota_tokens(9, 900));
  EXPECT_EQ(attach(iota_tokens(9, 900)), 0);
  cache.commit(u);
  EXPECT_EQ(attach(iota_tokens(9, 900)), 8);
}

// commit(seq, written) hashes only the full pages within the written positions; set_token
// replaces a stand-in id recorded for a reserved position until its page has its hash.
TEST(KvCache, CommitUpToWrittenAndSetToken) {
  KvCache cache(small_config(32, 4));
  auto attach = [&](const std::vector<int32_t>& toks) {
    const SeqId s = cache.create_sequence();
    const int32_t n = cache.attach_prefix(s, toks);
    cache.free_sequence(s);
    return n;
  };
  std::vector<int32_t> toks = iota_tokens(10);
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, toks);
  toks.push_back(-1);  // a stand-in for an id not known yet
  cache.append_slots(a, std::vector<int32_t>{-1});
  cache.commit(a, 7);  // positions 0..6 written: one full page
  toks.back() = 555;
  EXPECT_EQ(attach(toks), 4);
  EXPECT_THROW(cache.set_token(a, 2, 7), Error);   // its page has its hash
  EXPECT_THROW(cache.set_token(a, 11, 7), Error);  // not reserved
  EXPECT_THROW(cache.commit(a, 12), Error);        // past kv_len
  cache.set_token(a, 10, 555);
  EXPECT_EQ(cache.tokens(a)[10], 555);
  cache.commit(a);  // every reserved position: two full pages
  EXPECT_EQ(attach(toks), 8);
  cache.commit(a, 3);  // nothing to take back
  EXPECT_EQ(attach(toks), 8);
  cache.free_sequence(a);
  expect_accounting(cache);
}

TEST(KvCache, DifferentSaltsNeverSharePages) {
  KvCache cache(small_config(32, 4));
  const std::vector<int32_t> prompt = iota_tokens(9);
  std::vector<SeqId> seqs;
  for (const std::string salt : {"", "alice", "bob", ""}) {
    const SeqId s = cache.create_sequence(salt);
    const int32_t reused = cache.attach_prefix(s, prompt);
    EXPECT_EQ(reused, seqs.size() == 3 ? 8 : 0) << "salt '" << salt << "'";
    append_and_write(cache, s, std::span(prompt).subspan(size_t(reused)));
    cache.commit(s);
    EXPECT_TRUE(kv_matches(cache, s, salt, prompt));
    seqs.push_back(s);
  }
  for (size_t i = 0; i < 3; ++i) {
    for (size_t j = i + 1; j < 3; ++j) {
      for (int32_t p : cache.block_table(seqs[i])) {
        for (int32_t q : cache.block_table(seqs[j])) EXPECT_NE(p, q) << i << " vs " << j;
      }
    }
  }
  // A fork inherits the salt, so it hits where its parent would.
  const SeqId f = cache.fork(seqs[1]);
  EXPECT_EQ(cache.cache_salt(f), "alice");
  cache.free_sequence(f);
  const SeqId g = cache.create_sequence("alice");
  ASSERT_EQ(cache.attach_prefix(g, prompt), 8);
  EXPECT_EQ(cache.block_table(g)[0], cache.block_table(seqs[1])[0]);
}

TEST(KvCache, IdenticalPagesAreNotRegisteredTwice) {
  KvCache cache(small_config(16, 4));
  const std::vector<int32_t> prompt = iota_tokens(8);
  const SeqId a = cache.create_sequence(), b = cache.create_sequence();
  append_and_write(cache, a, prompt);
  append_and_write(cache, b, prompt);  // computed independently: same content, other pages
  cache.commit(a);
  cache.commit(b);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_TRUE(cache.page_has_hash(cache.block_table(a)[i]));
    EXPECT_FALSE(cache.page_has_hash(cache.block_table(b)[i])) << "the first mapping is kept";
  }
  const std::vector<int32_t> a_table(cache.block_table(a).begin(), cache.block_table(a).end());
  cache.free_sequence(b);
  EXPECT_EQ(cache.stats().pages_free, 14) << "unhashed copies return to the free list";
  EXPECT_EQ(cache.stats().pages_cached, 0);
  cache.free_sequence(a);
  EXPECT_EQ(cache.stats().pages_cached, 2);
  const SeqId c = cache.create_sequence();
  std::vector<int32_t> longer = prompt;
  longer.push_back(0);
  ASSERT_EQ(cache.attach_prefix(c, longer), 8);
  EXPECT_EQ(cache.block_table(c)[0], a_table[0]);
  EXPECT_EQ(cache.block_table(c)[1], a_table[1]);
  // Committing again hashes nothing new.
  cache.commit(c);
  EXPECT_EQ(cache.stats().pages_used, 2);
}

TEST(KvCache, LruEvictsTheDeepestPageFirstAndRevivedPagesLeaveIt) {
  KvCache cache(small_config(6, 2));
  const std::vector<int32_t> prompt = iota_tokens(6);  // three full pages
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, prompt);
  cache.commit(a);
  const std::vector<int32_t> t(cache.block_table(a).begin(), cache.block_table(a).end());
  cache.free_sequence(a);
  EXPECT_EQ(cache.allocator().lru_order(), (std::vector<int32_t>{t[2], t[1], t[0]}));

  // Take the three free pages, then one more: the deepest cached page (t[2]) is evicted.
  const SeqId filler = cache.create_sequence();
  append_and_write(cache, filler, iota_tokens(6, 1000));
  EXPECT_EQ(cache.stats().evictions, 0);
  append_and_write(cache, filler, iota_tokens(2, 2000));
  EXPECT_EQ(cache.stats().evictions, 1);
  EXPECT_EQ(cache.block_table(filler).back(), t[2]);
  EXPECT_FALSE(cache.page_has_hash(t[2]));
  EXPECT_EQ(cache.allocator().lru_order(), (std::vector<int32_t>{t[1], t[0]}));

  // The surviving chain is still reusable: t[0], t[1] are revived and leave the LRU list.
  const SeqId b = cache.create_sequence();
  ASSERT_EQ(cache.attach_prefix(b, prompt), 4);
  EXPECT_TRUE(cache.allocator().lru_order().empty());
  EXPECT_EQ(cache.refcount(t[0]), 1);
  EXPECT_EQ(cache.refcount(t[1]), 1);
  EXPECT_TRUE(kv_matches(cache, b, "", std::vector<int32_t>(prompt.begin(), prompt.begin() + 4)));

  // No page is available now: an append that needs one fails and changes nothing, and the
  // referenced pages are never evicted.
  EXPECT_FALSE(cache.can_append(b, 1));
  const std::vector<SeqId> all = {filler, b};
  const Snapshot before = Snapshot::take(cache, all);
  EXPECT_THROW(cache.append_slots(b, std::vector<int32_t>{4}), Error);
  EXPECT_TRUE(Snapshot::take(cache, all) == before);
  EXPECT_TRUE(kv_matches(cache, b, "", std::vector<int32_t>(prompt.begin(), prompt.begin() + 4)));
}

TEST(KvCache, EvictionPrefersReleasedChainsInReleaseOrder) {
  KvCache cache(small_config(4, 1));
  const SeqId a = cache.create_sequence(), b = cache.create_sequence();
  append_and_write(cache, a, iota_tokens(2, 10));
  append_and_write(cache, b, iota_tokens(2, 20));
  cache.commit(a);
  cache.commit(b);
  const std::vector<int32_t> ta(cache.block_table(a).begin(), cache.block_table(a).end());
  const std::vector<int32_t> tb(cache.block_table(b).begin(), cache.block_table(b).end());
  cache.free_sequence(b);
  cache.free_sequence(a);
  EXPECT_EQ(cache.allocator().lru_order(), (std::vector<int32_t>{tb[1], tb[0], ta[1], ta[0]}));
  const SeqId c = cache.create_sequence();
  append_and_write(cache, c, std::vector<int32_t>{99});
  EXPECT_EQ(cache.block_table(c)[0], tb[1]);
  EXPECT_EQ(cache.stats().evictions, 1);
}

TEST(KvCache, PrefixCacheDisabled) {
  KvCacheConfig c = small_config(8, 2);
  c.enable_prefix_cache = false;
  KvCache cache(c);
  const SeqId a = cache.create_sequence();
  append_and_write(cache, a, iota_tokens(5));
  cache.commit(a);
  EXPECT_FALSE(cache.page_has_hash(cache.block_table(a)[0]));
  cache.free_sequence(a);
  EXPECT_EQ(cache.stats().pages_free, 8);
  const SeqId b = cache.create_sequence();
  ASSERT_EQ(cache.attach_prefix(b, iota_tokens(5)), 0);
  EXPECT_EQ(cache.kv_len(b), 0);
}

TEST(KvCache, CudaPoolsWithoutDeviceRaiseError) {
  if (cuda_device_count() > 0) GTEST_SKIP() << "a CUDA device is present";
  KvCacheConfig c = small_config(4, 4);
  c.device = Device::cuda;
  EXPECT_THROW(KvCache cache(c), Error);
}

TEST(KvCache, CudaPoolsCopyOnWrite) {
  if (cuda_device_count() == 0) GTEST_SKIP() << "no CUDA device";
  KvCacheConfig c = small_config(8, 4);
  c.device = Device::cuda;
  KvCache cache(c);
  const SeqId parent = cache.create_sequence();
  cache.append_slots(parent, iota_tokens(3));
  // Fill the parent's page in every layer's K and V pool from the host.
  const PagedKVView v0 = cache.layer_view(0);
  const size_t page_bytes_n = size_t(v0.page_stride()) * sizeof(float);
  const int32_t page = cache.block_table(parent)[0];
  std::vector<float> host(size_t(v0.page_stride()));
  for (int32_t l = 0; l < c.num_layers; ++l) {
    for (int which : {0, 1}) {
      for (size_t i = 0; i < host.size(); ++i) host[i] = float(l * 1000 + which * 100) + float(i);
      void* pool = which ? cache.layer_view(l).v_pages : cache.layer_view(l).k_pages;
      copy_bytes(static_cast<uint8_t*>(pool) + size_t(page) * page_bytes_n, Device::cuda,
                 host.data(), Device::cpu, page_bytes_n);
    }
  }
  const SeqId child = cache.fork(parent);
  cache.append_slots(child, std::vector<int32_t>{9});
  const int32_t copy = cache.block_table(child)[0];
  ASSERT_NE(copy, page);
  std::vector<float> back(host.size());
  for (int32_t l = 0; l < c.num_layers; ++l) {
    for (int which : {0, 1}) {
      const void* pool = which ? cache.layer_view(l).v_pages : cache.layer_view(l).k_pages;
      copy_bytes(back.data(), Device::cpu,
                 static_cast<const uint8_t*>(pool) + size_t(copy) * page_bytes_n, Device::cuda,
                 page_bytes_n);
      for (int32_t h = 0; h < c.num_kv_heads; ++h) {
        for (int32_t s = 0; s < 3; ++s) {  // the three filled slots were copied
          for (int32_t d = 0; d < c.head_dim; ++d) {
            const size_t i = size_t(v0.offset(0, h, s) + d);
            ASSERT_EQ(back[i], float(l * 1000 + which * 100) + float(i));
          }
        }
      }
    }
  }
}
