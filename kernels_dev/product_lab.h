// Shared pieces of the decode-product labs (gemv.cu, wgmma_gemm.cu): random bf16 operands on the
// device, the correctness gate against a double-precision product on the host, and the products
// of the models they are timed on.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <random>
#include <vector>

#include "gemv.h"  // GemvArgs
#include "lab_common.h"
#include "pagedattn/dtype.h"

namespace lab {

using pagedattn::cuda::GemvArgs;
using pagedattn::cuda::product_args;

// x [T, K] (normal) and W [N, K] (1 Mi fresh values, tiled) on the device, y [T, N] f32.
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
    ck(cudaMalloc(&dx, x.size() * 2), "malloc x");
    ck(cudaMalloc(&dw, w.size() * 2), "malloc w");
    ck(cudaMalloc(&dy, size_t(T) * N * 4), "malloc y");
    ck(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "copy x");
    ck(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice), "copy w");
  }
  ~Mats() {
    cudaFree(dx);
    cudaFree(dw);
    cudaFree(dy);
  }
  GemvArgs args(bool bf16_out, bool accumulate) const {
    GemvArgs a = product_args(dx, dw, dy, T, N, K, N);
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

// Whether launch(args) matches the double product within tolerance in every output mode (f32,
// f32 accumulated onto 1.0, bf16), every element of small shapes and 4096 sampled ones of large
// shapes, and gives the same bits twice. `what` names it in the failure line.
inline bool gate(int T, int N, int K, const char* what,
                 const std::function<void(const GemvArgs&)>& launch) {
  Mats m(T, N, K, uint64_t(T * 7 + N * 13 + K));
  for (int mode = 0; mode < 3; ++mode) {  // f32, f32 accumulated onto 1.0, bf16
    const bool bf16 = mode == 2, acc = mode == 1;
    std::vector<float> y(size_t(T) * N), again(y.size());
    for (int run = 0; run < 2; ++run) {
      std::vector<float> init(size_t(T) * N, 1.f);
      ck(cudaMemcpy(m.dy, init.data(), init.size() * 4, cudaMemcpyHostToDevice), "init");
      if (!acc) ck(cudaMemset(m.dy, 0xff, size_t(T) * N * 4), "poison");
      launch(m.args(bf16, acc));
      ck(cudaDeviceSynchronize(), what);
      std::vector<float>& out = run == 0 ? y : again;
      if (bf16) {
        std::vector<uint16_t> yb(size_t(T) * N);
        ck(cudaMemcpy(yb.data(), m.dy, yb.size() * 2, cudaMemcpyDeviceToHost), "down");
        for (size_t i = 0; i < out.size(); ++i) out[i] = pagedattn::bf16_to_f32(yb[i]);
      } else {
        ck(cudaMemcpy(out.data(), m.dy, out.size() * 4, cudaMemcpyDeviceToHost), "down");
      }
    }
    if (std::memcmp(y.data(), again.data(), y.size() * 4) != 0) {
      std::printf("gate %s T=%d N=%d K=%d mode %d: FAILED (two runs differ)\n", what, T, N, K,
                  mode);
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
      std::printf("gate %s T=%d N=%d K=%d mode %d: FAILED (worst %.3g)\n", what, T, N, K, mode,
                  worst);
      return false;
    }
  }
  return true;
}

// The products the labs time: Llama-3-8B's, one rank's of its two-way split, SmolLM2-135M's.
struct ProductShape {
  const char* name;
  int N, K;
};
inline const std::vector<ProductShape>& decode_products() {
  static const std::vector<ProductShape> ops = {
      {"8b qkv", 6144, 4096},       {"8b o", 4096, 4096},        {"8b gate/up", 28672, 4096},
      {"8b down", 4096, 14336},     {"8b lm_head", 128256, 4096}, {"tp2 qkv", 3072, 4096},
      {"tp2 o", 4096, 2048},        {"tp2 gate/up", 14336, 4096}, {"tp2 down", 4096, 7168},
      {"tp2 lm_head", 64128, 4096}, {"smol qkv", 960, 576},       {"smol o", 576, 576},
      {"smol gate/up", 3072, 576},  {"smol down", 576, 1536},     {"smol lm_head", 49152, 576}};
  return ops;
}

}  // namespace lab
