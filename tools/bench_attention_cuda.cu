// `pagedattn bench attention --device cuda`: the paged CUDA kernels against the memory roofline.
//
// In one run: a large device-to-device copy (the bandwidth roofline, bytes read + written), then
// for every shape the paged decode kernel and the same kernel on contiguous K/V (one page per
// sequence: the no-paging baseline), and prefill TFLOP/s. Every timed launch starts with a cold L2
// (a memset of twice its size outside the timed region), is timed with CUDA events after warm-up,
// and the median is reported. Inputs are random (never zeros); block tables are shuffled.
#include <cuda_runtime.h>

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <memory>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "bench_attention.h"
#include "pagedattn/attention_cuda.h"
#include "pagedattn/error.h"

namespace pagedattn::tools {
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

// Median time in microseconds of fn(), each run after a cold-L2 memset, after warm-up.
template <class Fn>
double time_us(Fn&& fn, int iters, void* flush, size_t flush_bytes) {
  cudaEvent_t a, b;
  ck(cudaEventCreate(&a), "cudaEventCreate");
  ck(cudaEventCreate(&b), "cudaEventCreate");
  for (int i = 0; i < 3; ++i) fn();
  std::vector<double> t;
  for (int i = 0; i < iters; ++i) {
    ck(cudaMemsetAsync(flush, i & 0xff, flush_bytes), "cudaMemsetAsync (L2 flush)");
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

struct Emitter {
  const BenchAttentionArgs& args;
  FILE* csv = nullptr;
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
    if (csv) {
      for (size_t i = 0; i < kv.size(); ++i)
        std::fprintf(csv, "%s%s", i ? "," : "", kv[i].second.c_str());
      std::fprintf(csv, "\n");
    }
  }
};

std::string fmt(double x, int prec = 2) {
  char b[64];
  std::snprintf(b, sizeof b, "%.*f", prec, x);
  return b;
}

}  // namespace

int bench_attention_cuda(const BenchAttentionArgs& args) {
  PA_CHECK(cuda_device_count() > 0, "bench attention: --device cuda needs a CUDA device");
  const bool quick = args.quick;
  std::vector<int> batches = !args.batch.empty() ? args.batch
                             : quick             ? std::vector<int>{1, 8}
                                                 : std::vector<int>{1, 8, 64};
  std::vector<int> contexts = !args.context.empty() ? args.context
                              : quick               ? std::vector<int>{512, 8192}
                                                    : std::vector<int>{512, 2048, 8192, 32768};
  std::vector<int> kv_heads = !args.num_kv_heads.empty() ? args.num_kv_heads
                              : quick                    ? std::vector<int>{8}
                                                         : std::vector<int>{8, 32};
  std::vector<int> dims = !args.head_dim.empty() ? args.head_dim
                          : quick                ? std::vector<int>{128}
                                                 : std::vector<int>{128, 256};
  std::vector<int> pages = !args.page_size.empty() ? args.page_size
                           : quick                 ? std::vector<int>{16}
                                                   : std::vector<int>{16, 32, 64};
  std::vector<std::string> dts =
      !args.kv_dtype.empty() ? args.kv_dtype : std::vector<std::string>{"bf16", "fp8"};
  const int iters = args.iters > 0 ? args.iters : (quick ? 10 : 30);
  const int hq = args.num_q_heads;

  cudaDeviceProp prop{};
  int dev = 0;
  ck(cudaGetDevice(&dev), "cudaGetDevice");
  ck(cudaGetDeviceProperties(&prop, dev), "cudaGetDeviceProperties");
  const size_t flush_bytes = size_t(prop.l2CacheSize) * 2;
  DeviceBuf flush(flush_bytes);

  Emitter out{args, nullptr};
  if (!args.csv.empty()) {
    out.csv = std::fopen(args.csv.c_str(), "w");
    PA_CHECK(out.csv, "bench attention: cannot open --csv file '", args.csv, "'");
  }

  // ---- the roofline: a 1 GiB device-to-device copy (2 GiB moved) ----
  const size_t copy_bytes_n = size_t(1) << 30;
  double copy_gbps = 0;
  {
    DeviceBuf a(copy_bytes_n), b(copy_bytes_n);
    fill(a.p, DType::fp8_e4m3, int64_t(copy_bytes_n), 7, 100.f);
    const double us = time_us(
        [&] { ck(cudaMemcpyAsync(b.p, a.p, copy_bytes_n, cudaMemcpyDeviceToDevice), "copy"); },
        iters, flush.p, flush_bytes);
    copy_gbps = 2.0 * double(copy_bytes_n) / us / 1e3;
    out.line({{"kind", "copy"},
              {"device", prop.name},
              {"sms", std::to_string(prop.multiProcessorCount)},
              {"bytes_moved", std::to_string(2 * copy_bytes_n)},
              {"us", fmt(us)},
              {"GBps", fmt(copy_gbps, 0)}});
  }

  const bool do_decode = args.mode == "all" || args.mode == "decode";
  const bool do_prefill = args.mode == "all" || args.mode == "prefill";
  if (do_decode) {
    for (const std::string& dname : dts) {
      const DType kvt = parse_dtype(dname);
      const DType qt = DType::bf16;
      for (int d : dims)
        for (int hkv : kv_heads)
          for (int b : batches)
            for (int ctx : contexts) {
              if (ctx >= 32768 && b > 8) continue;
              const int64_t kv_bytes = 2LL * b * ctx * hkv * d * int64_t(dtype_size(kvt));
              std::vector<int32_t> indptr(size_t(b) + 1);
              std::iota(indptr.begin(), indptr.end(), 0);
              DeviceBuf q(size_t(b) * hq * d * 2), o(size_t(b) * hq * d * 2);
              fill(q.p, qt, int64_t(b) * hq * d, 3, 1.f);
              QKVTensor qv{q.p, qt, b, hq, d}, ov{o.p, qt, b, hq, d};
              AttentionOptions opt;
              double dense_us = 0;
              {
                Pools dense(b, ctx, hkv, d, 0, kvt, true, 11);
                CudaAttentionPlan plan;
                plan.plan(qv, dense.view, dense.batch(indptr), opt, ov);
                dense_us = time_us([&] { paged_attention_cuda(plan, qv, dense.view, ov); }, iters,
                                   flush.p, flush_bytes);
              }
              for (int ps : pages) {
                Pools pools(b, ctx, hkv, d, ps, kvt, false, 13);
                CudaAttentionPlan plan;
                plan.plan(qv, pools.view, pools.batch(indptr), opt, ov);
                const double us = time_us([&] { paged_attention_cuda(plan, qv, pools.view, ov); },
                                          iters, flush.p, flush_bytes);
                const double gbps = double(kv_bytes) / us / 1e3;
                out.line(
                    {{"kind", "decode"},
                     {"batch", std::to_string(b)},
                     {"ctx", std::to_string(ctx)},
                     {"hq", std::to_string(hq)},
                     {"hkv", std::to_string(hkv)},
                     {"d", std::to_string(d)},
                     {"page", std::to_string(ps)},
                     {"kv", dname},
                     {"kv_MiB", fmt(kv_bytes / 1048576.0, 1)},
                     {"splits",
                      std::to_string(plan.info().split_rows > 0 ? plan.info().decode_ctas / b : 1)},
                     {"us", fmt(us)},
                     {"GBps", fmt(gbps, 0)},
                     {"pct_copy", fmt(100.0 * gbps / copy_gbps, 1)},
                     {"dense_us", fmt(dense_us)},
                     {"paged_over_dense", fmt(us / dense_us, 3)}});
              }
            }
    }
  }
  if (do_prefill) {
    for (int b : {1, 4})
      for (int len : {2048, 8192}) {
        const int hkv = 8, d = 128;
        const DType qt = DType::bf16;
        const int64_t tokens = int64_t(b) * len;
        std::vector<int32_t> indptr(size_t(b) + 1);
        for (int i = 0; i <= b; ++i) indptr[size_t(i)] = i * len;
        DeviceBuf q(size_t(tokens) * hq * d * 2), o(size_t(tokens) * hq * d * 2);
        fill(q.p, qt, tokens * hq * d, 5, 1.f);
        QKVTensor qv{q.p, qt, int32_t(tokens), hq, d}, ov{o.p, qt, int32_t(tokens), hq, d};
        Pools pools(b, len, hkv, d, 16, DType::bf16, false, 17);
        CudaAttentionPlan plan;
        plan.plan(qv, pools.view, pools.batch(indptr), AttentionOptions{}, ov);
        const double us = time_us([&] { paged_attention_cuda(plan, qv, pools.view, ov); },
                                  std::max(3, iters / 4), flush.p, flush_bytes);
        // Causal: query j sees j + 1 keys; 2 matrix products of 2 flops per multiply-add.
        const double flops = 4.0 * b * hq * d * (double(len) * (len + 1) / 2);
        out.line({{"kind", "prefill"},
                  {"batch", std::to_string(b)},
                  {"len", std::to_string(len)},
                  {"hq", std::to_string(hq)},
                  {"hkv", std::to_string(hkv)},
                  {"d", std::to_string(d)},
                  {"page", "16"},
                  {"kv", "bf16"},
                  {"tensor_core", plan.info().prefill_tiles > 0 ? "yes" : "no"},
                  {"us", fmt(us)},
                  {"TFLOPs", fmt(flops / us / 1e6, 1)}});
      }
  }
  if (out.csv) std::fclose(out.csv);
  return 0;
}

}  // namespace pagedattn::tools
