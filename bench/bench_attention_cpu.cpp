// `pagedattn bench attention --device cpu`: the fused paged kernel against the same kernel on
// dense, contiguous K/V (the no-paging baseline) and against the reference, for decode and for
// chunked prefill, on a grid of shapes.
//
// Every shape: one pool with the batch's pages in shuffled order (a fragmented cache), the same
// K/V in a dense [seq][kv_head][token][head_dim] buffer, f32 queries and outputs. Times are the
// median of `iters` runs after warm-up, paged and dense runs interleaved; GB/s counts the K/V bytes
// of the batch read once. The roofline, measured at the start of the run with the same threads: the
// best plain read of a 512 MiB buffer. The grid: bench_attention_grid.h (default, --report, flags).
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <functional>
#include <iostream>
#include <memory>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#if defined(__linux__)
#include <sys/mman.h>
#endif

#include "attention/cpu/cpu_attention.h"
#include "bench_attention.h"
#include "bench_attention_grid.h"
#include "pagedattn/attention.h"
#include "pagedattn/error.h"
#include "pagedattn/thread_pool.h"

namespace pagedattn::bench {
namespace {

using Shape = bench_grid::GridPoint;

struct Result {
  Shape shape;
  double paged_ms = 0, dense_ms = 0, reference_ms = -1;  // -1: not run
  double kv_gbytes = 0;
  double dense_vs_paged_err = 0, reference_err = -1;
};

// A zeroed buffer aligned to 2 MiB; on Linux it asks for transparent huge pages. The paged pools
// and the dense K/V get the same kind of memory, so neither kernel gains from the allocator.
class Buffer {
 public:
  Buffer() = default;
  explicit Buffer(size_t bytes) {
    constexpr size_t kAlign = size_t(2) << 20;
    const size_t size = (std::max<size_t>(bytes, 1) + kAlign - 1) / kAlign * kAlign;
    data_.reset(static_cast<uint8_t*>(std::aligned_alloc(kAlign, size)));
    PA_CHECK(data_ != nullptr, "bench attention: out of memory allocating ", size, " bytes");
#if defined(__linux__)
    madvise(data_.get(), size, MADV_HUGEPAGE);  // a hint: failure only costs speed
#endif
    std::memset(data_.get(), 0, size);
  }
  uint8_t* data() const { return data_.get(); }
  uint8_t& operator[](size_t i) const { return data_.get()[i]; }

 private:
  struct Free {
    void operator()(uint8_t* p) const { std::free(p); }
  };
  std::unique_ptr<uint8_t, Free> data_;
};

// Buffers of one shape.
struct Workload {
  Shape s;
  Buffer k_pages, v_pages, k_dense, v_dense;
  std::vector<float> k_scale, v_scale, q, out_paged, out_dense, out_ref;
  std::vector<int32_t> q_indptr, kv_len, block_table;
  int32_t pages_per_seq = 0, num_pages = 0;

  explicit Workload(const Shape& shape) : s(shape) {
    const int32_t B = s.batch, L = s.context, Hk = s.num_kv_heads, D = s.head_dim, P = s.page_size;
    pages_per_seq = (L + P - 1) / P;
    num_pages = B * pages_per_seq;
    const size_t es = dtype_size(s.kv_dtype);
    std::mt19937_64 rng(7);
    // Pages of all sequences in one shuffled order.
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table = ids;
    q_indptr.push_back(0);
    for (int32_t b = 0; b < B; ++b) {
      q_indptr.push_back(q_indptr.back() + s.q_per_seq);
      kv_len.push_back(L);
    }
    if (s.kv_dtype == DType::fp8_e4m3) k_scale.assign(size_t(Hk), 1.f / 224), v_scale = k_scale;
    const float inv = s.kv_dtype == DType::fp8_e4m3 ? 224.f : 1.f;
    const size_t dense_elems = size_t(B) * Hk * L * D;
    k_dense = Buffer(dense_elems * es);
    v_dense = Buffer(dense_elems * es);
    std::uniform_real_distribution<float> uni(-1.f, 1.f);
    for (size_t i = 0; i < dense_elems; ++i) {
      store_from_f32(k_dense.data(), s.kv_dtype, int64_t(i), uni(rng) * inv);
      store_from_f32(v_dense.data(), s.kv_dtype, int64_t(i), uni(rng) * inv);
    }
    // The same rows in the pool, through the block table.
    k_pages = Buffer(size_t(num_pages) * Hk * P * D * es);
    v_pages = Buffer(size_t(num_pages) * Hk * P * D * es);
    const PagedKVView v = view();
    for (int32_t b = 0; b < B; ++b)
      for (int32_t h = 0; h < Hk; ++h)
        for (int32_t p = 0; p < L; ++p) {
          const size_t src = ((size_t(b) * Hk + h) * L + p) * D * es;
          const size_t dst =
              size_t(v.offset(block_table[size_t(b) * pages_per_seq + p / P], h, p % P)) * es;
          std::copy_n(&k_dense[src], D * es, &k_pages[dst]);
          std::copy_n(&v_dense[src], D * es, &v_pages[dst]);
        }
    const size_t q_elems = size_t(q_indptr.back()) * s.num_q_heads * D;
    q.resize(q_elems);
    for (float& x : q) x = uni(rng);
    out_paged.assign(q_elems, 0.f);
    out_dense = out_paged;
    out_ref = out_paged;
  }

  PagedKVView view() const {
    PagedKVView v;
    v.k_pages = k_pages.data();
    v.v_pages = v_pages.data();
    v.dtype = s.kv_dtype;
    v.num_pages = num_pages;
    v.num_kv_heads = s.num_kv_heads;
    v.page_size = s.page_size;
    v.head_dim = s.head_dim;
    if (!k_scale.empty()) v.k_scale = k_scale.data(), v.v_scale = v_scale.data();
    return v;
  }
  BatchLayout batch() const {
    return BatchLayout{s.batch, q_indptr.data(), kv_len.data(), block_table.data(), pages_per_seq};
  }
  QKVTensor tensor(const std::vector<float>& buf) const {
    return QKVTensor{const_cast<float*>(buf.data()), DType::f32, q_indptr.back(), s.num_q_heads,
                     s.head_dim};
  }
  void run_paged() {
    QKVTensor out = tensor(out_paged);
    paged_attention_cpu(tensor(q), view(), batch(), AttentionOptions{}, out);
  }
  void run_dense() {
    const DenseKV kv{k_dense.data(),
                     v_dense.data(),
                     s.kv_dtype,
                     s.num_kv_heads,
                     s.head_dim,
                     s.context,
                     k_scale.empty() ? nullptr : k_scale.data(),
                     v_scale.empty() ? nullptr : v_scale.data()};
    QKVTensor out = tensor(out_dense);
    dense_attention_cpu(tensor(q), kv, s.batch, q_indptr.data(), kv_len.data(), AttentionOptions{},
                        out);
  }
  void run_reference() {
    QKVTensor out = tensor(out_ref);
    paged_attention_reference(tensor(q), view(), batch(), AttentionOptions{}, out);
  }
  // Multiply-adds of the scores and the weighted sum (causal).
  double work() const {
    double pairs = 0;
    for (int32_t j = 0; j < s.q_per_seq; ++j) pairs += s.context - s.q_per_seq + j + 1;
    return pairs * s.batch * s.num_q_heads * s.head_dim * 2;
  }
};

double rel_error(const std::vector<float>& got, const std::vector<float>& want) {
  double num = 0, den = 0;
  for (size_t i = 0; i < got.size(); ++i) {
    const double d = double(got[i]) - want[i];
    num += d * d;
    den += double(want[i]) * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-30);
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

double elapsed_ms(const std::function<void()>& fn) {
  const auto t0 = std::chrono::steady_clock::now();
  fn();
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

// Median milliseconds of a and of b over `iters` runs each after `warmup` runs, the two
// interleaved so that both see the same machine (other load, clock, cache state).
std::pair<double, double> time_pair_ms(const std::function<void()>& a,
                                       const std::function<void()>& b, int warmup, int iters) {
  for (int i = 0; i < warmup; ++i) a(), b();
  std::vector<double> ta, tb;
  for (int i = 0; i < iters; ++i) {
    ta.push_back(elapsed_ms(a));
    tb.push_back(elapsed_ms(b));
  }
  return {median(ta), median(tb)};
}

std::string cpu_model() {
  std::ifstream in("/proc/cpuinfo");
  std::string line;
  while (std::getline(in, line))
    if (line.rfind("model name", 0) == 0) return line.substr(line.find(':') + 2);
  return "unknown";
}

std::string isa_name() {
  if (cpu_isa_available(CpuIsa::avx512)) return "avx512";
  if (cpu_isa_available(CpuIsa::avx2)) return "avx2";
  return "generic";
}

// A plain read of a 512 MiB buffer by every thread of the pool (each sums whole 2 MiB chunks),
// the best of 5 passes after a warm-up (as STREAM reports): the bandwidth a memory-bound kernel
// can reach here, in GB/s.
double read_roofline_gbps() {
  constexpr size_t kBytes = size_t(512) << 20, kChunk = size_t(2) << 20, kChunks = kBytes / kChunk;
  Buffer buf(kBytes);
  for (size_t i = 0; i < kBytes; i += 4096) buf[i] = uint8_t(i >> 12);
  std::vector<uint64_t> sums(kChunks);
  const auto pass = [&] {
    ThreadPool::global().parallel_for(int64_t(kChunks), [&](int64_t c) {
      const auto* p = reinterpret_cast<const uint64_t*>(buf.data() + size_t(c) * kChunk);
      uint64_t a0 = 0, a1 = 0, a2 = 0, a3 = 0;
      for (size_t i = 0; i < kChunk / 8; i += 4) {
        a0 += p[i];
        a1 += p[i + 1];
        a2 += p[i + 2];
        a3 += p[i + 3];
      }
      sums[size_t(c)] = a0 + a1 + a2 + a3;
    });
  };
  pass();
  std::vector<double> ms;
  for (int i = 0; i < 5; ++i) ms.push_back(elapsed_ms(pass));
  // NOTE: the sums are used, so the compiler cannot drop the reads.
  PA_CHECK(std::accumulate(sums.begin(), sums.end(), uint64_t(0)) != 0,
           "bench attention: roofline buffer read back as zeros");
  return double(kBytes) / (*std::min_element(ms.begin(), ms.end()) * 1e6);
}

Result run_shape(const Shape& s, const BenchAttentionArgs& a) {
  Workload w(s);
  Result r;
  r.shape = s;
  const double work = w.work();
  // Few runs for heavy shapes; the reference (single-threaded, double) once, and only when small.
  const int iters = a.iters > 0 ? a.iters : (a.quick ? 3 : (work > 2e9 ? 3 : 10));
  const int warmup = work > 2e9 ? 1 : 2;
  std::tie(r.paged_ms, r.dense_ms) =
      time_pair_ms([&] { w.run_paged(); }, [&] { w.run_dense(); }, warmup, iters);
  r.dense_vs_paged_err = rel_error(w.out_paged, w.out_dense);
  // NOTE: the reference (one thread, about 4 ns per multiply-add) would dominate the report's run
  // time; there it checks the shapes of up to 1e8 multiply-adds, every page size, dtype and GQA
  // ratio of the grid among them.
  if (work <= (a.report ? 1e8 : 1e9)) {
    r.reference_ms = elapsed_ms([&] { w.run_reference(); });
    r.reference_err = rel_error(w.out_paged, w.out_ref);
  }
  r.kv_gbytes = s.kv_bytes() / 1e9;
  return r;
}

std::string json_line(const Result& r, const std::string& cpu, int threads, const std::string& isa,
                      double roofline_gbps) {
  const Shape& s = r.shape;
  std::ostringstream o;
  o.precision(6);
  o << "{\"bench\":\"attention\",\"device\":\"cpu\",\"cpu\":\"" << cpu
    << "\",\"threads\":" << threads << ",\"isa\":\"" << isa << "\",\"mode\":\"" << s.mode
    << "\",\"batch\":" << s.batch << ",\"context\":" << s.context
    << ",\"q_per_seq\":" << s.q_per_seq << ",\"num_q_heads\":" << s.num_q_heads
    << ",\"num_kv_heads\":" << s.num_kv_heads << ",\"head_dim\":" << s.head_dim
    << ",\"page_size\":" << s.page_size << ",\"kv_dtype\":\"" << dtype_name(s.kv_dtype)
    << "\",\"paged_ms\":" << r.paged_ms << ",\"dense_ms\":" << r.dense_ms << ",\"reference_ms\":";
  if (r.reference_ms < 0)
    o << "null";
  else
    o << r.reference_ms;
  o << ",\"paged_gbps\":" << r.kv_gbytes / (r.paged_ms / 1e3)
    << ",\"dense_gbps\":" << r.kv_gbytes / (r.dense_ms / 1e3)
    << ",\"dense_over_paged\":" << r.dense_ms / r.paged_ms
    << ",\"paged_vs_dense_rel_err\":" << r.dense_vs_paged_err << ",\"paged_vs_reference_rel_err\":";
  if (r.reference_err < 0)
    o << "null";
  else
    o << r.reference_err;
  o << ",\"roofline_gbps\":" << roofline_gbps
    << ",\"pct_roofline\":" << 100.0 * r.kv_gbytes / (r.paged_ms / 1e3) / roofline_gbps << "}";
  return o.str();
}

}  // namespace

int bench_attention_cpu(const BenchAttentionArgs& args) {
  const std::vector<Shape> grid = bench_grid::make_points(args, "cpu", bench_grid::kCpuOrder);
  const std::string cpu = cpu_model(), isa = isa_name();
  const int threads = ThreadPool::global().num_threads();
  std::ofstream csv;
  if (!args.csv.empty()) {
    csv.open(args.csv);
    PA_CHECK(csv.good(), "bench attention: cannot write --csv file '", args.csv, "'");
    csv << bench_grid::csv_header() << '\n';
  }
  const double roofline = read_roofline_gbps();
  if (!args.json) {
    std::printf("pagedattn bench attention --device cpu: %s, %d threads, kernel %s, %zu shapes\n",
                cpu.c_str(), threads, isa.c_str(), grid.size());
    std::printf("roofline: a plain read of 512 MiB with %d threads moves %.2f GB/s\n", threads,
                roofline);
    std::printf("%-8s %5s %7s %5s %7s %4s %5s %4s | %10s %10s %10s | %8s %6s %8s | %11s %8s\n",
                "mode", "batch", "context", "q/seq", "heads", "dim", "page", "kv", "paged ms",
                "dense ms", "ref ms", "paged GB/s", "% roof", "dense GB/s", "dense/paged",
                "ref err");
  }
  int status = 0;
  for (const Shape& s : grid) {
    const Result r = run_shape(s, args);
    // Same kernel, same tiles: paged and dense agree to rounding; the reference to fp32 accuracy.
    const bool ok =
        r.dense_vs_paged_err <= 1e-5 && (r.reference_err < 0 || r.reference_err <= 1e-4);
    if (!ok) status = 1;
    if (args.json) {
      std::cout << json_line(r, cpu, threads, isa, roofline) << std::endl;
    } else {
      char ref_ms[32] = "-", ref_err[32] = "-";
      if (r.reference_ms >= 0) std::snprintf(ref_ms, sizeof ref_ms, "%.2f", r.reference_ms);
      if (r.reference_err >= 0) std::snprintf(ref_err, sizeof ref_err, "%.1e", r.reference_err);
      const std::string heads =
          std::to_string(s.num_q_heads) + "/" + std::to_string(s.num_kv_heads);
      const double gbps = r.kv_gbytes / (r.paged_ms / 1e3);
      std::printf(
          "%-8s %5d %7d %5d %7s %4d %5d %4s | %10.3f %10.3f %10s | %10.2f %6.1f %10.2f | %11.3f "
          "%8s%s\n",
          s.mode.c_str(), s.batch, s.context, s.q_per_seq, heads.c_str(), s.head_dim, s.page_size,
          std::string(dtype_name(s.kv_dtype)).c_str(), r.paged_ms, r.dense_ms, ref_ms, gbps,
          100.0 * gbps / roofline, r.kv_gbytes / (r.dense_ms / 1e3), r.dense_ms / r.paged_ms,
          ref_err, ok ? "" : "  MISMATCH");
      std::fflush(stdout);
    }
    if (csv.is_open()) {
      bench_grid::Row row;
      row.device = "cpu";
      row.hardware = cpu + " (" + isa + ")";
      row.workers = threads;
      row.p = s;
      row.q_dtype = DType::f32;
      row.us = r.paged_ms * 1e3;
      row.roofline_gbps = roofline;
      row.dense_us = r.dense_ms * 1e3;
      row.ref_rel_err = r.reference_err;
      csv << bench_grid::csv_row(row) << std::endl;
    }
  }
  // The roofline once more: a shared machine whose load changed during the run shows it here.
  if (!args.json) std::printf("roofline at the end of the run: %.2f GB/s\n", read_roofline_gbps());
  if (status != 0) std::cerr << "bench attention: paged output disagrees with dense or reference\n";
  return status;
}

}  // namespace pagedattn::bench
