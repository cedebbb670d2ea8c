// A fixed pool of worker threads and parallel_for over an index range.
//
// Threads: PAGEDATTN_NUM_THREADS if set, else the CPUs this process may run on (sched_getaffinity).
// A waiting thread polls for a few tens of microseconds, then sleeps (no long spinning, so a busy
// machine slows the pool in proportion instead of starving it).
// parallel_for hands out indices dynamically (an atomic counter), the calling thread works too,
// and an exception thrown by any task is rethrown in the caller after all tasks stopped.
#pragma once

#include <cstdint>
#include <functional>

namespace pagedattn {

class ThreadPool {
 public:
  explicit ThreadPool(int num_threads);
  ~ThreadPool();
  ThreadPool(const ThreadPool&) = delete;
  ThreadPool& operator=(const ThreadPool&) = delete;

  int num_threads() const { return num_threads_; }
  // Runs fn(i) for i in [0, n); returns when all are done.
  void parallel_for(int64_t n, const std::function<void(int64_t)>& fn);

  static ThreadPool& global();

 private:
  struct Impl;
  Impl* impl_;
  int num_threads_;
};

// The CPUs this process may run on (its affinity mask), at least 1.
int usable_cpus();

inline void parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  ThreadPool::global().parallel_for(n, fn);
}

}  // namespace pagedattn
