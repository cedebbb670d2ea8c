// BlockAllocator: the free list, the LRU list of cached pages, reference counts and their errors.
#include <gtest/gtest.h>

#include <string>
#include <vector>

#include "pagedattn/block_allocator.h"
#include "pagedattn/error.h"

using namespace pagedattn;

namespace {

auto no_evict = [](int32_t page) { ADD_FAILURE() << "unexpected eviction of page " << page; };

void expect_counts(const BlockAllocator& a, int32_t free, int32_t cached, int32_t used) {
  EXPECT_EQ(a.num_free(), free);
  EXPECT_EQ(a.num_cached(), cached);
  EXPECT_EQ(a.num_used(), used);
  EXPECT_EQ(a.num_free() + a.num_cached() + a.num_used(), a.num_pages());
  EXPECT_EQ(a.num_available(), free + cached);
}

template <class F>
void expect_error(F&& f, const std::string& prefix) {
  try {
    f();
    ADD_FAILURE() << "no Error (expected one starting with '" << prefix << "')";
  } catch (const Error& e) {
    EXPECT_EQ(std::string(e.what()).rfind(prefix, 0), 0u) << e.what();
  }
}

}  // namespace

TEST(BlockAllocator, AllocatesEveryPageOnceThenThrows) {
  BlockAllocator a(5);
  expect_counts(a, 5, 0, 0);
  std::vector<bool> seen(5, false);
  for (int i = 0; i < 5; ++i) {
    const int32_t p = a.alloc(no_evict);
    ASSERT_GE(p, 0);
    ASSERT_LT(p, 5);
    EXPECT_FALSE(seen[size_t(p)]) << "page " << p << " handed out twice";
    seen[size_t(p)] = true;
    EXPECT_EQ(a.refcount(p), 1);
  }
  expect_counts(a, 0, 0, 5);
  expect_error([&] { a.alloc(no_evict); }, "BlockAllocator::alloc:");
  expect_counts(a, 0, 0, 5);
}

TEST(BlockAllocator, RefcountsAndRelease) {
  BlockAllocator a(3);
  const int32_t p = a.alloc(no_evict);
  a.incref(p);
  a.incref(p);
  EXPECT_EQ(a.refcount(p), 3);
  EXPECT_EQ(a.decref(p, false), 2);
  EXPECT_EQ(a.decref(p, false), 1);
  expect_counts(a, 2, 0, 1);
  EXPECT_EQ(a.decref(p, false), 0);
  EXPECT_TRUE(a.is_free(p));
  expect_counts(a, 3, 0, 0);
  // Released without a hash -> free list (FIFO: it comes back last).
  EXPECT_NE(a.alloc(no_evict), p);
}

TEST(BlockAllocator, CachedPagesEvictedInLruOrder) {
  BlockAllocator a(4);
  std::vector<int32_t> pages;
  for (int i = 0; i < 4; ++i) pages.push_back(a.alloc(no_evict));
  // Release 2, 0, 3 with hashes, 1 without.
  a.decref(pages[2], true);
  a.decref(pages[0], true);
  a.decref(pages[1], false);
  a.decref(pages[3], true);
  expect_counts(a, 1, 3, 0);
  EXPECT_EQ(a.lru_order(), (std::vector<int32_t>{pages[2], pages[0], pages[3]}));
  // The free page goes first, without eviction.
  EXPECT_EQ(a.alloc(no_evict), pages[1]);
  // Then the least recently released cached page, with the callback before it is reused.
  std::vector<int32_t> evicted;
  auto on_evict = [&](int32_t p) {
    EXPECT_TRUE(a.is_cached(p)) << "callback runs before the page leaves the LRU";
    evicted.push_back(p);
  };
  EXPECT_EQ(a.alloc(on_evict), pages[2]);
  EXPECT_EQ(a.alloc(on_evict), pages[0]);
  EXPECT_EQ(evicted, (std::vector<int32_t>{pages[2], pages[0]}));
  EXPECT_EQ(a.lru_order(), (std::vector<int32_t>{pages[3]}));
  expect_counts(a, 0, 1, 3);
}

TEST(BlockAllocator, ReviveFromTheMiddleOfTheLru) {
  BlockAllocator a(6);
  std::vector<int32_t> pages;
  for (int i = 0; i < 6; ++i) pages.push_back(a.alloc(no_evict));
  for (int32_t p : pages) a.decref(p, true);
  EXPECT_EQ(a.lru_order(), pages);
  a.revive(pages[3]);
  EXPECT_EQ(a.refcount(pages[3]), 1);
  EXPECT_FALSE(a.is_cached(pages[3]));
  a.revive(pages[0]);
  a.revive(pages[5]);
  EXPECT_EQ(a.lru_order(), (std::vector<int32_t>{pages[1], pages[2], pages[4]}));
  expect_counts(a, 0, 3, 3);
  // Released again: to the LRU tail (most recent).
  a.decref(pages[3], true);
  EXPECT_EQ(a.lru_order(), (std::vector<int32_t>{pages[1], pages[2], pages[4], pages[3]}));
  // A cached page that loses its hash goes to the free list and is allocated before any eviction.
  a.uncache(pages[2]);
  EXPECT_TRUE(a.is_free(pages[2]));
  EXPECT_EQ(a.alloc(no_evict), pages[2]);
  expect_counts(a, 0, 3, 3);
}

TEST(BlockAllocator, BadCallsThrowAndChangeNothing) {
  BlockAllocator a(3);
  const int32_t used = a.alloc(no_evict);
  const int32_t cached = a.alloc(no_evict);
  a.decref(cached, true);
  for (int32_t bad : {-1, 3, 1 << 20}) {
    expect_error([&] { a.incref(bad); }, "BlockAllocator::incref: page");
    expect_error([&] { a.decref(bad, false); }, "BlockAllocator::decref: page");
    expect_error([&] { (void)a.refcount(bad); }, "BlockAllocator::refcount: page");
    expect_error([&] { a.revive(bad); }, "BlockAllocator::revive: page");
    expect_error([&] { a.uncache(bad); }, "BlockAllocator::uncache: page");
  }
  const int32_t free_page = 3 - used - cached;  // the third id
  expect_error([&] { a.incref(free_page); }, "BlockAllocator::incref:");
  expect_error([&] { a.incref(cached); }, "BlockAllocator::incref:");
  expect_error([&] { a.decref(free_page, false); }, "BlockAllocator::decref:");
  expect_error([&] { a.decref(cached, true); }, "BlockAllocator::decref:");
  expect_error([&] { a.revive(used); }, "BlockAllocator::revive:");
  expect_error([&] { a.revive(free_page); }, "BlockAllocator::revive:");
  expect_error([&] { a.uncache(used); }, "BlockAllocator::uncache:");
  EXPECT_EQ(a.refcount(used), 1);
  EXPECT_EQ(a.lru_order(), std::vector<int32_t>{cached});
  expect_counts(a, 1, 1, 1);
  expect_error([] { BlockAllocator b(0); }, "BlockAllocator: num_pages");
  expect_error([] { BlockAllocator b(-4); }, "BlockAllocator: num_pages");
}

TEST(BlockAllocator, ThrowingEvictCallbackLeavesThePageCached) {
  BlockAllocator a(1);
  a.decref(a.alloc(no_evict), true);
  EXPECT_THROW(a.alloc([](int32_t) { throw Error("owner refused"); }), Error);
  expect_counts(a, 0, 1, 0);
  EXPECT_EQ(a.alloc([](int32_t) {}), 0);
}

TEST(BlockAllocator, LargePoolAllOperationsStayConsistent) {
  // 70,000 pages: ids past 65,535 behave like any other.
  const int32_t n = 70000;
  BlockAllocator a(n);
  std::vector<int32_t> pages;
  for (int32_t i = 0; i < n; ++i) pages.push_back(a.alloc(no_evict));
  std::vector<bool> seen(size_t(n), false);
  for (int32_t p : pages) {
    ASSERT_FALSE(seen[size_t(p)]);
    seen[size_t(p)] = true;
  }
  for (int32_t i = n - 1; i >= 0; --i) a.decref(pages[size_t(i)], i % 2 == 0);
  expect_counts(a, n / 2, n / 2, 0);
  a.revive(pages[69998]);
  EXPECT_EQ(a.lru_order().front(), pages[69996]);
  EXPECT_EQ(a.refcount(pages[69998]), 1);
}
