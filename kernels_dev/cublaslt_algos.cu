// Kernel lab: how far cuBLAS's default choice for the decode-step projections is from the best
// algorithm cuBLASLt offers for the same product. Y[T, N] (f32) = X[T, K] . W[N, K]^T, bf16
// operands, f32 accumulation (the model's gemm in llama_cuda.cpp), cold L2, median of 20.
//
//   cublaslt_algos_lab                  every shape below
//   cublaslt_algos_lab --shape T:N:K    one shape
//
// For each shape: cublasGemmEx with CUBLAS_GEMM_DEFAULT (what the model runs), then every
// algorithm cuBLASLt's heuristic returns (up to 32, 32 MiB of workspace), each also with split-K
// 2, 4 and 8 where the algorithm takes it; the table gives the default, the best, and the best's
// tile, stages and split. Checked: every result against the default's within 1e-3 relative (the
// split sums in another order).
#include <cublasLt.h>
#include <cublas_v2.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <string>
#include <vector>

#include "cuda_bandwidth.h"
#include "lab_common.h"
#include "pagedattn/dtype.h"

namespace {

void ckb(cublasStatus_t s, const char* what) {
  if (s != CUBLAS_STATUS_SUCCESS) {
    std::fprintf(stderr, "%s: cuBLAS status %d\n", what, int(s));
    std::exit(1);
  }
}

struct Mats {
  int T, N, K;
  uint16_t *dx = nullptr, *dw = nullptr;
  float *dy = nullptr, *dref = nullptr;
  void* ws = nullptr;
  static constexpr size_t kWorkspace = size_t(32) << 20;
  Mats(int t, int n, int k) : T(t), N(n), K(k) {
    std::mt19937_64 rng(uint64_t(t) * 1000003u + uint64_t(n) * 31u + uint64_t(k));
    std::normal_distribution<float> nd(0.f, 1.f);
    std::vector<uint16_t> x(size_t(T) * K), w(size_t(N) * K);
    for (auto& v : x) v = pagedattn::f32_to_bf16(nd(rng));
    const size_t fresh = std::min<size_t>(w.size(), size_t(1) << 20);
    for (size_t i = 0; i < fresh; ++i) w[i] = pagedattn::f32_to_bf16(0.02f * nd(rng));
    for (size_t i = fresh; i < w.size(); ++i) w[i] = w[i % fresh];
    lab::ck(cudaMalloc(&dx, x.size() * 2), "malloc x");
    lab::ck(cudaMalloc(&dw, w.size() * 2), "malloc w");
    lab::ck(cudaMalloc(&dy, size_t(T) * N * 4), "malloc y");
    lab::ck(cudaMalloc(&dref, size_t(T) * N * 4), "malloc ref");
    lab::ck(cudaMalloc(&ws, kWorkspace), "malloc workspace");
    lab::ck(cudaMemcpy(dx, x.data(), x.size() * 2, cudaMemcpyHostToDevice), "copy x");
    lab::ck(cudaMemcpy(dw, w.data(), w.size() * 2, cudaMemcpyHostToDevice), "copy w");
  }
  ~Mats() {
    for (void* p : {static_cast<void*>(dx), static_cast<void*>(dw), static_cast<void*>(dy),
                    static_cast<void*>(dref), ws})
      cudaFree(p);
  }
  double bytes() const { return 2.0 * N * K + 2.0 * T * K + 4.0 * T * N; }
};

int attr(const cublasLtMatmulAlgo_t& a, cublasLtMatmulAlgoConfigAttributes_t which) {
  int v = 0;
  size_t got = 0;
  uint32_t u = 0;
  if (cublasLtMatmulAlgoConfigGetAttribute(&a, which, &u, sizeof(u), &got) ==
      CUBLAS_STATUS_SUCCESS)
    v = int(u);
  return v;
}

struct Result {
  double us = 0;
  std::string what;
};

void run_shape(cublasHandle_t h, cublasLtHandle_t lt, int T, int N, int K, double gbps) {
  Mats m(T, N, K);
  const float one = 1.f, zero = 0.f;
  auto dflt = [&] {
    cublasGemmEx(h, CUBLAS_OP_T, CUBLAS_OP_N, N, T, K, &one, m.dw, CUDA_R_16BF, K, m.dx,
                 CUDA_R_16BF, K, &zero, m.dy, CUDA_R_32F, N, CUBLAS_COMPUTE_32F,
                 CUBLAS_GEMM_DEFAULT);
  };
  dflt();
  lab::ck(cudaMemcpy(m.dref, m.dy, size_t(T) * N * 4, cudaMemcpyDeviceToDevice), "ref");
  std::vector<float> ref(size_t(T) * N), got(size_t(T) * N);
  lab::ck(cudaMemcpy(ref.data(), m.dref, ref.size() * 4, cudaMemcpyDeviceToHost), "ref down");
  const double t_default = lab::time_us(dflt);

  cublasLtMatmulDesc_t op;
  ckb(cublasLtMatmulDescCreate(&op, CUBLAS_COMPUTE_32F, CUDA_R_32F), "desc");
  const cublasOperation_t ta = CUBLAS_OP_T, tb = CUBLAS_OP_N;
  ckb(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSA, &ta, sizeof(ta)), "ta");
  ckb(cublasLtMatmulDescSetAttribute(op, CUBLASLT_MATMUL_DESC_TRANSB, &tb, sizeof(tb)), "tb");
  cublasLtMatrixLayout_t la, lb, lc;
  ckb(cublasLtMatrixLayoutCreate(&la, CUDA_R_16BF, K, N, K), "la");  // W^T viewed col-major
  ckb(cublasLtMatrixLayoutCreate(&lb, CUDA_R_16BF, K, T, K), "lb");
  ckb(cublasLtMatrixLayoutCreate(&lc, CUDA_R_32F, N, T, N), "lc");
  cublasLtMatmulPreference_t pref;
  ckb(cublasLtMatmulPreferenceCreate(&pref), "pref");
  const size_t ws = Mats::kWorkspace;
  ckb(cublasLtMatmulPreferenceSetAttribute(pref, CUBLASLT_MATMUL_PREF_MAX_WORKSPACE_BYTES, &ws,
                                           sizeof(ws)),
      "pref ws");
  cublasLtMatmulHeuristicResult_t heur[32];
  int n = 0;
  ckb(cublasLtMatmulAlgoGetHeuristic(lt, op, la, lb, lc, lc, pref, 32, heur, &n), "heuristic");

  std::vector<cublasLtMatmulAlgo_t> algos;
  for (int i = 0; i < n; ++i) {
    if (heur[i].state != CUBLAS_STATUS_SUCCESS) continue;
    algos.push_back(heur[i].algo);
    int split_ok = 0;
    size_t got_sz = 0;
    cublasLtMatmulAlgoCapGetAttribute(&heur[i].algo, CUBLASLT_ALGO_CAP_SPLITK_SUPPORT, &split_ok,
                                      sizeof(split_ok), &got_sz);
    if (!split_ok) continue;
    for (uint32_t s : {2u, 4u, 8u}) {
      cublasLtMatmulAlgo_t a = heur[i].algo;
      if (cublasLtMatmulAlgoConfigSetAttribute(&a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM, &s,
                                               sizeof(s)) != CUBLAS_STATUS_SUCCESS)
        continue;
      cublasLtMatmulHeuristicResult_t chk;
      if (cublasLtMatmulAlgoCheck(lt, op, la, lb, lc, lc, &a, &chk) != CUBLAS_STATUS_SUCCESS ||
          chk.workspaceSize > ws)
        continue;
      algos.push_back(a);
    }
  }
  Result best{1e30, "-"};
  int tried = 0, wrong = 0;
  for (const cublasLtMatmulAlgo_t& a : algos) {
    auto run = [&] {
      cublasLtMatmul(lt, op, &one, m.dw, la, m.dx, lb, &zero, m.dy, lc, m.dy, lc, &a, m.ws, ws,
                     nullptr);
    };
    lab::ck(cudaMemset(m.dy, 0xff, size_t(T) * N * 4), "poison");
    run();
    if (cudaDeviceSynchronize() != cudaSuccess) {
      (void)cudaGetLastError();
      continue;
    }
    lab::ck(cudaMemcpy(got.data(), m.dy, got.size() * 4, cudaMemcpyDeviceToHost), "down");
    double scale = 1e-30, diff = 0;
    for (size_t i = 0; i < got.size(); ++i) {
      scale = std::max(scale, double(std::abs(ref[i])));
      diff = std::max(diff, std::abs(double(got[i]) - ref[i]));
      if (std::isnan(got[i])) diff = INFINITY;
    }
    ++tried;
    if (!(diff <= 1e-3 * scale)) {
      ++wrong;
      continue;
    }
    const double us = lab::time_us(run);
    if (us < best.us) {
      char buf[96];
      std::snprintf(buf, sizeof(buf), "algo %d tile %d stages %d split %d",
                    attr(a, CUBLASLT_ALGO_CONFIG_ID), attr(a, CUBLASLT_ALGO_CONFIG_TILE_ID),
                    attr(a, CUBLASLT_ALGO_CONFIG_STAGES_ID),
                    std::max(1, attr(a, CUBLASLT_ALGO_CONFIG_SPLITK_NUM)));
      best = {us, buf};
    }
  }
  auto pct = [&](double us) { return 100.0 * m.bytes() / (us * 1e-6) / (gbps * 1e9); };
  std::printf("%3d %7d %6d | %8.1f %6.1f%% | %8.1f %6.1f%% | %5.2fx | %3d tried %2d wrong | %s\n",
              T, N, K, t_default, pct(t_default), best.us, pct(best.us), t_default / best.us,
              tried, wrong, best.what.c_str());
  cublasLtMatmulPreferenceDestroy(pref);
  cublasLtMatrixLayoutDestroy(la);
  cublasLtMatrixLayoutDestroy(lb);
  cublasLtMatrixLayoutDestroy(lc);
  cublasLtMatmulDescDestroy(op);
}

}  // namespace

int main(int argc, char** argv) {
  int only[3] = {0, 0, 0};
  for (int a = 1; a < argc; ++a) {
    if (std::string(argv[a]) == "--shape" && a + 1 < argc &&
        std::sscanf(argv[++a], "%d:%d:%d", &only[0], &only[1], &only[2]) == 3)
      continue;
    std::fprintf(stderr, "usage: cublaslt_algos_lab [--shape T:N:K]\n");
    return 2;
  }
  const pagedattn::bench::CopyBandwidth copy = pagedattn::bench::measure_copy_bandwidth();
  std::printf("== %s, copy %.0f GB/s; cold L2, median of 20; %% of copy for W + X + Y\n",
              copy.device.c_str(), copy.gbps);
  cublasHandle_t h;
  cublasLtHandle_t lt;
  ckb(cublasCreate(&h), "cublasCreate");
  ckb(cublasLtCreate(&lt), "cublasLtCreate");
  // The projections [N, K] of Llama-3-8B (qkv, o, gate/up, down, lm_head), of one rank of its
  // two-way split, and of SmolLM2-135M.
  const int nk[][2] = {{6144, 4096},  {4096, 4096},  {28672, 4096}, {4096, 14336},
                       {128256, 4096}, {3072, 4096}, {4096, 2048},  {14336, 4096},
                       {4096, 7168},  {64128, 4096}, {960, 576},    {576, 576},
                       {3072, 576},   {576, 1536},   {49152, 576}};
  std::printf(
      "  T       N      K | default us  %%copy | best us   %%copy | gain  | algorithms | best\n");
  for (int T : {1, 32, 64}) {
    for (const auto& s : nk) {
      if (only[0] && (T != only[0] || s[0] != only[1] || s[1] != only[2])) continue;
      run_shape(h, lt, T, s[0], s[1], copy.gbps);
    }
  }
  if (only[0] && only[1] && only[2]) {
    bool listed = false;
    for (const auto& s : nk) listed |= s[0] == only[1] && s[1] == only[2];
    if (!listed) run_shape(h, lt, only[0], only[1], only[2], copy.gbps);
  }
  cublasLtDestroy(lt);
  cublasDestroy(h);
  return 0;
}
