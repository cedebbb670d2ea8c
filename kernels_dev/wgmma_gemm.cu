// Kernel lab: the decode steps' product at a few dozen tokens on Hopper, y [T, N] = x [T, K] .
// W [N, K]^T (bf16 operands, f32 accumulation), the library's wgmma_gemm
// (src/model/cuda/wgmma_gemm.h: wgmma fed by bulk tensor copies, K slices summed in a cluster)
// against cuBLAS (cublasGemmEx, CUBLAS_GEMM_DEFAULT: the model's path without it) and, at one
// and two tokens, gemv's version 3.
//
// Versions (wgmma_gemm.cu): 1, 128 rows a CTA, a ring of five 16 KiB W stages, two CTAs per SM
// (the model's); 2, ten stages, one CTA per SM; 3, two stages of 32 KiB (128 K elements), two
// CTAs per SM; 4, 256 rows a CTA in two warpgroups (half the x reads), one CTA per SM; 5, 64
// rows a CTA (more row blocks, fewer K slices), a ring of about 200 KiB, one CTA per SM; 6, 64
// rows, about 100 KiB, two CTAs per SM.
//
//   wgmma_gemm_lab               correctness gate, then the sweep
//   wgmma_gemm_lab --sweep-only  the sweep alone
//   wgmma_gemm_lab --tokens 8,32 the sweep at these token counts only
//   wgmma_gemm_lab --shape T:N:K one shape's timing alone (for a profiler)
//
// Gate (product_lab.h): against a double-precision product on the host (every element of small
// shapes, 4096 sampled ones of large shapes), f32 output (poisoned first), accumulation into f32,
// bf16 output; shapes with N not a multiple of 128 and K not a multiple of 64; twice each (the
// same bits).
// Timing: cold L2 (lab_common.h), median of 20, % of the device-to-device copy rate measured in
// the same run for the bytes of W + x + y.
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <random>
#include <string>
#include <vector>

#include "cuda_bandwidth.h"
#include "gemv.h"
#include "lab_common.h"
#include "pagedattn/dtype.h"
#include "product_lab.h"
#include "wgmma_gemm.h"

int main(int argc, char** argv) {
  if (!pagedattn::cuda::wgmma_gemm_available()) {
    std::printf("wgmma_gemm: this device cannot run it (sm_90 only)\n");
    return 0;
  }
  bool sweep_only = false;
  int only_t = 0, only_n = 0, only_k = 0;  // --shape T:N:K: that shape alone (for a profiler)
  std::vector<int> token_list = {1, 2, 4, 8, 16, 32, 64};
  for (int i = 1; i < argc; ++i) {
    const std::string arg = argv[i];
    if (arg == "--sweep-only") sweep_only = true;
    if (arg == "--tokens" && i + 1 < argc) {  // the sweep's token counts, e.g. 8,32,64
      token_list.clear();
      for (const char* p = argv[++i]; *p;) {
        char* end = nullptr;
        const long t = std::strtol(p, &end, 10);
        if (end == p) break;
        if (t >= 1 && t <= 64) token_list.push_back(int(t));
        p = *end == ',' ? end + 1 : end;
      }
    }
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
          const std::string what = "v" + std::to_string(v);
          auto run = [v](const lab::GemvArgs& a) { pagedattn::cuda::wgmma_gemm(a, nullptr, v); };
          if (!lab::gate(T, s[0], s[1], what.c_str(), run)) ++failures;
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
  constexpr int V = pagedattn::cuda::kWgmmaGemmVersions;
  std::printf("%-13s %2s %7s %6s | %7s", "op", "T", "N", "K", "cublas");
  for (int v = 1; v <= V; ++v) std::printf("   v%d us", v);
  std::printf(" %7s | %6s", "gemv", "cublas");
  for (int v = 1; v <= V; ++v) std::printf("     v%d", v);
  std::printf(" %6s (%% of copy) | best\n", "gemv");
  const float one = 1.f, zero = 0.f;
  std::vector<lab::ProductShape> all = lab::decode_products();
  std::vector<int> token_counts = token_list;
  if (only_t > 0) {
    all = {{"shape", only_n, only_k}};
    token_counts = {only_t};
  }
  for (int T : token_counts) {
    for (const lab::ProductShape& op : all) {
      lab::Mats m(T, op.N, op.K, 1);
      const lab::GemvArgs a = m.args(false, false);
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
