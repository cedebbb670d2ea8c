// `pagedattn bench attention`: the grids of shapes (the default grids of the CPU and CUDA
// benchmarks, the kernel-report preset, explicit flags over either), the validation of the flags
// (messages name the flag) and the CSV rows that scripts/plot-kernels.sh draws.
//
// A grid is a list of sections; a section is the cartesian product of its lists. An explicit flag
// (--page-size 8,16, --context ...) replaces that list in every section. Points repeated across
// sections run once.
//
// NOTE: header-only and C++17: nvcc compiles the CUDA benchmark that includes it.
#pragma once

#include <algorithm>
#include <cctype>
#include <cerrno>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <sstream>
#include <string>
#include <string_view>
#include <vector>

#include "bench_attention.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"

namespace pagedattn::bench::bench_grid {

// One shape to time.
struct GridPoint {
  std::string mode;  // decode | prefill
  int batch = 0, context = 0, q_per_seq = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0,
      page_size = 0;
  DType kv_dtype = DType::bf16;

  int gqa() const { return num_q_heads / num_kv_heads; }
  // K and V of the whole batch, each element read once.
  double kv_bytes() const {
    return 2.0 * batch * context * num_kv_heads * head_dim * double(dtype_size(kv_dtype));
  }
  // Floating-point operations (2 per multiply-add, scores and weighted sum), causal: query j of
  // q_per_seq sits at position context - q_per_seq + j and sees that many keys plus one.
  double flops() const {
    const double q = q_per_seq, pairs = q * (context - q) + q * (q + 1) / 2;
    return 4.0 * batch * num_q_heads * head_dim * pairs;
  }
  bool operator==(const GridPoint& o) const {
    return mode == o.mode && batch == o.batch && context == o.context && q_per_seq == o.q_per_seq &&
           num_q_heads == o.num_q_heads && num_kv_heads == o.num_kv_heads &&
           head_dim == o.head_dim && page_size == o.page_size && kv_dtype == o.kv_dtype;
  }
};

// One section of a grid: the cartesian product of its lists.
struct GridSpec {
  std::string mode;  // decode | prefill
  std::vector<int> batch, context, num_kv_heads, head_dim, page_size;
  std::vector<std::string> kv_dtype;
  int prefill_chunk = 0;   // prefill: query tokens per sequence, the last of the context (0: all)
  int64_t max_tokens = 0;  // leave out points with batch * context above this (0: no limit)
};

// The loop order of a grid, outermost first (each benchmark keeps its own, so that its default
// output keeps its order).
enum class Dim { kv_dtype, head_dim, num_kv_heads, page_size, context, batch };
using Order = std::vector<Dim>;
// NOTE: page sizes innermost, so that a page sweep of one shape runs within seconds, under the
// same load of a shared machine (the default grid has one page size: its order is unchanged).
inline const Order kCpuOrder = {Dim::kv_dtype, Dim::num_kv_heads, Dim::head_dim,
                                Dim::context,  Dim::batch,        Dim::page_size};
inline const Order kCudaOrder = {Dim::kv_dtype, Dim::head_dim, Dim::num_kv_heads,
                                 Dim::batch,    Dim::context,  Dim::page_size};

// The short name of a KV dtype in CSV rows: f32, f16, bf16 or fp8.
inline std::string short_dtype_name(DType t) {
  return t == DType::fp8_e4m3 ? "fp8" : std::string(dtype_name(t));
}

// "16" -> 16; anything but a non-negative integer is an Error naming the flag.
inline int parse_int(const std::string& text, const std::string& flag) {
  errno = 0;
  char* end = nullptr;
  const long x = std::strtol(text.c_str(), &end, 10);
  PA_CHECK(!text.empty() && std::isdigit(static_cast<unsigned char>(text[0])) && *end == '\0' &&
               errno == 0 && x <= (1L << 30),
           "bench attention: ", flag, " takes a non-negative integer, got '", text, "'");
  return int(x);
}

// "8,16,32" -> {8, 16, 32}; anything but positive integers is an Error naming the flag.
inline std::vector<int> parse_int_list(const std::string& text, const std::string& flag) {
  std::vector<int> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    int x = 0;
    try {
      x = parse_int(item, flag);
    } catch (const Error&) {
      x = 0;
    }
    PA_CHECK(x > 0, "bench attention: ", flag,
             " takes positive integers separated by commas, got '", text, "'");
    v.push_back(x);
  }
  PA_CHECK(!v.empty() && text.back() != ',', "bench attention: ", flag,
           " takes positive integers separated by commas, got '", text, "'");
  return v;
}

inline std::vector<std::string> parse_string_list(const std::string& text,
                                                  const std::string& flag) {
  std::vector<std::string> v;
  std::stringstream ss(text);
  for (std::string item; std::getline(ss, item, ',');) {
    PA_CHECK(!item.empty(), "bench attention: ", flag, " has an empty value in '", text, "'");
    v.push_back(item);
  }
  PA_CHECK(!v.empty() && text.back() != ',', "bench attention: ", flag, " has an empty value in '",
           text, "'");
  return v;
}

// Checks the flags of one run for `device` (cpu | cuda); Error naming the flag otherwise.
inline void validate_args(const BenchAttentionArgs& a, const std::string& device) {
  const auto positive = [](const std::vector<int>& v, const char* flag) {
    for (int x : v) PA_CHECK(x > 0, "bench attention: ", flag, " values must be > 0, got ", x);
  };
  positive(a.batch, "--batch");
  positive(a.context, "--context");
  positive(a.num_kv_heads, "--num-kv-heads");
  positive(a.head_dim, "--head-dim");
  positive(a.page_size, "--page-size");
  PA_CHECK(a.num_q_heads > 0, "bench attention: --num-q-heads must be > 0, got ", a.num_q_heads);
  for (int hk : a.num_kv_heads)
    PA_CHECK(a.num_q_heads % hk == 0, "bench attention: --num-kv-heads (", hk,
             ") must divide --num-q-heads (", a.num_q_heads, ")");
  PA_CHECK(a.iters >= 0, "bench attention: --iters must be >= 0, got ", a.iters);
  PA_CHECK(a.prefill_chunk >= 0, "bench attention: --prefill-chunk must be >= 0, got ",
           a.prefill_chunk);
  PA_CHECK(a.mode == "decode" || a.mode == "prefill" || a.mode == "all",
           "bench attention: --mode must be decode, prefill or all, got '", a.mode, "'");
  PA_CHECK(!(a.quick && a.report), "bench attention: --quick and --report exclude each other");
  for (const std::string& name : a.kv_dtype) {
    DType t{};
    try {
      t = parse_dtype(name);
    } catch (const Error&) {
      fail("bench attention: --kv-dtype: unknown dtype '", name, "' (expected f32, f16, bf16 or ",
           "fp8)");
    }
    PA_CHECK(device != "cuda" || t != DType::f32, "bench attention: --kv-dtype ", name,
             " is not supported by the CUDA kernels (bf16, f16 or fp8)");
  }
  if (device == "cuda")
    for (int d : a.head_dim)
      PA_CHECK(d == 64 || d == 128 || d == 256, "bench attention: --head-dim ", d,
               " is not supported by the CUDA kernels (64, 128 or 256)");
}

// The default grid of each benchmark (what runs without --report; --quick: a tiny one).
inline std::vector<GridSpec> default_grid(const std::string& device, bool quick) {
  if (device == "cuda") {
    GridSpec d{"decode",        {1, 8, 64}, {512, 2048, 8192, 32768},
               {8, 32},         {128, 256}, {16, 32, 64},
               {"bf16", "fp8"}, 0,          64 * 8192};
    if (quick) d = {"decode", {1, 8}, {512, 8192}, {8}, {128}, {16}, {"bf16", "fp8"}, 0, 0};
    // Prefill: whole sequences (q = K/V length), causal.
    const GridSpec p{"prefill", {1, 4}, {2048, 8192}, {8}, {128}, {16}, {"bf16"}, 0, 0};
    return {d, p};
  }
  GridSpec d{"decode", {1, 8}, {2048, 8192}, {8}, {128}, {16}, {"bf16"}, 0, 0};
  if (quick) d.batch = {2}, d.context = {256, 1024};
  GridSpec p = d;
  p.mode = "prefill";
  p.prefill_chunk = quick ? 32 : 128;
  return {d, p};
}

// The kernel report: page sizes 8..128 at a few contexts and batches, GQA ratios 1, 4 and 8 (32
// query heads over 32, 8 and 4 KV heads) and the KV dtypes of each backend, decode and prefill.
// Sized to run in a few minutes on 2 CPU cores and under 3 minutes on an H100.
inline std::vector<GridSpec> report_grid(const std::string& device) {
  const std::vector<int> pages = {8, 16, 32, 64, 128};
  if (device == "cuda") {
    return {
        // Page sweep by context and batch (GQA 4).
        {"decode",
         {1, 8, 64},
         {512, 2048, 8192, 32768},
         {8},
         {128},
         pages,
         {"bf16", "fp8"},
         0,
         64 * 8192},
        // Page sweep by GQA ratio and dtype.
        {"decode", {8, 64}, {2048, 8192}, {32, 8, 4}, {128}, pages, {"bf16", "fp8"}, 0, 0},
        // Prefill of whole sequences, causal.
        {"prefill", {1}, {2048, 8192}, {32, 8, 4}, {128}, pages, {"bf16"}, 0, 0},
    };
  }
  return {
      {"decode", {1, 8}, {512, 2048, 8192}, {8}, {128}, pages, {"bf16"}, 0, 0},
      {"decode", {4}, {2048}, {32, 8, 4}, {128}, pages, {"f32", "bf16", "fp8"}, 0, 0},
      // Chunked prefill: 128 query tokens at the end of the context.
      {"prefill", {1}, {1024, 4096}, {8}, {128}, pages, {"bf16"}, 128, 0},
  };
}

// The sections of this run: the default grid or the report, explicit flags over every section,
// only the sections of --mode.
inline std::vector<GridSpec> resolve_grid(const BenchAttentionArgs& a, const std::string& device) {
  std::vector<GridSpec> out;
  for (GridSpec s : a.report ? report_grid(device) : default_grid(device, a.quick)) {
    if (a.mode != "all" && a.mode != s.mode) continue;
    if (!a.batch.empty()) s.batch = a.batch;
    if (!a.context.empty()) s.context = a.context;
    if (!a.num_kv_heads.empty()) s.num_kv_heads = a.num_kv_heads;
    if (!a.head_dim.empty()) s.head_dim = a.head_dim;
    if (!a.page_size.empty()) s.page_size = a.page_size;
    if (!a.kv_dtype.empty()) s.kv_dtype = a.kv_dtype;
    if (s.mode == "prefill" && a.prefill_chunk > 0) s.prefill_chunk = a.prefill_chunk;
    out.push_back(s);
  }
  return out;
}

// Every point of the sections, in `order` within each section, each point once.
inline std::vector<GridPoint> expand(const std::vector<GridSpec>& specs, int num_q_heads,
                                     const Order& order) {
  std::vector<GridPoint> points;
  for (const GridSpec& s : specs) {
    const auto size = [&](Dim d) -> size_t {
      switch (d) {
        case Dim::kv_dtype:
          return s.kv_dtype.size();
        case Dim::head_dim:
          return s.head_dim.size();
        case Dim::num_kv_heads:
          return s.num_kv_heads.size();
        case Dim::page_size:
          return s.page_size.size();
        case Dim::context:
          return s.context.size();
        case Dim::batch:
          return s.batch.size();
      }
      return 0;
    };
    bool empty = false;
    for (Dim d : order) empty = empty || size(d) == 0;
    if (empty) continue;
    std::vector<size_t> idx(order.size(), 0);  // an odometer, the last dimension fastest
    for (;;) {
      GridPoint p;
      p.mode = s.mode;
      p.num_q_heads = num_q_heads;
      for (size_t k = 0; k < order.size(); ++k) {
        const size_t i = idx[k];
        switch (order[k]) {
          case Dim::kv_dtype:
            p.kv_dtype = parse_dtype(s.kv_dtype[i]);
            break;
          case Dim::head_dim:
            p.head_dim = s.head_dim[i];
            break;
          case Dim::num_kv_heads:
            p.num_kv_heads = s.num_kv_heads[i];
            break;
          case Dim::page_size:
            p.page_size = s.page_size[i];
            break;
          case Dim::context:
            p.context = s.context[i];
            break;
          case Dim::batch:
            p.batch = s.batch[i];
            break;
        }
      }
      p.q_per_seq = s.mode == "decode"    ? 1
                    : s.prefill_chunk > 0 ? std::min(s.prefill_chunk, p.context)
                                          : p.context;
      const bool fits = s.max_tokens == 0 || int64_t(p.batch) * p.context <= s.max_tokens;
      if (fits && std::find(points.begin(), points.end(), p) == points.end()) points.push_back(p);
      size_t k = order.size();
      while (k > 0 && ++idx[k - 1] == size(order[k - 1])) idx[--k] = 0;
      if (k == 0) break;
    }
  }
  return points;
}

// The points of one run (flags validated first).
inline std::vector<GridPoint> make_points(const BenchAttentionArgs& a, const std::string& device,
                                          const Order& order) {
  validate_args(a, device);
  return expand(resolve_grid(a, device), a.num_q_heads, order);
}

// One result: a point, its time, and what the CSV derives from them.
struct Row {
  std::string device;    // cpu | cuda
  std::string hardware;  // CPU model or GPU name
  int workers = 0;       // CPU threads or GPU multiprocessors
  GridPoint p;
  DType q_dtype = DType::f32;
  double us = 0;             // the paged kernel, microseconds
  double roofline_gbps = 0;  // measured in the same run
  double dense_us = -1;      // the same kernel on contiguous K/V (-1: not timed)
  double ref_rel_err = -1;   // against the reference (-1: not run)
};

inline const char* csv_header() {
  return "device,hardware,workers,mode,batch,context,q_per_seq,num_q_heads,num_kv_heads,gqa,"
         "head_dim,page_size,kv_dtype,q_dtype,kv_mib,us,gbps,roofline_gbps,pct_roofline,dense_us,"
         "dense_over_paged,tflops,ref_rel_err";
}

// A CSV field: commas and quotes would split or break the row for awk and gnuplot.
inline std::string csv_field(std::string s) {
  for (char& c : s)
    if (c == ',' || c == '"' || c == '\n' || c == '\r') c = ' ';
  return s;
}

inline std::string csv_number(double x, int precision = 6) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*g", precision, x);
  return b;
}

// GB/s count the K/V bytes of the batch read once; % of roofline is that over the roofline.
inline double gbps(const Row& r) { return r.p.kv_bytes() / (r.us * 1e3); }

inline std::string csv_row(const Row& r) {
  const GridPoint& p = r.p;
  const double g = gbps(r);
  std::string s = csv_field(r.device) + ',' + csv_field(r.hardware) + ',' +
                  std::to_string(r.workers) + ',' + p.mode + ',' + std::to_string(p.batch) + ',' +
                  std::to_string(p.context) + ',' + std::to_string(p.q_per_seq) + ',' +
                  std::to_string(p.num_q_heads) + ',' + std::to_string(p.num_kv_heads) + ',' +
                  std::to_string(p.gqa()) + ',' + std::to_string(p.head_dim) + ',' +
                  std::to_string(p.page_size) + ',' + short_dtype_name(p.kv_dtype) + ',' +
                  short_dtype_name(r.q_dtype) + ',' + csv_number(p.kv_bytes() / 1048576.0) + ',' +
                  csv_number(r.us) + ',' + csv_number(g) + ',' + csv_number(r.roofline_gbps) + ',' +
                  csv_number(100.0 * g / r.roofline_gbps, 4) + ',';
  if (r.dense_us >= 0)
    s += csv_number(r.dense_us) + ',' + csv_number(r.dense_us / r.us, 4);
  else
    s += ',';
  s += ',' + csv_number(p.flops() / (r.us * 1e6)) + ',';
  if (r.ref_rel_err >= 0) s += csv_number(r.ref_rel_err, 3);
  return s;
}

}  // namespace pagedattn::bench::bench_grid
