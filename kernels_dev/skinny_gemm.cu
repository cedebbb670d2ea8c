// Kernel lab: the skinny GEMM of decode steps, Y[T, N] = X[T, K] . W[N, K]^T with T <= 64, against
// cuBLAS (cublasGemmEx, the model's path for larger T) on the Llama-3-8B projection shapes.
//
//   skinny_gemm_lab              correctness gate on every version, then the timing sweep
//   skinny_gemm_lab --sweep-only the sweep alone
//   skinny_gemm_lab --sweep-only --shape T:N:K   one shape (e.g. under a profiler)
//
// Versions (skinny_gemm_versions.cu, the kernel in skinny_gemm_kernel.cuh; v1 is the default
// configuration, checked by skinny_gemm_check.cpp). Until 2026-11-23 v1 was in the library
// (src/model/cuda), opt-in behind LlamaModelCuda::set_skinny_gemm_max_tokens; it moved here
// because cuBLAS beats it at every decode shape but lm_head (below), and the model uses cuBLAS:
//   v1  8 warps, 16 weight rows each (128 rows per CTA), 4-stage cp.async ring of 64-wide k-blocks
//       (16 KiB of W per stage), tokens as the mma's N side; K split over CTAs to fill one wave of
//       2 CTAs per SM, partials stored to global memory and added in split order by the tile's
//       last CTA (a counter per tile).
//   v2  v1 with the splits of a tile launched as one thread-block cluster: the partials stay in
//       each CTA's shared memory and the cluster adds them through distributed shared memory.
//
// Measured: H100 80GB HBM3, 2026-11-23, cold L2, median of 20, % of the copy bandwidth (2989
// GB/s), cublasGemmEx (CUBLAS_GEMM_DEFAULT, f32 output) beside v1 and v2, after the copies' address
// arithmetic was hoisted out of the k loop (StageCopier; before it, v1 was 3-6 points lower at
// T = 1: gate/up 84.7%, down 80.4%, lm_head 90.7%):
//                               T=1                   T=16                  T=32
//                        cublas   v1     v2    cublas   v1     v2    cublas   v1     v2
//   qkv     6144 x 4096   74.0%  70.3%  70.4%   73.8%  61.8%  69.4%   73.3%  52.8%  55.5%
//   o       4096 x 4096   63.6%  61.9%  59.6%   64.2%  51.7%  57.9%   68.9%  42.7%  44.8%
//   gate/up 28672 x 4096  90.5%  88.5%  88.5%   91.2%  89.0%  88.8%   90.0%  87.2%  86.9%
//   down    4096 x 14336  86.6%  83.6%  78.2%   86.8%  77.4%  77.1%   87.0%  70.3%  63.0%
//   lm_head 128256 x 4096 92.6%  95.7%  95.3%   93.3%  94.0%  94.1%   93.0%  93.0%  93.0%
// cuBLAS wins at every shape but lm_head, so the model keeps it. The kernel's time grows with T
// even where the main loop does the same work (T = 1 to 16 share one 16-token tile) in the split
// shapes only: the split's reduction is the cost (v1: 1 L2 round trip per partial in a first
// version, all partials in flight now; v2 avoids global memory and is flatter up to T = 16, but
// slower on down's 8-way clusters). Tried and dropped: 256 weight rows per CTA (X read half as
// often from L2; slower everywhere, 1 CTA per SM), each tile starting its k range at a different
// block (no change: X reads from L2 are not the limit). Nsight Compute
// (scripts/device/profile-gemm.sh, base clocks), before the hoisting: v1 on gate/up at T = 32 (no
// split) reached 72% of DRAM peak with the SMs' issue slots 47% busy, the ALU and FMA pipes 30-36%
// (per-chunk address and swizzle arithmetic of 6 cp.async per thread per stage) and under one
// eligible warp per scheduler; at T = 16 on qkv (split 5): v1 51%, v2 59% of DRAM peak. Hoisting
// the arithmetic gained 1-5 points; the split shapes at T >= 16 stay far behind. What would close
// the gap to cuBLAS (whose kernels use TMA): bulk copies (TMA, or cp.async.bulk per row into padded
// rows) completing on mbarriers from one issuing thread, a deeper ring, fewer, larger splits.
// In the whole model (bench model --skinny-max-tokens 64 against 0, both without CUDA graphs,
// after the hoisting): 6.80 against 6.82 ms per step at batch 1, 8.92 against 8.11 at batch 32.
//
// The gate compares with a double-precision product on the host (every element of small shapes,
// 2048 sampled ones of large shapes), for f32 output, f32 accumulation into Y, and bf16 output.
// Timing: cold L2 (lab_common.h), median of 20, bytes = W + X + Y, against the device-to-device
// copy measured in the same run.
#include <cublas_v2.h>

#include <cstdio>

#include "cuda_bandwidth.h"
#include "lab_common.h"
#include "skinny_gemm.h"

namespace {

using pagedattn::cuda::SkinnyArgs;
using pagedattn::cuda::SkinnyPlan;
constexpr int kVersions = 2;

struct Mats {
  int T, N, K;
  std::vector<uint16_t> x, w;
  uint16_t *dx = nullptr, *dw = nullptr;
  float* dy = nullptr;
  float* dpart = nullptr;
  unsigned* dcnt = nullptr;
  Mats(int t, int n, int k, uint64_t seed) : T(t), N(n), K(k) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    x.resize(size_t(T) * K);
    w.resize(size_t(N) * K);
    for (auto& v : x) v = pagedattn::f32_to_bf16(nd(rng));
    // Large weights: 1 Mi fresh values tiled (the reference only samples them).
    const size_t fresh = std::min<size_t>(w.size(), size_t(1) << 20);
    for (size_t i = 0; i < fresh; ++i) w[i] = pagedattn::f32_to_bf16(0.02f * nd(rng));
    for (size_t i = fresh; i < w.size(); ++i) w[i] = w[i % fresh];
    lab::ck(cudaMalloc(&dx, x.size() * 2), "malloc x");
    lab::ck(cudaMalloc(&dw, w.size() * 2), "malloc w");
    lab::ck(cudaMalloc(&dy, size_t(T) * N * 4), "malloc y");
    lab::ck(cudaMalloc(&dpart, size_t(T) * N * 4 * 64), "malloc partial");
    lab::ck(cudaMalloc(&dcnt, size_t(N) * 4), "malloc counters");
    lab::ck(cudaMemset(dcnt, 0, size_t(N) * 4), "zero counters");
    lab::ck(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "copy x");
    lab::ck(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice), "copy w");
  }
  ~Mats() {
    for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(dy),
                    static_cast<void*>(dpart), static_cast<void*>(dcnt)})
      cudaFree(p);
  }
  SkinnyArgs args(bool y_bf16, bool accumulate) const {
    SkinnyArgs a;
    a.x = dx;
    a.w = dw;
    a.y = dy;
    a.T = T;
    a.N = N;
    a.K = K;
    a.y_bf16 = y_bf16;
    a.accumulate = accumulate;
    a.partial = dpart;
    a.counters = dcnt;
    return a;
  }
  double bytes() const { return 2.0 * (double(N) * K + double(T) * K) + 4.0 * T * N; }
};

int num_sms() {
  int dev = 0, n = 0;
  lab::ck(cudaGetDevice(&dev), "device");
  lab::ck(cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev), "sms");
  return n;
}

// Worst error over the checked elements, in units of sum_k |x w| (the scale of f32 rounding),
// beyond the bf16 output's rounding when y_bf16; +inf for a NaN.
double check(const Mats& m, int version, bool y_bf16, bool accumulate) {
  const SkinnyPlan plan = pagedattn::cuda::skinny_gemm_plan(m.N, m.K, num_sms(), version);
  const size_t n_out = size_t(m.T) * m.N;
  std::vector<float> y0(n_out);
  std::mt19937 rng(uint32_t(m.N + m.K));
  std::normal_distribution<float> nd(0.f, 1.f);
  for (auto& v : y0) v = nd(rng);
  if (accumulate) {
    lab::ck(cudaMemcpy(m.dy, y0.data(), n_out * 4, cudaMemcpyHostToDevice), "copy y0");
  } else {
    lab::ck(cudaMemset(m.dy, 0xff, n_out * 4), "poison y");
  }
  pagedattn::cuda::skinny_gemm(m.args(y_bf16, accumulate), plan, nullptr, version);
  lab::ck(cudaDeviceSynchronize(), "run");
  std::vector<float> got(n_out);
  std::vector<uint16_t> got16(n_out);
  if (y_bf16) {
    lab::ck(cudaMemcpy(got16.data(), m.dy, n_out * 2, cudaMemcpyDeviceToHost), "copy y");
    for (size_t i = 0; i < n_out; ++i) got[i] = pagedattn::bf16_to_f32(got16[i]);
  } else {
    lab::ck(cudaMemcpy(got.data(), m.dy, n_out * 4, cudaMemcpyDeviceToHost), "copy y");
  }
  const bool all = double(m.T) * m.N * m.K <= 64e6;
  const int samples = all ? int(n_out) : 2048;
  double worst = 0;
  for (int s = 0; s < samples; ++s) {
    const size_t i = all ? size_t(s) : size_t(rng()) % n_out;
    const int t = int(i / size_t(m.N)), n = int(i % size_t(m.N));
    double ref = 0, mag = 0;
    for (int k = 0; k < m.K; ++k) {
      const double p = double(pagedattn::bf16_to_f32(m.x[size_t(t) * m.K + k])) *
                       pagedattn::bf16_to_f32(m.w[size_t(n) * m.K + k]);
      ref += p;
      mag += std::fabs(p);
    }
    if (accumulate) ref += y0[i], mag += std::fabs(y0[i]);
    if (std::isnan(got[i])) return INFINITY;
    const double rounding = y_bf16 ? std::fabs(ref) / 256.0 : 0.0;  // bf16: 2^-8 relative
    worst = std::max(worst, std::max(0.0, std::fabs(got[i] - ref) - rounding) / (mag + 1e-30));
  }
  return worst;
}

double time_cublas(cublasHandle_t h, const Mats& m) {
  const float one = 1.f, zero = 0.f;
  return lab::time_us([&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m.N, m.T, m.K, &one, m.dw, CUDA_R_16BF, m.K, m.dx,
                 CUDA_R_16BF, m.K, &zero, m.dy, CUDA_R_32F, m.N, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  });
}

double time_version(const Mats& m, int v) {
  const SkinnyPlan plan = pagedattn::cuda::skinny_gemm_plan(m.N, m.K, num_sms(), v);
  const SkinnyArgs a = m.args(false, false);
  return lab::time_us([&] { pagedattn::cuda::skinny_gemm(a, plan, nullptr, v); });
}

}  // namespace

int main(int argc, char** argv) {
  bool gate = true;
  int only[3] = {0, 0, 0};  // T, N, K
  for (int a = 1; a < argc; ++a) {
    if (std::string(argv[a]) == "--sweep-only") {
      gate = false;
    } else if (std::string(argv[a]) == "--shape" && a + 1 < argc) {
      if (std::sscanf(argv[++a], "%d:%d:%d", &only[0], &only[1], &only[2]) != 3) {
        std::fprintf(stderr, "bad --shape %s (T:N:K)\n", argv[a]);
        return 2;
      }
    } else {
      std::fprintf(stderr, "unknown argument %s\n", argv[a]);
      return 2;
    }
  }
  int failures = 0;
  if (gate) {
    // f32 rounding over K terms stays near sqrt(K) * 2^-24 of sum |x w|; a missing or doubled
    // 8-wide chunk would be about 8 / K of it (5.6e-4 at K = 14336).
    constexpr double kTol = 2e-6;
    std::printf("== correctness gate (worst error / sum|x w|, tolerance %.0e)\n", kTol);
    const int shapes[][2] = {{64, 64},     {200, 136},    {576, 576},    {1000, 1536},
                             {6144, 4096}, {4096, 14336}, {28672, 4096}, {129, 4104}};
    for (const auto& nk : shapes)
      for (int T : {1, 3, 8, 16, 17, 32, 33, 64}) {
        Mats m(T, nk[0], nk[1], uint64_t(T * 131 + nk[0]));
        for (int v = 1; v <= kVersions; ++v)
          for (int mode = 0; mode < 3; ++mode) {
            const double e = check(m, v, mode == 2, mode == 1);
            const bool ok = e <= kTol;
            failures += !ok;
            if (!ok || (T == 32 && mode == 0))
              std::printf("  v%d T=%-3d N=%-6d K=%-6d %-10s err %.2e %s\n", v, T, m.N, m.K,
                          mode == 0   ? "f32"
                          : mode == 1 ? "f32 accum"
                                      : "bf16",
                          e, ok ? "ok" : "FAIL");
          }
      }
    std::printf("gate: %s\n", failures ? "FAILED" : "passed");
    if (failures) return 1;
  }
  const pagedattn::bench::CopyBandwidth copy = pagedattn::bench::measure_copy_bandwidth();
  std::printf("== timing (%s, copy %.0f GB/s; cold L2, median of 20; GB/s of W + X + Y)\n",
              copy.device.c_str(), copy.gbps);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 2;
  struct Op {
    const char* name;
    int N, K, per_step;  // launches per Llama-3-8B decode step
  };
  const Op ops[] = {{"qkv", 6144, 4096, 32},
                    {"o", 4096, 4096, 32},
                    {"gate/up", 28672, 4096, 32},
                    {"down", 4096, 14336, 32},
                    {"lm_head", 128256, 4096, 1}};
  std::printf("%-8s %3s %7s %7s | %9s %9s %9s | %7s %7s %7s (%% of copy)\n", "op", "T", "N", "K",
              "cublas us", "v1 us", "v2 us", "cublas", "v1", "v2");
  for (int T : {1, 8, 16, 32, 64}) {
    if (only[0] && T != only[0]) continue;
    double step[kVersions + 1] = {};
    for (const Op& op : ops) {
      if (only[0] && (op.N != only[1] || op.K != only[2])) continue;
      Mats m(T, op.N, op.K, 1);
      double us[kVersions + 1];
      us[0] = time_cublas(h, m);
      for (int v = 1; v <= kVersions; ++v) us[v] = time_version(m, v);
      auto pct = [&](double u) { return 100.0 * m.bytes() / (u * 1e-6) / (copy.gbps * 1e9); };
      static_assert(kVersions == 2, "the table has columns for v1 and v2");
      std::printf("%-8s %3d %7d %7d | %9.1f %9.1f %9.1f | %6.1f%% %6.1f%% %6.1f%%\n", op.name, T,
                  op.N, op.K, us[0], us[1], us[2], pct(us[0]), pct(us[1]), pct(us[2]));
      for (int v = 0; v <= kVersions; ++v) step[v] += us[v] * op.per_step;
    }
    std::printf(
        "  T=%d: the projections of one Llama-3-8B step: cublas %.2f ms, v1 %.2f ms, v2 "
        "%.2f ms\n",
        T, step[0] / 1e3, step[1] / 1e3, step[2] / 1e3);
  }
  cublasDestroy(h);
  return 0;
}
