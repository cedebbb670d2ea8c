// Kernel lab: the decode steps' product at a few dozen tokens on Hopper, y [T, N] = x [T, K] .
// W [N, K]^T (bf16 operands, f32 accumulation), the library's wgmma_gemm
// (src/model/cuda/wgmma_gemm.h: wgmma fed by bulk tensor copies, K slices summed in a cluster)
// against cuBLAS (cublasGemmEx, CUBLAS_GEMM_DEFAULT: the model's path without it) and, at one
// and two tokens, gemv's version 3.
//
// Versions (wgmma_gemm.cu): 1, 128 rows a CTA, a ring of five 16 KiB W stages, two CTAs per SM
// (the model's); 2, ten stages, one CTA per SM; 3, two stages of 32 KiB (128 K elements), two
// CTAs per SM; 4, 256 rows a CTA in two warpgroups (half the x reads), one CTA per SM.
//
//   wgmma_gemm_lab               correctness gate, then the sweep
//   wgmma_gemm_lab --sweep-only  the sweep alone
//   wgmma_gemm_lab --shape T:N:K one shape's timing alone (for a profiler)
//
// Gate: against a double-precision product on the host (every element of small shapes, 4096
// sampled ones of large shapes), f32 output (poisoned first), accumulation into f32, bf16 output;
// shapes with N not a multiple of 128 and K not a multiple of 64; twice each (the same bits).
// Timing: cold L2 (lab_common.h), median of 20, % of the device-to-device copy rate measured in
// the same run for the bytes of W + x + y.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_bandwidth.h"
#include "gemv.h"
#include "lab_common.h"
#include "pagedattn/dtype.h"
#include "wgmma_gemm.h"

namespace {

using pagedattn::cuda::GemvArgs;

struct Mats {
  int T, N, K;
  std::vector<uint16_t> x, w;
  uint16_t *dx = nullptr, *dw = nullptr;
  float* dy = nullptr;
  Mats(int t, int n, int k, uint64_t seed) : T(t), N(n), K(k) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> nd(0.f, 1.f);
    x.resize(size_t(T) * K);
    w.resize(size_t(N) * K);
    for (auto& v : x) v = pagedattn::f32_to_bf16(nd(rng));
    const size_t fresh = std::min<size_t>(w.size(), size_t(1) << 20);
    for (size_t i = 0; i < fresh; ++i) w[i] = pagedattn::f32_to_bf16(0.05f * nd(rng));
    for (size_t i = fresh; i < w.size(); ++i) w[i] = w[i % fresh];
    lab::ck(cudaMalloc(&dx, x.size() * 2), "malloc x");
    lab::ck(cudaMalloc(&dw, w.size() * 2), "malloc w");
    lab::ck(cudaMalloc(&dy, size_t(T) * N * 4), "malloc y");
    lab::ck(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "copy x");
    lab::ck(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice), "copy w");
  }
  ~Mats() {
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
  }
  GemvArgs args(bool bf16_out, bool accumulate) const {
    GemvArgs a;
    a.x = dx;
    a.w = dw;
    a.y = dy;
    a.T = T;
    a.N = N;
    a.K = K;
    a.ldy = N;
    a.y_bf16 = bf16_out;
    a.accumulate = accumulate;
    return a;
  }
  double ref(int t, int n) const {
    double s = 0;
    for (int k = 0; k < K; ++k)
      s += double(pagedattn::bf16_to_f32(x[size_t(t) * K + k])) *
           double(pagedattn::bf16_to_f32(w[size_t(n) * K + k]));
    return s;
  }
  double bytes() const { return 2.0 * N * K + 2.0 * T * K + 4.0 * T * N; }
};

// Whether wgmma_gemm matches the double product within tolerance in every mode, and gives the
// same bits twice.
bool gate(int T, int N, int K, int v) {
  Mats m(T, N, K, uint64_t(T * 7 + N * 13 + K));
  for (int mode = 0; mode < 3; ++mode) {  // f32, f32 accumulated onto 1.0, bf16
    const bool bf16 = mode == 2, acc = mode == 1;
    std::vector<float> y(size_t(T) * N), again(y.size());
    for (int run = 0; run < 2; ++run) {
      std::vector<float> init(size_t(T) * N, 1.f);
      lab::ck(cudaMemcpy(m.dy, init.data(), init.size() * 4, cudaMemcpyHostToDevice), "init");
      if (!acc) lab::ck(cudaMemset(m.dy, 0xff, size_t(T) * N * 4), "poison");
      pagedattn::cuda::wgmma_gemm(m.args(bf16, acc), nullptr, v);
      lab::ck(cudaDeviceSynchronize(), "wgmma_gemm");
      std::vector<float>& out = run == 0 ? y : again;
      if (bf16) {
        std::vector<uint16_t> yb(size_t(T) * N);
        lab::ck(cudaMemcpy(yb.data(), m.dy, yb.size() * 2, cudaMemcpyDeviceToHost), "down");
        for (size_t i = 0; i < out.size(); ++i) out[i] = pagedattn::bf16_to_f32(yb[i]);
      } else {
        lab::ck(cudaMemcpy(out.data(), m.dy, out.size() * 4, cudaMemcpyDeviceToHost), "down");
      }
    }
    if (std::memcmp(y.data(), again.data(), y.size() * 4) != 0) {
      std::printf("gate v%d T=%d N=%d K=%d mode %d: FAILED (two runs differ)\n", v, T, N, K, mode);
      return false;
    }
    const size_t total = size_t(T) * N, step = total <= 4096 ? 1 : total / 4096;
    double worst = 0;
    bool ok = true;
    for (size_t i = 0; i < total; i += step) {
      const int t = int(i / N), n = int(i % N);
      const double want = m.ref(t, n) + (acc ? 1.0 : 0.0);
      const double tol = bf16 ? 8e-3 * std::abs(want) + 1e-3 : 1e-4 * (1 + std::abs(want));
      const double err = std::abs(double(y[i]) - want);
      if (!(err <= tol)) ok = false;
      worst = std::max(worst, err / (1 + std::abs(want)));
    }
    if (!ok) {
      std::printf("gate v%d T=%d N=%d K=%d mode %d: FAILED (worst %.3g)\n", v, T, N, K, mode,
                  worst);
      return false;
    }
  }
  return true;
}

}  // namespace

int main(int argc, char** argv) {
  if (!pagedattn::cuda::wgmma_gemm_available()) {
    std::printf("wgmma_gemm: this device cannot run it (sm_90 only)\n");
    return 0;
  }
  bool sweep_only = false;
  int only_t = 0, only_n = 0, only_k = 0;  // --shape T:N:K: that shape alone (for a profiler)
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sweep-only") sweep_only = true;
    if (arg == "--shape" && i + 1 < argc &&
        std::sscanf(argv[++i], "%d:%d:%d", &only_t, &only_n, &only_k) == 3)
      sweep_only = true;
  }
  if (!sweep_only) {
    int failures = 0, gates = 0;
    const int shapes[][2] = {{1, 8},      {5, 24},      {576, 576},    {960, 576}, {1000, 1536},
                             {4099, 520}, {3072, 4096}, {4096, 14336}, {200, 64},  {129, 4104}};
    for (int T : {1, 2, 3, 8, 9, 16, 17, 31, 32, 33, 48, 64})
      for (const auto& s : shapes)
        for (int v = 1; v <= pagedattn::cuda::kWgmmaGemmVersions; ++v) {
          failures += gate(T, s[0], s[1], v) ? 0 : 1;
          ++gates;
        }
    std::printf("gate: %s (%d of %d failed)\n", failures ? "FAILED" : "ok", failures, gates);
    if (failures) return 1;
  }
  const pagedattn::bench::CopyBandwidth copy = pagedattn::bench::measure_copy_bandwidth();
  std::printf("== timing (%s, copy %.0f GB/s; cold L2, median of 20; %% of copy for W + x + y)\n",
              copy.device.c_str(), copy.gbps);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 2;
  struct Op {
    const char* name;
    int N, K;
  };
  // Llama-3-8B's projections, one rank's of its two-way split, SmolLM2-135M's.
  const Op ops[] = {
      {"8b qkv", 6144, 4096},       {"8b o", 4096, 4096},         {"8b gate/up", 28672, 4096},
      {"8b down", 4096, 14336},     {"8b lm_head", 128256, 4096}, {"tp2 qkv", 3072, 4096},
      {"tp2 o", 4096, 2048},        {"tp2 gate/up", 14336, 4096}, {"tp2 down", 4096, 7168},
      {"tp2 lm_head", 64128, 4096}, {"smol qkv", 960, 576},       {"smol o", 576, 576},
      {"smol gate/up", 3072, 576},  {"smol down", 576, 1536},     {"smol lm_head", 49152, 576}};
  constexpr int V = pagedattn::cuda::kWgmmaGemmVersions;
  std::printf("%-13s %2s %7s %6s | %7s", "op", "T", "N", "K", "cublas");
  for (int v = 1; v <= V; ++v) std::printf("   v%d us", v);
  std::printf(" %7s | %6s", "gemv", "cublas");
  for (int v = 1; v <= V; ++v) std::printf("     v%d", v);
  std::printf(" %6s (%% of copy) | best\n", "gemv");
  const float one = 1.f, zero = 0.f;
  std::vector<Op> all(std::begin(ops), std::end(ops));
  std::vector<int> token_counts = {1, 2, 4, 8, 16, 32, 64};
  if (only_t > 0) {
    all = {{"shape", only_n, only_k}};
    token_counts = {only_t};
  }
  for (int T : token_counts) {
    for (const Op& op : all) {
      Mats m(T, op.N, op.K, 1);
      const GemvArgs a = m.args(false, false);
      const bool with_gemv = T <= 2;
      std::vector<std::function<void()>> runs = {[&] {
        cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m.N, m.T, m.K, &one, m.dw, CUDA_R_16BF, m.K, m.dx,
                     CUDA_R_16BF, m.K, &zero, m.dy, CUDA_R_32F, m.N, CUBLAS_COMPUTE_32F,
                     CUBLAS_GEMM_DEFAULT);
      }};
      for (int v = 1; v <= V; ++v)
        runs.push_back([&, v] { pagedattn::cuda::wgmma_gemm(a, nullptr, v); });
      if (with_gemv) runs.push_back([&] { pagedattn::cuda::gemv(a, nullptr, 3); });
      const std::vector<double> us = lab::time_us_interleaved(runs, 2, 10);
      auto pct = [&](double u) {
        return u > 0 ? 100.0 * m.bytes() / (u * 1e-6) / (copy.gbps * 1e9) : 0.0;
      };
      const double g = with_gemv ? us[V + 1] : 0.0;
      int best = 0;  // 0 cuBLAS, 1..V a version, V + 1 gemv
      for (size_t i = 1; i < us.size(); ++i)
        if (us[i] < us[size_t(best)]) best = int(i);
      const std::string name = best == 0   ? "cublas"
                               : best <= V ? "v" + std::to_string(best)
                                           : "gemv";
      std::printf("%-13s %2d %7d %6d | %7.1f", op.name, T, op.N, op.K, us[0]);
      for (int v = 1; v <= V; ++v) std::printf(" %7.1f", us[size_t(v)]);
      std::printf(" %7.1f | %5.1f%%", g, pct(us[0]));
      for (int v = 1; v <= V; ++v) std::printf(" %5.1f%%", pct(us[size_t(v)]));
      std::printf(" %5.1f%% | %s\n", pct(g), name.c_str());
    }
  }
  cublasDestroy(h);
  return 0;
}
