// Shared pieces of the kernel lab: random paged problems on the device, the CPU reference
// comparison (the correctness gate) and cold-L2 event timing.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "l2_flush.cuh"
#include "pagedattn/attention.h"
#include "pagedattn/attention_cuda.h"

namespace lab {

using namespace pagedattn;

inline void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) {
    std::fprintf(stderr, "CUDA error in %s: %s\n", what, cudaGetErrorString(e));
    std::exit(2);
  }
}

struct Shape {
  int hq = 32, hkv = 8, d = 128, page = 16;
  DType q = DType::bf16, kv = DType::bf16;
  std::vector<int32_t> q_len, kv_len;
  AttentionOptions opt;
};

// Host data plus device copies of one problem; pages shuffled.
struct Problem {
  Shape s;
  int32_t tokens = 0, num_pages = 0, maxp = 0;
  std::vector<int32_t> indptr, table;
  std::vector<uint8_t> q, k, v;
  std::vector<float> ks, vs;
  void *dq = nullptr, *dk = nullptr, *dv = nullptr, *dout = nullptr;
  float *dks = nullptr, *dvs = nullptr;

  Problem(const Shape& sh, uint64_t seed, bool host_data = true) : s(sh) {
    std::mt19937_64 rng(seed);
    const int n = int(s.q_len.size());
    indptr.assign(size_t(n) + 1, 0);
    for (int b = 0; b < n; ++b) indptr[size_t(b) + 1] = indptr[size_t(b)] + s.q_len[size_t(b)];
    tokens = indptr.back();
    for (int b = 0; b < n; ++b) maxp = std::max(maxp, (s.kv_len[size_t(b)] + s.page - 1) / s.page);
    num_pages = n * maxp;
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    table = ids;
    const size_t qn = size_t(tokens) * s.hq * s.d, pool = size_t(num_pages) * s.hkv * s.page * s.d;
    q.resize(qn * dtype_size(s.q));
    k.resize(pool * dtype_size(s.kv));
    v.resize(k.size());
    std::normal_distribution<float> nd(0.f, 1.f);
    const bool fp8 = s.kv == DType::fp8_e4m3;
    ks.assign(size_t(s.hkv), fp8 ? 0.02f : 1.f);
    vs.assign(size_t(s.hkv), fp8 ? 0.015f : 1.f);
    for (size_t i = 0; i < qn; ++i) store_from_f32(q.data(), s.q, int64_t(i), nd(rng));
    // Large pools: fill a 1 MiB block of random values and tile it (the reference is only run on
    // small problems, where every value is fresh).
    const size_t fresh = host_data ? pool : std::min<size_t>(pool, size_t(1) << 20);
    for (size_t i = 0; i < fresh; ++i) {
      store_from_f32(k.data(), s.kv, int64_t(i), nd(rng) / ks[0]);
      store_from_f32(v.data(), s.kv, int64_t(i), nd(rng) / vs[0]);
    }
    const size_t eb = dtype_size(s.kv);
    for (size_t i = fresh; i < pool; i += fresh) {
      const size_t m = std::min(fresh, pool - i) * eb;
      std::copy(k.begin(), k.begin() + int64_t(m), k.begin() + int64_t(i * eb));
      std::copy(v.begin(), v.begin() + int64_t(m), v.begin() + int64_t(i * eb));
    }
    ck(cudaMalloc(&dq, std::max<size_t>(q.size(), 16)), "malloc q");
    ck(cudaMalloc(&dout, std::max<size_t>(q.size(), 16)), "malloc out");
    ck(cudaMalloc(&dk, k.size()), "malloc k");
    ck(cudaMalloc(&dv, v.size()), "malloc v");
    ck(cudaMalloc(&dks, ks.size() * 4), "malloc ks");
    ck(cudaMalloc(&dvs, vs.size() * 4), "malloc vs");
    ck(cudaMemcpy(dq, q.data(), q.size(), cudaMemcpyHostToDevice), "copy q");
    ck(cudaMemcpy(dk, k.data(), k.size(), cudaMemcpyHostToDevice), "copy k");
    ck(cudaMemcpy(dv, v.data(), v.size(), cudaMemcpyHostToDevice), "copy v");
    ck(cudaMemcpy(dks, ks.data(), ks.size() * 4, cudaMemcpyHostToDevice), "copy ks");
    ck(cudaMemcpy(dvs, vs.data(), vs.size() * 4, cudaMemcpyHostToDevice), "copy vs");
  }
  ~Problem() {
    for (void* p : {dq, dout, dk, dv, static_cast<void*>(dks), static_cast<void*>(dvs)})
      cudaFree(p);
  }
  Problem(const Problem&) = delete;
  Problem& operator=(const Problem&) = delete;

  int64_t kv_bytes() const {
    int64_t t = 0;
    for (int32_t l : s.kv_len) t += l;
    return 2 * t * s.hkv * s.d * int64_t(dtype_size(s.kv));
  }
  BatchLayout batch() const {
    return BatchLayout{int32_t(s.kv_len.size()), indptr.data(), s.kv_len.data(), table.data(),
                       maxp};
  }
  PagedKVView host_view() const {
    return PagedKVView{const_cast<uint8_t*>(k.data()),
                       const_cast<uint8_t*>(v.data()),
                       s.kv,
                       num_pages,
                       s.hkv,
                       s.page,
                       s.d,
                       ks.data(),
                       vs.data()};
  }
  PagedKVView dev_view() const {
    return PagedKVView{dk, dv, s.kv, num_pages, s.hkv, s.page, s.d, dks, dvs};
  }
  QKVTensor dev_q() const { return QKVTensor{dq, s.q, tokens, s.hq, s.d}; }
  QKVTensor dev_out() const { return QKVTensor{dout, s.q, tokens, s.hq, s.d}; }

  // Relative L2 error of the device output against the double-precision reference, or +inf if
  // any element is NaN (the output is poisoned before the run).
  double check(const std::function<void()>& run) const {
    ck(cudaMemset(dout, 0xff, q.size()), "poison out");
    run();
    ck(cudaDeviceSynchronize(), "run");
    std::vector<uint8_t> got(q.size()), ref(q.size());
    ck(cudaMemcpy(got.data(), dout, got.size(), cudaMemcpyDeviceToHost), "copy out");
    QKVTensor ro{ref.data(), s.q, tokens, s.hq, s.d};
    paged_attention_reference(QKVTensor{const_cast<uint8_t*>(q.data()), s.q, tokens, s.hq, s.d},
                              host_view(), batch(), s.opt, ro);
    double num = 0, den = 0;
    for (int64_t i = 0; i < int64_t(tokens) * s.hq * s.d; ++i) {
      const double g = load_as_f32(got.data(), s.q, i), r = load_as_f32(ref.data(), s.q, i);
      if (std::isnan(g)) return INFINITY;
      num += (g - r) * (g - r);
      den += r * r;
    }
    return std::sqrt(num / std::max(den, 1e-30));
  }
};

// The L2 flush before each timed run (bench/l2_flush.cuh): by default ("clean") the memset and the
// read; LAB_FLUSH=memset, the memset alone.
inline bool clean_flush() {
  const char* e = std::getenv("LAB_FLUSH");
  return !(e && std::string(e) == "memset");
}

// Median microseconds of run() over iters launches, each after an L2 flush (untimed).
inline double time_us(const std::function<void()>& run, int iters = 20) {
  static bench::L2Flush* flush = nullptr;
  if (!flush) {
    int dev = 0, l2 = 0;
    ck(cudaGetDevice(&dev), "get device");
    ck(cudaDeviceGetAttribute(&l2, cudaDevAttrL2CacheSize, dev), "l2 size");
    flush = new bench::L2Flush(size_t(l2));  // NOTE: kept for the process's lifetime
    ck(flush->status(), "L2 flush buffers");
  }
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "event");
  ck(cudaEventCreate(&b), "event");
  for (int i = 0; i < 3; ++i) run();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    ck(flush->run(i, clean_flush()), "L2 flush");
    ck(cudaEventRecord(a), "record");
    run();
    ck(cudaEventRecord(b), "record");
    ck(cudaEventSynchronize(b), "sync");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a, b), "elapsed");
    t.push_back(ms * 1e3);
  }
  ck(cudaGetLastError(), "timed runs");
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// Several kernels timed side by side: `rounds` rounds of `iters` runs each, the order rotated
// every round, the median of each kernel's runs over all rounds. Sustained tensor-core work
// lowers the clocks, so timing one kernel after the other favours whichever runs first.
inline std::vector<double> time_us_interleaved(const std::vector<std::function<void()>>& runs,
                                               int rounds, int iters) {
  const size_t n = runs.size();
  std::vector<std::vector<double>> all(n);
  for (int r = 0; r < rounds; ++r)
    for (size_t k = 0; k < n; ++k) {
      const size_t j = (k + size_t(r)) % n;
      all[j].push_back(time_us(runs[j], iters));
    }
  std::vector<double> med(n);
  for (size_t j = 0; j < n; ++j) {
    std::sort(all[j].begin(), all[j].end());
    med[j] = all[j].empty() ? 0.0 : all[j][all[j].size() / 2];
  }
  return med;
}

}  // namespace lab
