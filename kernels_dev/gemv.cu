// Kernel lab: the few-token product of decode steps, y [T, N] = x [T, K] . W [N, K]^T (bf16
// operands, f32 accumulation and output), the library's gemv (src/model/cuda/gemv.h) against
// cuBLAS (cublasGemmEx, CUBLAS_GEMM_DEFAULT: the model's path without it).
//
//   gemv_lab               correctness gate, then the sweep
//   gemv_lab --sweep-only  the sweep alone
//
// Versions (gemv.h): v1, v2 = a warp per 2 or 4 rows of W; v3, v4 = a block per 4 or 8 rows, its
// threads splitting K.
// Gate: every version against a double-precision product on the host (every element of small
// shapes, 4096 sampled ones of large shapes), f32 output, accumulation into f32, bf16 output.
// Timing: cold L2 (lab_common.h), median of 20, % of the device-to-device copy rate measured in
// the same run for the bytes of W + x + y.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda_bandwidth.h"
#include "gemv.h"
#include "lab_common.h"
#include "pagedattn/dtype.h"

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

// Worst error of version v over the checked elements, relative to the row's scale.
bool gate(int T, int N, int K, int v) {
  Mats m(T, N, K, uint64_t(T * 7 + N * 13 + K));
  bool ok = true;
  for (int mode = 0; mode < 3; ++mode) {  // f32, f32 accumulated onto 1.0, bf16
    const bool bf16 = mode == 2, acc = mode == 1;
    std::vector<float> init(size_t(T) * N, 1.f);
    lab::ck(cudaMemcpy(m.dy, init.data(), init.size() * 4, cudaMemcpyHostToDevice), "init");
    if (!acc) lab::ck(cudaMemset(m.dy, 0xff, size_t(T) * N * 4), "poison");
    pagedattn::cuda::gemv(m.args(bf16, acc), nullptr, v);
    lab::ck(cudaDeviceSynchronize(), "gemv");
    std::vector<float> y(size_t(T) * N);
    std::vector<uint16_t> yb(size_t(T) * N);
    if (bf16) {
      lab::ck(cudaMemcpy(yb.data(), m.dy, yb.size() * 2, cudaMemcpyDeviceToHost), "down");
      for (size_t i = 0; i < y.size(); ++i) y[i] = pagedattn::bf16_to_f32(yb[i]);
    } else {
      lab::ck(cudaMemcpy(y.data(), m.dy, y.size() * 4, cudaMemcpyDeviceToHost), "down");
    }
    const size_t total = size_t(T) * N, step = total <= 4096 ? 1 : total / 4096;
    double worst = 0;
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
  return ok;
}

}  // namespace

int main(int argc, char** argv) {
  const bool sweep_only = argc > 1 && std::string(argv[1]) == "--sweep-only";
  if (!sweep_only) {
    int failures = 0;
    const int shapes[][2] = {{1, 8}, {5, 24}, {576, 576}, {960, 576}, {1000, 1536}, {4099, 520}};
    for (int v = 1; v <= pagedattn::cuda::kGemvVersions; ++v)
      for (int T = 1; T <= pagedattn::cuda::kGemvMaxTokens; ++T)
        for (const auto& s : shapes) failures += gate(T, s[0], s[1], v) ? 0 : 1;
    std::printf("gate: %s (%d failures)\n", failures ? "FAILED" : "ok", failures);
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
  const Op ops[] = {{"8b qkv", 6144, 4096},       {"8b o", 4096, 4096},
                    {"8b gate/up", 28672, 4096},  {"8b down", 4096, 14336},
                    {"8b lm_head", 128256, 4096}, {"tp2 qkv", 3072, 4096},
                    {"tp2 o", 4096, 2048},        {"tp2 gate/up", 14336, 4096},
                    {"tp2 down", 4096, 7168},     {"tp2 lm_head", 64128, 4096},
                    {"smol qkv", 960, 576},       {"smol o", 576, 576},
                    {"smol gate/up", 3072, 576},  {"smol down", 576, 1536},
                    {"smol lm_head", 49152, 576}};
  std::printf("%-13s %2s %7s %6s | %7s %7s %7s %7s %7s | %7s %6s %6s %6s %6s (%% of copy)\n",
              "op", "T", "N", "K", "cublas", "v1 us", "v2 us", "v3 us", "v4 us", "cublas", "v1",
              "v2", "v3", "v4");
  const float one = 1.f, zero = 0.f;
  for (int T : {1, 2, 4, 8}) {
    for (const Op& op : ops) {
      Mats m(T, op.N, op.K, 1);
      const GemvArgs a = m.args(false, false);
      const std::vector<double> us = lab::time_us_interleaved(
          {[&] {
             cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, m.N, m.T, m.K, &one, m.dw, CUDA_R_16BF, m.K,
                          m.dx, CUDA_R_16BF, m.K, &zero, m.dy, CUDA_R_32F, m.N, CUBLAS_COMPUTE_32F,
                          CUBLAS_GEMM_DEFAULT);
           },
           [&] { pagedattn::cuda::gemv(a, nullptr, 1); },
           [&] { pagedattn::cuda::gemv(a, nullptr, 2); },
           [&] { pagedattn::cuda::gemv(a, nullptr, 3); },
           [&] { pagedattn::cuda::gemv(a, nullptr, 4); }},
          2, 10);
      auto pct = [&](double u) { return 100.0 * m.bytes() / (u * 1e-6) / (copy.gbps * 1e9); };
      std::printf("%-13s %2d %7d %6d | %7.1f %7.1f %7.1f %7.1f %7.1f | %6.1f%% %5.1f%% %5.1f%% "
                  "%5.1f%% %5.1f%%\n",
                  op.name, T, op.N, op.K, us[0], us[1], us[2], us[3], us[4], pct(us[0]),
                  pct(us[1]), pct(us[2]), pct(us[3]), pct(us[4]));
    }
  }
  cublasDestroy(h);
  return 0;
}
