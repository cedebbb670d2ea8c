// `pagedattn bench attention --device cuda`: the paged CUDA kernels against the memory roofline.
//
// In one run: a large device-to-device copy (the bandwidth roofline, bytes read + written), then
// for every shape the paged decode kernel and the same kernel on contiguous K/V (one page per
// sequence: the no-paging baseline), and prefill TFLOP/s. Every timed launch starts with a cold L2
// (a memset of twice its size, then a read of another twice its size, outside the timed region),
// is timed with CUDA events after warm-up, and the median is reported. Inputs are random (never zeros); block tables are shuffled. The
// grid: bench_attention_grid.h (the default, --report, explicit flags); --csv writes its rows.
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <utility>
#include <vector>

#include "bench_attention.h"
#include "l2_flush.cuh"
#include "bench_attention_grid.h"
#include "pagedattn/attention_cuda.h"
#include "pagedattn/error.h"

namespace pagedattn::bench {
namespace {

void ck(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("bench attention: ", what, ": ", cudaGetErrorString(e));
}

// Fills n elements of dtype t with hashed pseudo-random values in [-amp, amp].
__global__ void fill_random(void* p, DType t, int64_t n, uint32_t seed, float amp) {
  for (int64_t i = blockIdx.x * int64_t(blockDim.x) + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    uint32_t h = uint32_t(i) * 2654435761u ^ seed ^ uint32_t(i >> 32) * 40503u;
    h ^= h >> 15;
    h *= 2246822519u;
    h ^= h >> 13;
    const float u = float(h & 0xffffff) / float(0xffffff) * 2.f - 1.f;
    store_from_f32(p, t, i, u * amp);
  }
}

struct DeviceBuf {
  void* p = nullptr;
  explicit DeviceBuf(size_t bytes) {
    ck(cudaMalloc(&p, std::max<size_t>(bytes, 16)), "cudaMalloc");
  }
  ~DeviceBuf() { cudaFree(p); }
  DeviceBuf(const DeviceBuf&) = delete;
  DeviceBuf& operator=(const DeviceBuf&) = delete;
};

void fill(void* p, DType t, int64_t n, uint32_t seed, float amp) {
  fill_random<<<4096, 256>>>(p, t, n, seed, amp);
  ck(cudaGetLastError(), "fill_random launch");
}

// Median time in microseconds of fn(), each run after an L2 flush, after warm-up.
template <class Fn>
double time_us(Fn&& fn, int iters, bench::L2Flush& flush) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "cudaEventCreate");
  ck(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    ck(flush.run(i), "L2 flush (bench/l2_flush.cuh)");
    ck(cudaEventRecord(a), "cudaEventRecord");
    fn();
    ck(cudaEventRecord(b), "cudaEventRecord");
    ck(cudaEventSynchronize(b), "cudaEventSynchronize");
    float ms = 0;
    ck(cudaEventElapsedTime(&ms, a, b), "cudaEventElapsedTime");
    t.push_back(ms * 1e3);
  }
  cudaEventDestroy(a);
  cudaEventDestroy(b);
  std::sort(t.begin(), t.end());
  return t[t.size() / 2];
}

// One layer's pools for `batch` sequences of `ctx` tokens, pages shuffled (or one page per
// sequence, in order, when contiguous).
struct Pools {
  int32_t pages_per_seq = 0, page = 0;
  std::vector<int32_t> table, kv_len, indptr;
  std::unique_ptr<DeviceBuf> k, v, scales;
  PagedKVView view;
  Pools(int batch, int ctx, int hkv, int d, int page_size, DType dt, bool contiguous,
        uint32_t seed) {
    page = contiguous ? ctx : page_size;
    pages_per_seq = (ctx + page - 1) / page;
    const int32_t num_pages = batch * pages_per_seq;
    std::vector<int32_t> ids(static_cast<size_t>(num_pages));
    std::iota(ids.begin(), ids.end(), 0);
    if (!contiguous) std::shuffle(ids.begin(), ids.end(), std::mt19937(seed));
    table = ids;
    kv_len.assign(size_t(batch), ctx);
    indptr.resize(size_t(batch) + 1);
    const int64_t elems = int64_t(num_pages) * hkv * page * d;
    k = std::make_unique<DeviceBuf>(size_t(elems) * dtype_size(dt));
    v = std::make_unique<DeviceBuf>(size_t(elems) * dtype_size(dt));
    const bool fp8 = dt == DType::fp8_e4m3;
    fill(k->p, dt, elems, seed, fp8 ? 200.f : 2.f);
    fill(v->p, dt, elems, seed + 1, fp8 ? 200.f : 2.f);
    view = PagedKVView{k->p, v->p, dt, num_pages, hkv, page, d, nullptr, nullptr};
    if (fp8) {
      std::vector<float> s(size_t(2 * hkv), 0.01f);
      scales = std::make_unique<DeviceBuf>(s.size() * 4);
      ck(cudaMemcpy(scales->p, s.data(), s.size() * 4, cudaMemcpyHostToDevice),
         "cudaMemcpy scales");
      view.k_scale = static_cast<float*>(scales->p);
      view.v_scale = view.k_scale + hkv;
    }
  }
  BatchLayout batch(const std::vector<int32_t>& q_indptr) const {
    return BatchLayout{int32_t(kv_len.size()), q_indptr.data(), kv_len.data(), table.data(),
                       pages_per_seq};
  }
};

// Prints one result as a JSON object (--json) or as key=value pairs.
struct Emitter {
  const BenchAttentionArgs& args;
  void line(const std::vector<std::pair<std::string, std::string>>& kv) {
    std::string s;
    if (args.json) {
      s = "{";
      for (size_t i = 0; i < kv.size(); ++i) {
        const bool num =
            !kv[i].second.empty() && (isdigit(kv[i].second[0]) || kv[i].second[0] == '-');
        s += (i ? ", \"" : "\"") + kv[i].first +
             "\": " + (num ? kv[i].second : "\"" + kv[i].second + "\"");
      }
      s += "}";
    } else {
      for (size_t i = 0; i < kv.size(); ++i) s += (i ? " " : "") + kv[i].first + "=" + kv[i].second;
    }
    std::printf("%s\n", s.c_str());
    std::fflush(stdout);
  }
};

std::string fmt(double x, int prec = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, x);
  return b;
}

// What one point needs on the device: queries and outputs for `batch` sequences of q_per_seq
// tokens each at the end of their context.
struct Queries {
  DType dtype;
  std::vector<int32_t> indptr;
  std::unique_ptr<DeviceBuf> q, o;
  QKVTensor qv, ov;
  explicit Queries(const bench_grid::GridPoint& p)
      : dtype(p.kv_dtype == DType::f16 ? DType::f16 : DType::bf16) {
    const int64_t tokens = int64_t(p.batch) * p.q_per_seq;
    const int64_t elems = tokens * p.num_q_heads * p.head_dim;
    indptr.resize(size_t(p.batch) + 1);
    for (int i = 0; i <= p.batch; ++i) indptr[size_t(i)] = i * p.q_per_seq;
    q = std::make_unique<DeviceBuf>(size_t(elems) * 2);
    o = std::make_unique<DeviceBuf>(size_t(elems) * 2);
    fill(q->p, dtype, elems, p.mode == "decode" ? 3 : 5, 1.f);
    qv = QKVTensor{q->p, dtype, int32_t(tokens), p.num_q_heads, p.head_dim};
    ov = QKVTensor{o->p, dtype, int32_t(tokens), p.num_q_heads, p.head_dim};
  }
};

}  // namespace

int bench_attention_cuda(const BenchAttentionArgs& args) {
  namespace bg = bench_grid;
  const std::vector<bg::GridPoint> points = bg::make_points(args, "cuda", bg::kCudaOrder);
  PA_CHECK(cuda_device_count() > 0, "bench attention: --device cuda needs a CUDA device");
  const int iters = args.iters > 0 ? args.iters : (args.quick ? 10 : 30);

  cudaDeviceProp prop{};
  int dev = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  bench::L2Flush flush(size_t(prop.l2CacheSize));
  ck(flush.status(), "L2 flush buffers");

  Emitter out{args};
  std::unique_ptr<FILE, int (*)(FILE*)> csv(nullptr, &std::fclose);
  if (!args.csv.empty()) {
    csv.reset(std::fopen(args.csv.c_str(), "w"));
    PA_CHECK(csv != nullptr, "bench attention: cannot open --csv file '", args.csv, "'");
    std::fprintf(csv.get(), "%s\n", bg::csv_header());
  }

  // ---- the roofline: a 1 GiB device-to-device copy (2 GiB moved) ----
  const size_t copy_bytes_n = size_t(1) << 30;
  double copy_gbps = 0;
  {
    DeviceBuf a(copy_bytes_n), b(copy_bytes_n);
    fill(a.p, DType::fp8_e4m3, int64_t(copy_bytes_n), 7, 100.f);
    const double us = time_us(
        [&] { ck(cudaMemcpyAsync(b.p, a.p, copy_bytes_n, cudaMemcpyDeviceToDevice), "copy"); },
        iters, flush);
    copy_gbps = 2.0 * double(copy_bytes_n) / us / 1e3;
    out.line({{"kind", "copy"},
              {"device", prop.name},
              {"sms", std::to_string(prop.multiProcessorCount)},
              {"bytes_moved", std::to_string(2 * copy_bytes_n)},
              {"us", fmt(us)},
              {"GBps", fmt(copy_gbps, 0)}});
  }

  // The no-paging baseline (one page per sequence) of each shape, timed once for all page sizes.
  std::vector<std::pair<bg::GridPoint, double>> dense_times;
  for (const bg::GridPoint& p : points) {
    const bool decode = p.mode == "decode";
    const int b = p.batch, ctx = p.context, hq = p.num_q_heads, hkv = p.num_kv_heads,
              d = p.head_dim;
    // Prefill runs are long and steady: fewer of them.
    const int runs = decode ? iters : std::max(3, iters / 4);
    Queries qs(p);
    const AttentionOptions opt{};
    bg::GridPoint key = p;
    key.page_size = 0;
    auto cached = std::find_if(dense_times.begin(), dense_times.end(),
                               [&](const auto& e) { return e.first == key; });
    if (cached == dense_times.end()) {
      Pools dense(b, ctx, hkv, d, 0, p.kv_dtype, true, 11);
      CudaAttentionPlan plan;
      plan.plan(qs.qv, dense.view, dense.batch(qs.indptr), opt, qs.ov);
      const double us = time_us([&] { paged_attention_cuda(plan, qs.qv, dense.view, qs.ov); }, runs,
                                flush);
      cached = dense_times.insert(dense_times.end(), {key, us});
    }
    const double dense_us = cached->second;

    Pools pools(b, ctx, hkv, d, p.page_size, p.kv_dtype, false, decode ? 13 : 17);
    CudaAttentionPlan plan;
    plan.plan(qs.qv, pools.view, pools.batch(qs.indptr), opt, qs.ov);
    const double us = time_us([&] { paged_attention_cuda(plan, qs.qv, pools.view, qs.ov); }, runs,
                              flush);
    const std::string kv = bg::short_dtype_name(p.kv_dtype);
    if (decode) {
      const double gbps = p.kv_bytes() / us / 1e3;
      out.line(
          {{"kind", "decode"},
           {"batch", std::to_string(b)},
           {"ctx", std::to_string(ctx)},
           {"hq", std::to_string(hq)},
           {"hkv", std::to_string(hkv)},
           {"d", std::to_string(d)},
           {"page", std::to_string(p.page_size)},
           {"kv", kv},
           {"kv_MiB", fmt(p.kv_bytes() / 1048576.0, 1)},
           {"splits", std::to_string(plan.info().split_rows > 0 ? plan.info().decode_ctas / b : 1)},
           {"us", fmt(us)},
           {"GBps", fmt(gbps, 0)},
           {"pct_copy", fmt(100.0 * gbps / copy_gbps, 1)},
           {"dense_us", fmt(dense_us)},
           {"paged_over_dense", fmt(us / dense_us, 3)}});
    } else {
      out.line({{"kind", "prefill"},
                {"batch", std::to_string(b)},
                {"len", std::to_string(ctx)},
                {"hq", std::to_string(hq)},
                {"hkv", std::to_string(hkv)},
                {"d", std::to_string(d)},
                {"page", std::to_string(p.page_size)},
                {"kv", kv},
                {"tensor_core", plan.info().prefill_tiles > 0 ? "yes" : "no"},
                {"kernel", plan.info().prefill_hopper       ? "wgmma"
                           : plan.info().prefill_tiles > 0 ? "mma"
                                                           : "decode"},
                {"us", fmt(us)},
                {"TFLOPs", fmt(p.flops() / us / 1e6, 1)},
                {"q_per_seq", std::to_string(p.q_per_seq)},
                {"dense_us", fmt(dense_us)},
                {"paged_over_dense", fmt(us / dense_us, 3)}});
    }
    if (csv) {
      bg::Row row;
      row.device = "cuda";
      row.hardware = prop.name;
      row.workers = prop.multiProcessorCount;
      row.p = p;
      row.q_dtype = qs.dtype;
      row.us = us;
      row.roofline_gbps = copy_gbps;
      row.dense_us = dense_us;
      std::fprintf(csv.get(), "%s\n", bg::csv_row(row).c_str());
      std::fflush(csv.get());
    }
  }
  return 0;
}

}  // namespace pagedattn::bench
