// The skinny GEMM of decode steps: Y[T, N] = X[T, K] . W[N, K]^T (+ Y) for a few tokens T and a
// large weight W, which is read once from memory and so sets the time. Built like the tensor-core
// decode kernel: the weight rows are the M side of m16n8k16 mma.sync and the tokens the N side, so
// a batch of 1 to 64 tokens wastes no weight bytes; each CTA streams a [BN, K-range] slab of W
// through a kStages-deep cp.async ring while the tensor cores work on the stage before.
//
//   grid (ceil(N / BN), splits), block kThreads; dynamic smem 2 * kStageElems * kStages bytes.
//   BN = 16 * MI * kWarps weight rows per CTA; TT = 16 * NP tokens (T <= TT, padded with zeros).
//   splits > 1: CTA (tile, s) owns k-blocks [s * nkb / splits, (s + 1) * nkb / splits); it stores
//   its f32 partial [T, BN] in `partial`, and the last CTA of the tile to finish (a counter per
//   tile) adds the partials in split order, so the sum is the same whichever CTA finishes last.
#pragma once

#include <cooperative_groups.h>

#include "mma.cuh"

namespace pagedattn::cuda::skinny {

namespace cg = cooperative_groups;

constexpr int kWarps = 8, kThreads = 32 * kWarps;
constexpr int kBK = 64;        // k per stage: one 128-byte row segment of W per weight row
constexpr int kMaxSplits = 8;  // the portable cluster size

struct Params {
  const uint16_t* x;   // [T, K] bf16
  const uint16_t* w;   // [N, K] bf16
  void* y;             // [T, N] f32 or bf16
  float* partial;      // [splits, T, N] f32 (splits > 1)
  unsigned* counters;  // [tiles], zero between launches (the last CTA of a tile resets its own)
  int T, N, K;
  int splits;
  bool y_bf16;      // else f32
  bool accumulate;  // y += X . W^T (f32 y only)
};

template <int MI, int NP>
constexpr int kBN = 16 * MI* kWarps;
template <int MI, int NP>
constexpr int kTT = 16 * NP;
template <int MI, int NP>
constexpr int kStageElems = (kBN<MI, NP> + kTT<MI, NP>)*kBK;

// The copies of one stage of k-block kb: W rows [n0, n0 + BN) and X rows [0, TT), 16-byte chunks
// swizzled (swz<kBK>) so that each ldmatrix's 8 rows fall in 8 bank groups. Chunks outside N, T or
// K are zero-filled (nothing is read for them). Each thread's chunks are the same in every stage
// (row c / 8, chunk c % 8 of c = thread + j * kThreads): their source pointers, validity and
// shared-memory offsets are computed once, so a stage costs each thread an add and a cp.async per
// chunk (address arithmetic per chunk and stage kept the SM's ALUs a third busy).
template <int MI, int NP>
struct StageCopier {
  static constexpr int BN = kBN<MI, NP>, TT = kTT<MI, NP>;
  static constexpr int kW = BN * 8 / kThreads;                   // W chunks per thread
  static constexpr int kX = (TT * 8 + kThreads - 1) / kThreads;  // X chunks per thread (or 0-1)
  const uint16_t* w_src[kW];
  const uint16_t* x_src[kX];
  uint32_t w_dst[kW], x_dst[kX];  // byte offsets in a stage
  bool x_in[kX];                  // a chunk of the X tile (else this thread has none)
  // A chunk is copied while k0 < lim (K minus its k within the block; 0 for rows past N or T).
  int w_lim[kW], x_lim[kX];

  __device__ __forceinline__ StageCopier(const Params& p, int n0) {
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      const int c = threadIdx.x + j * kThreads, r = c >> 3, ch = c & 7, n = n0 + r;
      w_src[j] = n < p.N ? p.w + int64_t(n) * p.K + ch * 8 : p.w;  // p.w: never read (size 0)
      w_dst[j] = uint32_t(swz<kBK>(r, ch)) * 2;
      w_lim[j] = n < p.N ? p.K - ch * 8 : 0;
    }
#pragma unroll
    for (int j = 0; j < kX; ++j) {
      const int c = threadIdx.x + j * kThreads, r = c >> 3, ch = c & 7;
      x_src[j] = r < p.T ? p.x + int64_t(r) * p.K + ch * 8 : p.x;
      x_dst[j] = uint32_t(BN * kBK + swz<kBK>(r, ch)) * 2;
      x_lim[j] = r < p.T ? p.K - ch * 8 : 0;
      x_in[j] = c < TT * 8;
    }
  }
  // 16 bytes from src, or (ok false) 16 zeros with nothing read.
  __device__ __forceinline__ static void copy(uint32_t dst, const uint16_t* src, bool ok) {
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(dst), "l"(src),
                 "r"(ok ? 16 : 0));
  }
  // stage: the stage's shared-memory address (cvta'd).
  __device__ __forceinline__ void load_w(uint32_t stage, int kb) const {
    const int k0 = kb * kBK;
#pragma unroll
    for (int j = 0; j < kW; ++j) {
      const bool ok = k0 < w_lim[j];
      copy(stage + w_dst[j], ok ? w_src[j] + k0 : w_src[j], ok);
    }
  }
  __device__ __forceinline__ void load_x(uint32_t stage, int kb) const {
    const int k0 = kb * kBK;
#pragma unroll
    for (int j = 0; j < kX; ++j) {
      if (!x_in[j]) continue;
      const bool ok = k0 < x_lim[j];
      copy(stage + x_dst[j], ok ? x_src[j] + k0 : x_src[j], ok);
    }
  }
};

// acc[m][j]: weight rows m * 16 + [0, 16) of this warp, tokens j * 8 + [0, 8), in the mma's
// accumulator layout (c0, c1: row lane / 4, tokens 2 (lane % 4) + {0, 1}; c2, c3: row + 8).
template <int MI, int NP>
__device__ __forceinline__ void compute_stage(const uint16_t* ws, int warp, int lane,
                                              float (&acc)[MI][2 * NP][4]) {
  constexpr int BN = kBN<MI, NP>;
  const uint16_t* xs = ws + BN * kBK;
#pragma unroll
  for (int kk = 0; kk < kBK / 16; ++kk) {
    uint32_t b[NP][4];
#pragma unroll
    for (int q = 0; q < NP; ++q) {
      // x4: tokens q*16 + [0, 8) at k [0, 8) and [8, 16), then tokens + 8: b0/b1 of two n8 tiles.
      const int row = q * 16 + (lane & 7) + ((lane >> 4) << 3);
      ldmatrix_x4(b[q], xs + swz<kBK>(row, 2 * kk + ((lane >> 3) & 1)));
    }
#pragma unroll
    for (int m = 0; m < MI; ++m) {
      uint32_t a[4];
      const int row = (warp * MI + m) * 16 + (lane & 15);
      ldmatrix_x4(a, ws + swz<kBK>(row, 2 * kk + (lane >> 4)));
#pragma unroll
      for (int q = 0; q < NP; ++q) {
        mma16816<Bf16>(acc[m][2 * q], a, b[q][0], b[q][1]);
        mma16816<Bf16>(acc[m][2 * q + 1], a, b[q][2], b[q][3]);
      }
    }
  }
}

// Calls f(r, t, v) for each of this thread's accumulators: weight row r of the tile, token t.
template <int MI, int NP, class F>
__device__ __forceinline__ void for_each_acc(const float (&acc)[MI][2 * NP][4], int warp, int lane,
                                             F&& f) {
#pragma unroll
  for (int m = 0; m < MI; ++m)
#pragma unroll
    for (int j = 0; j < 2 * NP; ++j)
#pragma unroll
      for (int i = 0; i < 4; ++i)
        f((warp * MI + m) * 16 + lane / 4 + (i >= 2 ? 8 : 0), j * 8 + (lane % 4) * 2 + (i & 1),
          acc[m][j][i]);
}

__device__ __forceinline__ void store_out(const Params& p, int t, int n, float v) {
  const int64_t i = int64_t(t) * p.N + n;
  if (p.y_bf16) {
    static_cast<uint16_t*>(p.y)[i] = f32_to_bf16(v);
  } else {
    float* y = static_cast<float*>(p.y);
    y[i] = p.accumulate ? y[i] + v : v;
  }
}

template <int MI, int NP, int kStages, bool kCluster>
__global__ void __launch_bounds__(kThreads) skinny_gemm_kernel(const Params p) {
  constexpr int BN = kBN<MI, NP>, SE = kStageElems<MI, NP>;
  extern __shared__ __align__(128) uint16_t smem[];
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int n0 = blockIdx.x * BN, split = blockIdx.y;
  const int nkb = (p.K + kBK - 1) / kBK;
  const int kb0 = int(int64_t(split) * nkb / p.splits);
  const int kb1 = int(int64_t(split + 1) * nkb / p.splits);

  // Programmatic dependent launch: the kernel before this one (which writes X) may still be
  // running. The weights do not depend on it, so the first stages' W copies start now; X is read
  // only after griddepcontrol.wait (a no-op when launched without the attribute). The W copies
  // join the first commit group, which the first iteration waits for anyway.
  allow_dependent_launch();
  const int n_kb = kb1 - kb0;
  const StageCopier<MI, NP> cp(p, n0);
  const uint32_t smem_base = uint32_t(__cvta_generic_to_shared(smem));
  auto stage_addr = [&](int i) { return smem_base + uint32_t((i % kStages) * SE * 2); };
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_kb) cp.load_w(stage_addr(s), kb0 + s);
  }
  asm volatile("griddepcontrol.wait;\n" ::: "memory");
#pragma unroll
  for (int s = 0; s < kStages - 1; ++s) {
    if (s < n_kb) cp.load_x(stage_addr(s), kb0 + s);
    cp_async_commit();
  }
  float acc[MI][2 * NP][4] = {};
  for (int i = 0; i < n_kb; ++i) {
    cp_async_wait<kStages - 2>();
    __syncthreads();  // stage i landed for every thread; stage i - 1 is free for everyone
    const int next = i + kStages - 1;
    if (next < n_kb) {
      cp.load_w(stage_addr(next), kb0 + next);
      cp.load_x(stage_addr(next), kb0 + next);
    }
    cp_async_commit();
    compute_stage<MI, NP>(smem + (i % kStages) * SE, warp, lane, acc);
  }
  cp_async_wait<0>();

  if (p.splits == 1) {
    for_each_acc<MI, NP>(acc, warp, lane, [&](int r, int t, float v) {
      if (n0 + r < p.N && t < p.T) store_out(p, t, n0 + r, v);
    });
    return;
  }

  if constexpr (kCluster) {
    // The splits of a tile form one thread-block cluster (dims (1, splits)): each CTA leaves its
    // partial [TT][BN] in its own shared memory (the drained pipeline ring), and CTA r adds up
    // elements [r, r + splits, ...) of the tile from every CTA's copy through distributed shared
    // memory, in split order: no global round trip, no counter, the same sum whoever runs first.
    cg::cluster_group cluster = cg::this_cluster();
    float* red = reinterpret_cast<float*>(smem);  // [TT][BN]
    __syncthreads();                              // every warp is done with the ring
    for_each_acc<MI, NP>(acc, warp, lane, [&](int r, int t, float v) { red[t * BN + r] = v; });
    cluster.sync();
    const int rank = int(cluster.block_rank());
    for (int e = rank * kThreads + threadIdx.x; e < p.T * BN; e += p.splits * kThreads) {
      const int t = e / BN, n = n0 + e % BN;
      float v[kMaxSplits];
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q)
        v[q] = q < p.splits ? cluster.map_shared_rank(red, q)[e] : 0.f;
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q)
        if (q < p.splits) sum += v[q];
      if (n < p.N) store_out(p, t, n, sum);
    }
    cluster.sync();  // no CTA leaves while another still reads its shared memory
    return;
  }

  float* part = p.partial + int64_t(split) * p.T * p.N;
  for_each_acc<MI, NP>(acc, warp, lane, [&](int r, int t, float v) {
    if (n0 + r < p.N && t < p.T) part[int64_t(t) * p.N + n0 + r] = v;
  });
  __threadfence();  // the partial is visible device-wide before the counter says so
  __syncthreads();
  __shared__ bool last;
  if (threadIdx.x == 0) last = atomicAdd(&p.counters[blockIdx.x], 1u) == unsigned(p.splits - 1);
  __syncthreads();
  if (!last) return;
  __threadfence();
  // NOTE: every partial of an element is loaded before any is added (kMaxSplits registers), and
  // two elements per thread at a time: one L2 round trip per pair instead of one per partial.
  for (int e0 = threadIdx.x; e0 < p.T * BN; e0 += 2 * kThreads) {
    float v[2][kMaxSplits];
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = e0 + u * kThreads, t = e / BN, n = n0 + e % BN;
      const bool ok = e < p.T * BN && n < p.N;
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q)
        v[u][q] = ok && q < p.splits ? __ldcg(p.partial + (int64_t(q) * p.T + t) * p.N + n) : 0.f;
    }
#pragma unroll
    for (int u = 0; u < 2; ++u) {
      const int e = e0 + u * kThreads, t = e / BN, n = n0 + e % BN;
      if (e >= p.T * BN || n >= p.N) continue;
      float sum = 0.f;
#pragma unroll
      for (int q = 0; q < kMaxSplits; ++q)
        if (q < p.splits) sum += v[u][q];
      store_out(p, t, n, sum);
    }
  }
  if (threadIdx.x == 0) p.counters[blockIdx.x] = 0;  // ready for the next launch
}

}  // namespace pagedattn::cuda::skinny
