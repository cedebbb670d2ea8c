// Host side of the skinny GEMM (skinny_gemm.h): the K split and the launch of a configuration.
#include <algorithm>

#include "pagedattn/error.h"
#include "skinny_gemm.h"
#include "skinny_gemm_kernel.cuh"

namespace pagedattn::cuda {

namespace {

// The kernel configurations: [0] the default (v1's), [v] the lab's version v (skinny_gemm.cu
// has the history).
//   MI: 16-row weight tiles per warp (BN = 128 * MI);  stages: the cp.async ring's depth;
//   slots: CTAs per SM the plan assumes (at the largest token tile, NP = 4).
struct Config {
  int mi, stages, slots;
  bool cluster;  // the K split reduced in a cluster's shared memory, else through global memory
};
constexpr Config kConfigs[] = {{1, 4, 2, false}, {1, 4, 2, false}, {1, 4, 2, true}};
constexpr int kNumVersions = int(sizeof(kConfigs) / sizeof(kConfigs[0]));

const Config& config(int version) {
  PA_CHECK(version >= 0 && version < kNumVersions, "skinny_gemm: no version ", version);
  return kConfigs[version];
}

template <int MI, int NP, int S, bool C>
void launch(const skinny::Params& p, int tiles, bool pdl, cudaStream_t stream) {
  constexpr int smem = skinny::kStageElems<MI, NP> * 2 * S;
  auto* k = skinny::skinny_gemm_kernel<MI, NP, S, C>;
  // NOTE: cudaFuncSetAttribute is cheap after the first call but not free: once per instance.
  static const cudaError_t attr =
      cudaFuncSetAttribute(k, cudaFuncAttributeMaxDynamicSharedMemorySize, smem);
  check_cuda(attr, "skinny_gemm: shared memory limit");
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(tiles), unsigned(p.splits));
  cfg.blockDim = dim3(skinny::kThreads);
  cfg.dynamicSmemBytes = size_t(smem);
  cfg.stream = stream;
  cudaLaunchAttribute attrs[2];
  int n = 0;
  if (C && p.splits > 1) {
    attrs[n].id = cudaLaunchAttributeClusterDimension;
    attrs[n].val.clusterDim.x = 1;
    attrs[n].val.clusterDim.y = unsigned(p.splits);
    attrs[n].val.clusterDim.z = 1;
    ++n;
  }
  if (pdl) {
    attrs[n].id = cudaLaunchAttributeProgrammaticStreamSerialization;
    attrs[n].val.programmaticStreamSerializationAllowed = 1;
    ++n;
  }
  cfg.attrs = attrs;
  cfg.numAttrs = unsigned(n);
  check_cuda(cudaLaunchKernelEx(&cfg, k, p), "skinny_gemm launch");
}

template <int MI, int S, bool C>
void launch_tt(const skinny::Params& p, int tiles, bool pdl, cudaStream_t stream) {
  if (p.T <= 16) return launch<MI, 1, S, C>(p, tiles, pdl, stream);
  if (p.T <= 32) return launch<MI, 2, S, C>(p, tiles, pdl, stream);
  launch<MI, 4, S, C>(p, tiles, pdl, stream);
}

}  // namespace

SkinnyPlan skinny_gemm_plan(int N, int K, int num_sms, int version) {
  const Config& c = config(version);
  SkinnyPlan plan;
  const int bn = 128 * c.mi;
  plan.tiles = (N + bn - 1) / bn;
  plan.global_partials = !c.cluster;
  // Fill one wave of CTA slots with (tile, split) pairs, at least 4 k-blocks per split: fewer
  // CTAs than slots leaves bandwidth unused; a second partial wave doubles the time of its tiles.
  const int nkb = (K + skinny::kBK - 1) / skinny::kBK;
  const int slots = c.slots * std::max(num_sms, 1);
  plan.splits = std::clamp(slots / plan.tiles, 1, std::clamp(nkb / 4, 1, skinny::kMaxSplits));
  return plan;
}

bool skinny_gemm_supports(int T, int K) { return T >= 1 && T <= kSkinnyMaxTokens && K % 8 == 0; }

void skinny_gemm(const SkinnyArgs& a, const SkinnyPlan& plan, cudaStream_t stream, int version) {
  PA_CHECK(skinny_gemm_supports(a.T, a.K), "skinny_gemm: T = ", a.T, ", K = ", a.K,
           " (needs 1 <= T <= ", kSkinnyMaxTokens, " and K a multiple of 8)");
  PA_CHECK(!(a.y_bf16 && a.accumulate), "skinny_gemm: accumulation needs an f32 output");
  PA_CHECK(plan.splits == 1 || !plan.global_partials || (a.partial && a.counters),
           "skinny_gemm: a split plan needs its workspace");
  const Config& c = config(version);
  skinny::Params p{a.x, a.w, a.y,         a.partial, a.counters,  a.T,
                   a.N, a.K, plan.splits, a.y_bf16,  a.accumulate};
  if (c.cluster) return launch_tt<1, 4, true>(p, plan.tiles, a.overlap_previous, stream);
  launch_tt<1, 4, false>(p, plan.tiles, a.overlap_previous, stream);
}

}  // namespace pagedattn::cuda
