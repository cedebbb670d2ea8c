// A sampling profiler of a process's host time, loaded with LD_PRELOAD: every $HOST_SAMPLE_US
// microseconds (default 100) of the main thread's wall time (a CLOCK_MONOTONIC timer signalling
// that thread: waits are sampled too), or with HOST_SAMPLE_CPU=1 of the process's CPU time
// (ITIMER_PROF, whose period the kernel's tick rounds up), a SIGPROF records the interrupted
// thread's call stack; at exit the stacks (return addresses) and /proc/self/maps go to
// $HOST_SAMPLE_OUT (nothing is done when it is unset; a "%p" in it becomes the process id, for
// programs that start workers). scripts/device/host_profile.py turns them
// into per-function counts. Built on the GPU machine by scripts/device/timeline-model.sh:
//   g++ -O2 -shared -fPIC host_sampler.cpp -o libhost_sampler.so
#include <execinfo.h>
#include <signal.h>
#include <sys/syscall.h>
#include <sys/time.h>
#include <time.h>
#include <unistd.h>

#include <atomic>
#include <cstdio>
#include <cstdlib>
#include <cstring>

namespace {
constexpr int kDepth = 26;  // the handler's own two frames (it, the signal trampoline) dropped
constexpr size_t kMaxSamples = 1 << 17;
void* g_stacks[kMaxSamples][kDepth];
int g_depth[kMaxSamples];
std::atomic<size_t> g_count{0};

void on_prof(int, siginfo_t*, void*) {
  const size_t i = g_count.fetch_add(1, std::memory_order_relaxed);
  if (i < kMaxSamples) g_depth[i] = backtrace(g_stacks[i], kDepth);
}

void write_out() {
  char path[4096];
  const char* env = getenv("HOST_SAMPLE_OUT");
  const char* at = strstr(env, "%p");
  if (at)
    snprintf(path, sizeof path, "%.*s%d%s", int(at - env), env, int(getpid()), at + 2);
  else
    snprintf(path, sizeof path, "%s", env);
  itimerval off{};
  setitimer(ITIMER_PROF, &off, nullptr);
  signal(SIGPROF, SIG_IGN);
  FILE* f = fopen(path, "w");
  if (!f) return;
  const size_t n = g_count.load() < kMaxSamples ? g_count.load() : kMaxSamples;
  for (size_t i = 0; i < n; ++i) {
    for (int d = 2; d < g_depth[i]; ++d)
      fprintf(f, "%s%lx", d > 2 ? " " : "", (unsigned long)g_stacks[i][d]);
    fprintf(f, "\n");
  }
  fprintf(f, "== maps\n");
  if (FILE* m = fopen("/proc/self/maps", "r")) {
    char line[4096];
    while (fgets(line, sizeof line, m)) fputs(line, f);
    fclose(m);
  }
  fclose(f);
}

__attribute__((constructor)) void start() {
  if (!getenv("HOST_SAMPLE_OUT")) return;
  void* warm[4];
  backtrace(warm, 4);  // loads the unwinder now, not inside the first signal
  struct sigaction sa;
  memset(&sa, 0, sizeof sa);
  sa.sa_sigaction = on_prof;
  sa.sa_flags = SA_SIGINFO | SA_RESTART;
  sigaction(SIGPROF, &sa, nullptr);
  const char* us = getenv("HOST_SAMPLE_US");
  const long period = us ? atol(us) : 100;
  if (const char* cpu = getenv("HOST_SAMPLE_CPU"); cpu && atoi(cpu) == 1) {
    itimerval t{{0, period}, {0, period}};
    setitimer(ITIMER_PROF, &t, nullptr);
  } else {
    sigevent ev;
    memset(&ev, 0, sizeof ev);
    ev.sigev_notify = SIGEV_THREAD_ID;
    ev.sigev_signo = SIGPROF;
    ev._sigev_un._tid = pid_t(syscall(SYS_gettid));  // this constructor runs on the main thread
    timer_t timer;
    if (timer_create(CLOCK_MONOTONIC, &ev, &timer) != 0) return;
    itimerspec t{{0, period * 1000}, {0, period * 1000}};
    timer_settime(timer, 0, &t, nullptr);
  }
  atexit(write_out);
}
}  // namespace
