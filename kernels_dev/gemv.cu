// Kernel lab: the few-token product of decode steps, y [T, N] = x [T, K] . W [N, K]^T (bf16
// operands, f32 accumulation and output), the library's gemv (src/model/cuda/gemv.h) against
// cuBLAS (cublasGemmEx, CUBLAS_GEMM_DEFAULT: the model's path without it).
//
//   gemv_lab               correctness gate, then the sweep
//   gemv_lab --sweep-only  the sweep alone
//
// Versions (gemv.h): v1, v2 = a warp per 2 or 4 rows of W; v3, v4 = a block per 4 or 8 rows, its
// threads splitting K.
// Gate (product_lab.h): every version against a double-precision product on the host (every
// element of small shapes, 4096 sampled ones of large shapes), f32 output, accumulation into f32,
// bf16 output, the same bits twice.
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
#include "product_lab.h"
#include "pagedattn/dtype.h"

int main(int argc, char** argv) {
  const bool sweep_only = argc > 1 && std::string(argv[1]) == "--sweep-only";
  if (!sweep_only) {
    int failures = 0;
    const int shapes[][2] = {{1, 8}, {5, 24}, {576, 576}, {960, 576}, {1000, 1536}, {4099, 520}};
    for (int v = 1; v <= pagedattn::cuda::kGemvVersions; ++v)
      for (int T = 1; T <= pagedattn::cuda::kGemvMaxTokens; ++T)
        for (const auto& s : shapes) {
          const std::string what = "v" + std::to_string(v);
          auto run = [v](const lab::GemvArgs& a) { pagedattn::cuda::gemv(a, nullptr, v); };
          if (!lab::gate(T, s[0], s[1], what.c_str(), run)) ++failures;
        }
    std::printf("gate: %s (%d failures)\n", failures ? "FAILED" : "ok", failures);
    if (failures) return 1;
  }
  const pagedattn::bench::CopyBandwidth copy = pagedattn::bench::measure_copy_bandwidth();
  std::printf("== timing (%s, copy %.0f GB/s; cold L2, median of 20; %% of copy for W + x + y)\n",
              copy.device.c_str(), copy.gbps);
  cublasHandle_t h;
  if (cublasCreate(&h) != CUBLAS_STATUS_SUCCESS) return 2;
  std::printf("%-13s %2s %7s %6s | %7s %7s %7s %7s %7s | %7s %6s %6s %6s %6s (%% of copy)\n",
              "op", "T", "N", "K", "cublas", "v1 us", "v2 us", "v3 us", "v4 us", "cublas", "v1",
              "v2", "v3", "v4");
  const float one = 1.f, zero = 0.f;
  for (int T : {1, 2, 4, 8}) {
    for (const lab::ProductShape& op : lab::decode_products()) {
      lab::Mats m(T, op.N, op.K, 1);
      const lab::GemvArgs a = m.args(false, false);
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
