#include "pagedattn/thread_pool.h"

#include <sched.h>

#include <atomic>
#include <chrono>
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

// NOTE: a job is claimed index by index through one 64-bit word, (generation << 32) | next index,
// so a worker that wakes late (descheduled on a busy machine) can only join the job that is current
// and never holds it up: the caller waits for the job's tasks to finish, not for every worker to
// check in. A worker reads the job's fn and n, then claims an index with a compare-and-swap that
// fails if the job changed meanwhile; the old job is first closed (its index set past any n)
// before the new fn and n are written, so a stale read can never be used.
struct ThreadPool::Impl {
  static constexpr uint64_t kClosed = 0xffffffffu;

  std::vector<std::thread> workers;
  std::mutex mu;
  std::condition_variable cv_work, cv_done;
  std::mutex run_mu;  // one parallel_for at a time
  std::atomic<const std::function<void(int64_t)>*> fn{nullptr};
  std::atomic<int64_t> n{0};
  std::atomic<uint64_t> state{kClosed};  // (generation << 32) | next index
  std::atomic<int64_t> done{0};          // tasks of the current job finished
  std::atomic<bool> failed{false};
  std::atomic<bool> stop{false};
  std::exception_ptr error;

  // NOTE: a decode step runs hundreds of short parallel_fors back to back, and waking a sleeping
  // thread costs tens of microseconds; so a waiting thread first polls for kSpin, then sleeps on
  // the condition variable. A short bound keeps a busy machine from losing whole time slices to
  // threads that spin while the thread they wait for is not running.
  static constexpr std::chrono::microseconds kSpin{50};

  template <class Ready>
  static bool spin_until(Ready ready) {
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 1;; ++i) {
      if (ready()) return true;
#if defined(__x86_64__) || defined(__i386__)
      __builtin_ia32_pause();
#endif
      if (i % 64 == 0 && std::chrono::steady_clock::now() - t0 > kSpin) return ready();
    }
  }

  static uint64_t generation_of(uint64_t s) { return s >> 32; }

  // Runs tasks of the job of generation `gen` until none is left (or the job is no longer current).
  void work(uint64_t gen) {
    InParallelFor guard;
    for (;;) {
      uint64_t s = state.load();
      const auto* f = fn.load();
      const int64_t count = n.load();
      for (;;) {
        if (generation_of(s) != gen || int64_t(s & kClosed) >= count) return;
        if (state.compare_exchange_weak(s, s + 1)) break;
      }
      const int64_t i = int64_t(s & kClosed);
      if (!failed.load()) {
        try {
          (*f)(i);
        } catch (...) {
          std::lock_guard<std::mutex> lock(mu);
          if (!error) error = std::current_exception();
          failed.store(true);  // the remaining tasks are claimed and skipped
        }
      }
      if (done.fetch_add(1) + 1 == count) {
        std::lock_guard<std::mutex> lock(mu);
        cv_done.notify_all();
      }
    }
  }
};

ThreadPool::ThreadPool(int num_threads) : impl_(new Impl), num_threads_(num_threads < 1 ? 1 : num_threads) {
  for (int t = 1; t < num_threads_; ++t) {
    impl_->workers.emplace_back([this] {
      Impl& p = *impl_;
      uint64_t seen = 0;
      for (;;) {
        auto ready = [&] {
          return p.stop.load() || Impl::generation_of(p.state.load()) != seen;
        };
        if (!Impl::spin_until(ready)) {
          std::unique_lock<std::mutex> lock(p.mu);
          p.cv_work.wait(lock, ready);
        }
        if (p.stop.load()) return;
        seen = Impl::generation_of(p.state.load());
        p.work(seen);
      }
    });
  }
}

ThreadPool::~ThreadPool() {
  {
    std::lock_guard<std::mutex> lock(impl_->mu);
    impl_->stop.store(true);
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
  if (n >= int64_t(Impl::kClosed)) {  // more tasks than a job holds: in parts
    const int64_t half = n / 2;
    parallel_for(half, fn);
    parallel_for(n - half, [&](int64_t i) { fn(half + i); });
    return;
  }
  std::lock_guard<std::mutex> run_lock(impl_->run_mu);
  Impl& p = *impl_;
  const uint64_t old = Impl::generation_of(p.state.load());
  const uint64_t gen = (old + 1) & 0xffffffffu;
  // Close the finished job (same generation, no index left) so nothing can be claimed while fn
  // and n change; the new generation appears only with the new job.
  p.state.store(old << 32 | Impl::kClosed);
  p.fn.store(&fn);
  p.n.store(n);
  p.done.store(0);
  p.failed.store(false);
  p.error = nullptr;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    p.state.store(gen << 32);
  }
  p.cv_work.notify_all();
  p.work(gen);
  auto finished = [&] { return p.done.load() == n; };
  if (!Impl::spin_until(finished)) {
    std::unique_lock<std::mutex> lock(p.mu);
    p.cv_done.wait(lock, finished);
  }
  std::exception_ptr error;
  {
    std::lock_guard<std::mutex> lock(p.mu);
    error = p.error;
  }
  if (error) std::rethrow_exception(error);
}

int usable_cpus() {
  cpu_set_t set;
  CPU_ZERO(&set);
  if (sched_getaffinity(0, sizeof(set), &set) == 0) {
    const int n = CPU_COUNT(&set);
    if (n > 0) return n;
  }
  const unsigned hc = std::thread::hardware_concurrency();
  return hc == 0 ? 1 : int(hc);
}

ThreadPool& ThreadPool::global() {
  static ThreadPool pool([] {
    if (const char* s = std::getenv("PAGEDATTN_NUM_THREADS")) {
      const int v = std::atoi(s);
      if (v > 0) return v;
    }
    return usable_cpus();
  }());
  return pool;
}

}  // namespace pagedattn
