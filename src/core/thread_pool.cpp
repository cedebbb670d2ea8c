#include "pagedattn/thread_pool.h"

#include <atomic>
#include <condition_variable>
#include <cstdlib>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace pagedattn {

namespace {
// NOTE: set while a thread runs tasks of a parallel_for; a nested parallel_for then runs its tasks
// inline instead of waiting for a pool that is busy with the outer one (which would deadlock).
thread_local bool t_in_parallel_for = false;

struct InParallelFor {
  bool saved = t_in_parallel_for;
  InParallelFor() { t_in_parallel_for = true; }
  ~InParallelFor() { t_in_parallel_for = saved; }
};
}  // namespace

struct ThreadPool::Impl {
  std::vector<std::thread> workers;
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::mutex run_mu;  // one parallel_for at a time
  const std::function<void(int64_t)>* fn = nullptr;
  int64_t n = 0;
  std::atomic<int64_t> next{0};
  int busy = 0;          // workers still inside the current job
  uint64_t generation = 0;
  bool stop = false;
  std::exception_ptr error;

  void work() {
    InParallelFor guard;
    for (;;) {
      const int64_t i = next.fetch_add(1, std::memory_order_relaxed);
      if (i >= n) return;
      try {
        (*fn)(i);
      } catch (...) {
        std::lock_guard<std::mutex> lock(mu);
        if (!error) error = std::current_exception();
        next.store(n, std::memory_order_relaxed);  // stop handing out work
      }
    }
  }
};

ThreadPool::ThreadPool(int num_threads) : impl_(new Impl), num_threads_(num_threads < 1 ? 1 : num_threads) {
  for (int t = 1; t < num_threads_; ++t) {
    impl_->workers.emplace_back([this] {
      uint64_t seen = 0;
      for (;;) {
        {
          std::unique_lock<std::mutex> lock(impl_->mu);
          impl_->cv_work.wait(lock, [&] { return impl_->stop || impl_->generation != seen; });
          if (impl_->stop) return;
          seen = impl_->generation;
        }
        impl_->work();
        std::lock_guard<std::mutex> lock(impl_->mu);
        if (--impl_->busy == 0) impl_->cv_done.notify_all();
      }
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop = true;
  }
  impl_->cv_work.notify_all();
  for (auto& w : impl_->workers) w.join();
  delete impl_;
}

void ThreadPool::parallel_for(int64_t n, const std::function<void(int64_t)>& fn) {
  if (n <= 0) return;
  if (num_threads_ == 1 || n == 1 || t_in_parallel_for) {
    for (int64_t i = 0; i < n; ++i) fn(i);
    return;
  }
  std::lock_guard<std::mutex> run_lock(impl_->run_mu);
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->fn = &fn;
    impl_->n = n;
    impl_->next.store(0);
    impl_->error = nullptr;
    impl_->busy = num_threads_ - 1;
    ++impl_->generation;
  }
  impl_->cv_work.notify_all();
  impl_->work();
  std::exception_ptr error;
  {
    std::unique_lock<std::mutex> lock(impl_->mu);
    impl_->cv_done.wait(lock, [&] { return impl_->busy == 0; });
    error = impl_->error;
    impl_->fn = nullptr;
  }
  if (error) std::rethrow_exception(error);
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* s = std::getenv("PAGEDATTN_NUM_THREADS")) {
      const int v = std::atoi(s);
      if (v > 0) return v;
    }
    const unsigned hc = std::thread::hardware_concurrency();
    return hc == 0 ? 1 : int(hc);
  }());
  return pool;
}

}  // namespace pagedattn
