// Kernel lab: paged decode attention (q_len = 1), versions side by side.
//
//   attention_decode_lab            correctness gate on every version, then the timing sweep
//
// Versions (the promoted one is the library's decode path, src/attention/cuda/decode_kernel.cuh):
//   v1  one warp per (sequence, query head); lanes split head_dim, scalar loads through
//       load_as_f32, a warp reduction per key. Reads each K/V row once per query head.
//   v2  library kernel, split-KV off: one CTA per (sequence, KV head) serving the whole GQA
//       group; groups of lanes own a key row each, 16-byte loads, 2-4 keys in flight per group,
//       chunk states of 256 positions merged in a fixed order.
//   v3  v2 plus split-KV: chunks spread over CTAs when the batch cannot fill the SMs, partial
//       states merged with the same arithmetic (bit-identical to v2): first by a second kernel,
//       since v4 by the last CTA of each split row (one launch). The library's kernel for group 1.
//   v4  tensor cores for GQA groups (promoted for group >= 2; decode_tc_kernel.cuh): keys as the
//       M side and the group's heads as the N side of m16n8k16 mma.sync, so a K/V row costs a
//       share of an mma instead of a shuffle reduction and GT dot products per head; each warp
//       pipelines its own 16 keys of every 64-key step (cp.async, about 96 KiB in flight per
//       CTA, 48 KiB for fp8); fp8 converted to f16 in registers; merge fused as in v3. The lab
//       runs v4 on every group (the library on groups >= 2).
//
// Measured: H100 80GB HBM3, 2026-11-22, 32 query heads, head dim 128, page 16, cold L2, median
// of 20; GB/s of K+V read (copy roofline 3008 GB/s). v2/v3 at commit df42833 were the same design
// with K/V loaded straight into registers (4 keys in flight per group, no pipeline); the cp.async
// pipeline (a84c4bb) replaced them in place:
//                                  v1        v2 regs  v3 regs   v2 pipe  v3 pipe    (GB/s)
//   bf16 hkv=8  batch 1  ctx 8192     3         67      804        71      899
//   bf16 hkv=8  batch 64 ctx 8192   165       1555     1555      2646     2646
//   bf16 hkv=32 batch 1  ctx 8192    11        359     1756       471     1798
//   bf16 hkv=32 batch 64 ctx 8192   642       2821     2834      2877     2876
//   fp8  hkv=8  batch 64 ctx 8192    69       1262     1262      1392     1392
//   fp8  hkv=32 batch 64 ctx 8192   270       2688     2688      2696     2696
// v3 against v4, 2026-11-22 (commits dfd1a41 to f66b523), cold L2 with a clean flush (memset
// then a read: lab_common.h), median of 20, GB/s (copy 3008):
//                                  v3 (CUDA cores)   v4 (tensor cores)
//   bf16 hkv=8  batch 1  ctx 512        86               161
//   bf16 hkv=8  batch 1  ctx 8192      918              1098
//   bf16 hkv=8  batch 8  ctx 8192     2136              2341
//   bf16 hkv=8  batch 64 ctx 8192     2612              2979
//   bf16 hkv=32 batch 64 ctx 8192     2963              3019   (group 1: v3 stays in the library)
//   fp8  hkv=8  batch 64 ctx 8192     1400              2764
//   fp8  hkv=32 batch 64 ctx 8192     2836              2914
// v4's path there: 1) a first version with the heads as the mma's M side (rows 8-15 idle) used
// 230-255 registers and spilled at head_dim 256; keys as M and heads as N halved the mma and the
// accumulators. 2) fp8 through an f16 conversion pass in shared memory reached 1392-1999 GB/s,
// bound by shared-memory traffic (six times the HBM bytes); converting ldmatrix's byte pairs in
// registers and 4 CTAs per SM instead of 3 (the warps waited on conversion latency) gave 2764.
// 3) The merge: the last CTA merged split rows straight from global memory, one L2 round trip
// per chunk (SM active 45% of the time at batch 1, ctx 8192); staging the partials in shared
// memory took batch 1, ctx 8192 from 35.6 to 30.7 us (clean flush both times).
// 4) The merge again (2026-11-26; LAB_DECODE_TRACE=1 timelines, same flush): the merging CTA took
// 12.9 us of 27.6 at batch 1, ctx 8192 (one thread per row walking the chunks for the running max
// and the sums, a round trip per step for the (max, sum) pairs, a branch per element and chunk);
// a warp scan for the maxima and branch-free element chains: 7.3 us, the partials' cp.async
// being the rest (about 20 GB/s into one SM); bulk copies on an mbarrier: 5.3 us. With the block
// table's first 8 entries in each item (one dependent read before the first copies, not two):
// 30.5 -> 23.4 us at batch 1, ctx 8192; 101 -> 70 us at 32768 (docs/BENCHMARKS.md, "Small-batch
// decode").
// 5) Chunks per row and the merge's last steps (2026-11-26, same flush and trace): a row longer
// than 32 chunks of 256 positions takes longer chunks (at most 32: CudaPlanOptions::
// decode_chunk_tokens), so its merging CTA folds 32 partials, not 128: 70 -> 57 us at batch 1,
// ctx 32768, 402 -> 376 us at batch 8. The count as one thread's acq_rel atomic after a barrier
// (a fence by every thread before and after it): 1.31 -> 0.83-0.90 us; the partials' copies
// issued by 32 lanes instead of one, and each thread's merged elements in one row (one load of
// a chunk's weights, float4 loads of its outputs): element chains 1.82 -> 0.70 us. Batch 1, ctx
// 8192: 23.4 -> 21.8-22.1 us. Then at most 16 chunks a row (LAB_DECODE_CHUNK_TOKENS sweeps: longer
// chunks win while the grid keeps enough CTAs): batch 1 / 8192 21.2 us, batch 8 / 8192 105.5 ->
// 102.3, but fp8 pools on the tensor-core kernel keep 32 (their 48 KiB pipelines left batch 1 /
// 32768 at 51.0 against 44.4 with 16). Group 1 (32 KV heads) after these, v3 / v4, two rounds:
// bf16 batch 1 ctx 512 15.4-15.5 / 13.0, 2048 19.3 / 20.6, 8192 53.1-53.3 / 55.3-55.4; batch 8
// ctx 512 28.4-28.5 / 29.6-29.8; batch 64 ctx 8192 2902-2921 / 2838-2844; fp8 batch 1 ctx 512
// 12.7-12.8 / 16.7-16.8: neither kernel wins everywhere, so group 1 stays on v3. Tried and dropped: the CTAs of a split row claiming its chunks
// from a shared cursor after a fixed first few (so that they end together): no faster at batch
// 8 (106.3-106.6 against 105.9-106.0 us at ctx 8192, 379 against 375-376 at 32768), 0.5 us
// slower at batch 1 (the claim's barrier before the first copies), 1% at batch 64 (registers).
// Also dropped: 12 pipeline stages (about 88 KiB in flight, 2 CTAs an SM) for the CUDA-core
// kernel's single-head CTAs of grids smaller than the SM count (group 1, batch 1, 32 KV heads):
// slower, 15.3-15.6 -> 16.4 us at ctx 512, 53.9-54.3 -> 58.9 at 8192, fp8 33.6-33.8 -> 41.0.
// And e4m3 -> f16 without the conversion unit (a byte permute replicating each sign, a shift by 7,
// a mask, a product by 256 in f16: exact for every finite value) in both kernels: fp8 decode 0-10%
// slower over the grid (batch 8, 32 KV heads, ctx 32768: 790 -> 854-862 us).
// 6) Group 1's short rows (2026-11-26, same flush): the CUDA-core kernel's first copies from the
// item's pages as in v4 (0.3-0.6 us at batch 1), one barrier fewer at its chunk ends (every
// thread weighs the groups itself), and rows of at most 1024 positions in 128-position chunks at
// head dim 128 with 16-bit K/V (the split's slices now counted in 64-position units): batch 1,
// ctx 512 15.4-15.5 -> 11.0-11.2 us (FlashInfer 12.5 in the issue), ctx 1024 15.0 -> 13.5; the
// unsplit grids pay their extra chunk ends, batch 8 / 512 +0.6%, batch 64 / 1024 +0.6%; at head
// dim 64 (+4.4% at batch 8), fp8 (+7%) and in v4 (+4% at batch 64 / 512) more, so those keep 256.
// Chunks of 64 at batch 1 / 512: 10.8 against 11.2, but slower from 1024 positions.
// 7) The first copies first (2026-11-26, same flush and trace): v4 issued its first K/V copies
// only after loading q; now before (the prologue to the first copies 2.02 -> 1.89 us at batch 32,
// context 520). In the model, where the kernel follows the RoPE kernel as a programmatic
// dependent, the stages of positions cached before the step are also copied before the wait
// (CudaPlanOptions::decode_early_cached_kv), which no launch here measures: a layer's attention
// in the model's trace went 33.6 -> 29.1 us at batch 32 and 60.3 -> 55.3 at 64 (docs/BENCHMARKS.md,
// "The decode step as it runs").
// 8) Grids near the SM count (2026-11-26, same flush and trace; LAB_DECODE_TARGET=1 against the
// rule): 16 rows of 8 KV heads whole (128 CTAs) against 256 halves, 2.6-4.5% faster at 512, 8192
// and 32768 positions; the plan now keeps such grids whole on 16-bit pools (fp8 wants the halves).
// Split-KV: v3 over v2 is 4-13x at batch 1, ctx 8192 (too few CTAs otherwise) but 5-17% slower
// where the grid already covers every SM, so the plan (c954ed1) splits only grids smaller than the
// SM count. Tried and dropped: 4 keys per step for single-head CTAs (+3-5% bf16 at batch 64,
// -10-27% at batch 1-8: fewer CTAs fit), 6 pipeline stages for fp8 GQA (no change: bound by
// arithmetic there).
#include <cstdio>

#include "lab_common.h"

namespace {

using namespace pagedattn;

// v1 grid: (num_seqs, num_q_heads); block: 32 threads. q_len must be 1 (decode).
//   q, out: [num_seqs, num_q_heads, head_dim]; pools: [num_pages, num_kv_heads, page, head_dim]
__global__ void decode_v1(const void* q, void* out, PagedKVView kv, const int32_t* kv_len,
                          const int32_t* table, int32_t maxp, int32_t hq, DType qt, float scale) {
  const int b = blockIdx.x, h = blockIdx.y, lane = threadIdx.x;
  const int D = kv.head_dim, kvh = h / (hq / kv.num_kv_heads);
  const int L = kv_len[b];
  const bool fp8 = kv.dtype == DType::fp8_e4m3;
  const float ks = fp8 ? kv.k_scale[kvh] : 1.f, vs = fp8 ? kv.v_scale[kvh] : 1.f;
  float qr[8], acc[8];
  const int per = D / 32;
  for (int i = 0; i < per; ++i) {
    qr[i] = load_as_f32(q, qt, (int64_t(b) * hq + h) * D + lane * per + i) * scale * ks;
    acc[i] = 0.f;
  }
  float m = -INFINITY, l = 0.f;
  for (int t = 0; t < L; ++t) {
    const int page = table[int64_t(b) * maxp + t / kv.page_size];
    const int64_t off = kv.offset(page, kvh, t % kv.page_size) + lane * per;
    float s = 0.f;
    for (int i = 0; i < per; ++i) s += qr[i] * load_as_f32(kv.k_pages, kv.dtype, off + i);
    for (int o = 16; o > 0; o /= 2) s += __shfl_xor_sync(0xffffffffu, s, o);
    const float mn = fmaxf(m, s), alpha = __expf(m - mn), p = __expf(s - mn);
    l = l * alpha + p;
    for (int i = 0; i < per; ++i)
      acc[i] = acc[i] * alpha + p * load_as_f32(kv.v_pages, kv.dtype, off + i);
    m = mn;
  }
  for (int i = 0; i < per; ++i)
    store_from_f32(out, qt, (int64_t(b) * hq + h) * D + lane * per + i,
                   l > 0 ? acc[i] / l * vs : 0.f);
}

__global__ void empty_kernel() {}

// LAB_DECODE_TRACE=1: the tensor-core kernel records when each CTA starts, ends its prologue (its
// first copies issued), ends its chunks and exits, and when a merging CTA knows it merges, has
// issued and weighed its first window, has it copied, and has merged every window
// (CudaPlanOptions::decode_trace); the sweep prints the phases of the last timed launch (cold L2,
// like every timed one).
constexpr size_t kTraceCtas = 1 << 16;
constexpr int kTraceEvents = 8;
uint64_t* trace_buffer() {
  static uint64_t* buf = [] {
    uint64_t* b = nullptr;
    const char* e = std::getenv("LAB_DECODE_TRACE");
    if (e && std::atoi(e) > 0) lab::ck(cudaMalloc(&b, kTraceCtas * kTraceEvents * 8), "trace");
    return b;
  }();
  return buf;
}

// The phases of the traced launch of `ctas` CTAs, in microseconds: median and max over the CTAs.
void print_trace(int ctas) {
  std::vector<uint64_t> t(size_t(ctas) * kTraceEvents);
  lab::ck(cudaMemcpy(t.data(), trace_buffer(), t.size() * 8, cudaMemcpyDeviceToHost), "trace");
  const uint64_t mask = ~(uint64_t(1) << 63);
  uint64_t t0 = UINT64_MAX;
  for (int c = 0; c < ctas; ++c) t0 = std::min(t0, t[size_t(c) * kTraceEvents]);
  const char* names[] = {"start",   "prologue", "chunks",   "exit",    "merge exit",
                         "m:count", "m:issue",  "m:copied", "m:merged"};
  std::vector<std::vector<double>> ph(9);
  double end = 0;
  for (int c = 0; c < ctas; ++c) {
    const uint64_t* e = &t[size_t(c) * kTraceEvents];
    ph[0].push_back(double(e[0] - t0) / 1e3);
    for (int k = 1; k < 3; ++k) ph[size_t(k)].push_back(double(e[k] - e[k - 1]) / 1e3);
    const bool merged = (e[3] >> 63) != 0;
    ph[merged ? 4 : 3].push_back(double((e[3] & mask) - e[2]) / 1e3);
    if (merged) {
      ph[5].push_back(double(e[4] - e[2]) / 1e3);
      for (int k = 5; k <= 7; ++k) ph[size_t(k + 1)].push_back(double(e[k] - e[k - 1]) / 1e3);
    }
    end = std::max(end, double((e[3] & mask) - t0) / 1e3);
  }
  std::printf("  trace of %d CTAs, first start to last exit %.2f us; phase median/max us:", ctas,
              end);
  for (int k = 0; k < 9; ++k) {
    std::vector<double>& v = ph[size_t(k)];
    if (v.empty()) continue;
    std::sort(v.begin(), v.end());
    std::printf(" %s %.2f/%.2f", names[k], v[v.size() / 2], v.back());
  }
  std::printf("\n");
}

struct DeviceMeta {
  int32_t* kv_len = nullptr;
  int32_t* table = nullptr;
  DeviceMeta(const lab::Problem& p) {
    lab::ck(cudaMalloc(&kv_len, p.s.kv_len.size() * 4), "malloc");
    lab::ck(cudaMalloc(&table, p.table.size() * 4), "malloc");
    lab::ck(cudaMemcpy(kv_len, p.s.kv_len.data(), p.s.kv_len.size() * 4, cudaMemcpyHostToDevice),
            "copy");
    lab::ck(cudaMemcpy(table, p.table.data(), p.table.size() * 4, cudaMemcpyHostToDevice), "copy");
  }
  ~DeviceMeta() {
    cudaFree(kv_len);
    cudaFree(table);
  }
};

// A runnable version: sets itself up for a problem, returns the launch.
std::function<void()> make_version(int v, const lab::Problem& p,
                                   std::unique_ptr<CudaAttentionPlan>& plan,
                                   std::unique_ptr<DeviceMeta>& dev) {
  if (v == 1) {
    dev = std::make_unique<DeviceMeta>(p);
    const float scale = p.s.opt.scale != 0.f ? p.s.opt.scale : 1.f / std::sqrt(float(p.s.d));
    return [&p, &dev, scale] {
      decode_v1<<<dim3(unsigned(p.s.kv_len.size()), unsigned(p.s.hq)), 32>>>(
          p.dq, p.dout, p.dev_view(), dev->kv_len, dev->table, p.maxp, p.s.hq, p.s.q, scale);
      lab::ck(cudaGetLastError(), "decode_v1 launch");
    };
  }
  CudaPlanOptions o;
  // LAB_DECODE_TARGET / LAB_DECODE_CHUNKS: the split-KV knobs (CTAs per SM the split aims at,
  // chunks per CTA), for sweeps of the split at small batches.
  if (const char* e = std::getenv("LAB_DECODE_TARGET")) o.target_ctas_per_sm = std::atoi(e);
  if (const char* e = std::getenv("LAB_DECODE_CHUNKS")) o.chunks_per_cta = std::atoi(e);
  if (const char* e = std::getenv("LAB_DECODE_ITEM_PAGES")) o.decode_item_pages = std::atoi(e);
  if (const char* e = std::getenv("LAB_DECODE_CHUNK_TOKENS"))
    o.decode_chunk_tokens = std::atoi(e);
  if (v == 2) o.target_ctas_per_sm = 0;
  if (v == 4 && trace_buffer() != nullptr) o.decode_trace = trace_buffer();
  // v2, v3: the CUDA-core kernel on every group; v4: the tensor-core kernel on every group (the
  // library picks per group: CudaPlanOptions::tensor_core_decode_min_group).
  o.tensor_core_decode_min_group = v <= 3 ? 1 << 20 : 1;
  plan = std::make_unique<CudaAttentionPlan>(size_t(256) << 20, o);
  plan->plan(p.dev_q(), p.dev_view(), p.batch(), p.s.opt, p.dev_out());
  return [&p, &plan] {
    QKVTensor out = p.dev_out();
    paged_attention_cuda(*plan, p.dev_q(), p.dev_view(), out);
  };
}

lab::Shape shape(int batch, int ctx, int hkv, int d, int page, DType kv) {
  lab::Shape s;
  s.hkv = hkv;
  s.d = d;
  s.page = page;
  s.kv = kv;
  s.q_len.assign(size_t(batch), 1);
  s.kv_len.assign(size_t(batch), ctx);
  // A ragged tail: the last sequence is shorter and ends mid-page.
  if (batch > 1) s.kv_len.back() = ctx / 2 + 3;
  return s;
}

}  // namespace

// attention_decode_lab [--sweep-only] [--shape KV:BATCH:CTX:HKV[:D] ...] [--versions DIGITS]
// Environment: LAB_DECODE_TARGET, LAB_DECODE_CHUNKS, LAB_DECODE_ITEM_PAGES,
// LAB_DECODE_CHUNK_TOKENS (CudaPlanOptions' split, item-page and chunk-size knobs),
// LAB_DECODE_TRACE (the CTA timeline, below), LAB_FLUSH.
//   --shape bf16:8:8192:8 times only those shapes, any context (head dim 128 unless a fifth
//   field says; for a profiler or a sweep);
//   --versions 34 only those versions.
int main(int argc, char** argv) {
  constexpr int kVersions = 4;
  bool gate = true;
  struct Only {
    DType kv;
    int batch, ctx, hkv, d = 128;
  };
  std::vector<Only> only;
  std::vector<bool> run_v(kVersions + 1, true);
  for (int a = 1; a < argc; ++a) {
    const std::string arg = argv[a];
    if (arg == "--sweep-only") {
      gate = false;
    } else if (arg == "--shape" && a + 1 < argc) {
      char kv[16] = {};
      Only o{};
      const int n =
          std::sscanf(argv[++a], "%15[^:]:%d:%d:%d:%d", kv, &o.batch, &o.ctx, &o.hkv, &o.d);
      if (n < 4 || (o.d != 64 && o.d != 128 && o.d != 256)) {
        std::fprintf(stderr, "bad --shape %s (KV:BATCH:CTX:HKV[:D], D 64, 128 or 256)\n", argv[a]);
        return 2;
      }
      o.kv = parse_dtype(kv);
      only.push_back(o);
    } else if (arg == "--versions" && a + 1 < argc) {
      run_v.assign(kVersions + 1, false);
      for (const char* c = argv[++a]; *c; ++c)
        if (*c >= '1' && *c < '1' + kVersions) run_v[size_t(*c - '0')] = true;
    } else {
      std::fprintf(stderr, "unknown argument %s\n", arg.c_str());
      return 2;
    }
  }
  int failures = 0;
  if (gate)
    std::printf("== correctness gate (relative L2 error vs the double-precision reference)\n");
  for (DType kv : {DType::bf16, DType::fp8_e4m3})
    for (int d : {64, 128, 256})
      for (int hkv : {8, 2}) {
        if (!gate) continue;
        lab::Shape s = shape(3, 1000 + d, hkv, d, d == 64 ? 32 : 16, kv);
        lab::Problem p(s, uint64_t(d + hkv));
        for (int v = 1; v <= kVersions; ++v) {
          std::unique_ptr<CudaAttentionPlan> plan;
          std::unique_ptr<DeviceMeta> dev;
          const double err = p.check(make_version(v, p, plan, dev));
          const double tol = 1e-2;
          const bool ok = err <= tol;
          failures += !ok;
          std::printf("gate v%d kv=%s d=%d hkv=%d err=%.2e %s\n", v,
                      std::string(dtype_name(kv)).c_str(), d, hkv, err, ok ? "ok" : "FAIL");
        }
      }

  std::printf("== timing sweep (hq=32, page 16, cold L2 (%s flush), median of 20)\n",
              lab::clean_flush() ? "clean" : "memset");
  std::printf("%-5s %-6s %-6s %-4s %-5s %9s %9s %9s %9s %8s %8s %8s %8s\n", "kv", "batch", "ctx",
              "hkv", "d", "v1_us", "v2_us", "v3_us", "v4_us", "v1_GBps", "v2_GBps", "v3_GBps",
              "v4_GBps");
  // The method's floor: an empty kernel timed the same way (flush, events around one launch).
  std::printf("empty kernel under the same timing: %.1f us\n",
              lab::time_us([] { empty_kernel<<<1, 32>>>(); }));
  // The default grid, or (--shape) exactly the shapes asked for, in their order.
  if (only.empty())
    for (DType kv : {DType::bf16, DType::fp8_e4m3})
      for (int hkv : {8, 32})
        for (int batch : {1, 8, 64})
          for (int ctx : {512, 8192}) only.push_back({kv, batch, ctx, hkv});
  for (const Only& o : only) {
    lab::Shape s = shape(o.batch, o.ctx, o.hkv, o.d, 16, o.kv);
    s.kv_len.assign(size_t(o.batch), o.ctx);
    lab::Problem p(s, 1, false);
    double us[kVersions + 1] = {};
    for (int v = 1; v <= kVersions; ++v) {
      if (!run_v[size_t(v)]) continue;
      std::unique_ptr<CudaAttentionPlan> plan;
      std::unique_ptr<DeviceMeta> dev;
      us[v] = lab::time_us(make_version(v, p, plan, dev), v == 1 ? 5 : 20);
      if (v == 4 && trace_buffer() != nullptr) {
        const int ctas = plan->info().decode_ctas * o.hkv * ((32 / o.hkv + 7) / 8);
        if (size_t(ctas) <= kTraceCtas && plan->info().decode_tc_rows == 8) print_trace(ctas);
      }
    }
    const double gb = double(p.kv_bytes()) / 1e3;
    auto gbps = [&](int v) { return us[v] > 0 ? gb / us[v] : 0.0; };
    std::printf("%-5s %-6d %-6d %-4d %-5d %9.1f %9.1f %9.1f %9.1f %8.0f %8.0f %8.0f %8.0f\n",
                std::string(dtype_name(o.kv)).c_str(), o.batch, o.ctx, o.hkv, o.d, us[1], us[2],
                us[3], us[4], gbps(1), gbps(2), gbps(3), gbps(4));
  }
  std::printf("gate: %s (%d failures)\n", failures ? "FAIL" : "ok", failures);
  return failures ? 1 : 0;
}
