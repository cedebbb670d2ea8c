#include <gtest/gtest.h>

#include <atomic>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/thread_pool.h"

using namespace pagedattn;

TEST(ThreadPool, EveryIndexRunsExactlyOnce) {
  ThreadPool pool(4);
  for (int64_t n : {0, 1, 7, 1000, 100000}) {
    std::vector<std::atomic<int>> hits(static_cast<size_t>(n));
    pool.parallel_for(n, [&](int64_t i) { hits[size_t(i)].fetch_add(1); });
    for (int64_t i = 0; i < n; ++i) ASSERT_EQ(hits[size_t(i)].load(), 1) << "n=" << n << " i=" << i;
  }
}

TEST(ThreadPool, ExceptionReachesCaller) {
  ThreadPool pool(3);
  EXPECT_THROW(pool.parallel_for(100, [](int64_t i) { if (i == 42) fail("task ", i); }), Error);
  // The pool still works afterwards.
  std::atomic<int64_t> sum{0};
  pool.parallel_for(10, [&](int64_t i) { sum += i; });
  EXPECT_EQ(sum.load(), 45);
}

TEST(ThreadPool, NestedParallelForRunsInline) {
  ThreadPool pool(3);
  std::vector<std::atomic<int>> hits(static_cast<size_t>(8 * 16));
  pool.parallel_for(8, [&](int64_t i) {
    pool.parallel_for(16, [&](int64_t j) { hits[static_cast<size_t>(i * 16 + j)].fetch_add(1); });
  });
  for (auto& h : hits) ASSERT_EQ(h.load(), 1);
}
