// The decode steps' products on Hopper's tensor cores, fed by bulk tensor copies (wgmma_gemm.h).
//
// grid (splits, blocks), cluster (splits, 1, 1), block 128 WG + 32 (+ 32: a folded norm's
// consumer): warps 0 .. 4 WG - 1 are WG consumer warpgroups, warp 4 WG the producer (warp
// 4 WG + 1 computes a folded norm's r). CTA (s, b) owns rows [BM b, BM b + BM) of W
// (BM = 64 AC WG; each warpgroup 64 AC of them) and the K blocks [s * KB / splits,
// (s + 1) * KB / splits) of 64 BOXES elements (KB = ceil(K / (64 BOXES))).
//   stage i: W [BM][64] per copy (each warpgroup's AC 64-row parts are A operands of
//            m64nNTk16) and x [NT][64] (the B operand; token rows past T are zeros, filled by the
//            copy), 128-byte swizzled.
//   result:  the accumulators -> shared [NT][BM + 4] f32 of each CTA; CTA s of the cluster sums
//            every CTA's shared copy, in split order, for its share of the tokens (16 bytes a
//            read), and writes y (+ y when accumulating; bf16 or f32; GLU: the gate half and the
//            up half of the rows -> silu(gate) * up). A folded norm (NormFold): the consumer
//            scales its tokens' outputs by r, which a warp of its own computes while the products
//            run (r [NT] after the barriers, a barrier of its own); the producer
//            sums the squares of its new y per 64 rows, first per group of 4, then in order (in
//            shared memory after the reduction buffer).
// The splits are chosen so that every cluster fits the GPU at once (splits_for).
#include <cooperative_groups.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstdlib>
#include <mutex>
#include <string>
#include <unordered_map>

#include "block_math.cuh"  // argmax_take
#include "hopper.cuh"
#include "llama_kernels.h"  // ArgmaxPair, argmax_combine
#include "pagedattn/attention_cuda.h"  // cuda_sm_count
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#include "pdl.h"
#include "qkv_rows.cuh"  // qkv_destination, add_bias, rope_rotate, store_pairs
#include "tensor_map.h"
#include "wgmma_gemm.h"
#include "wgmma_ops.cuh"

namespace pagedattn::cuda {

namespace {

namespace cg = cooperative_groups;

constexpr int kBox = 64;       // K per copy: one 128-byte row of the swizzle pattern
constexpr int kMaxSplits = 8;  // the largest portable cluster
// The kernel's FOLD argument for the greedy argmax epilogue (wgmma_gemm_argmax): no NormFold, and
// per token the largest output of the CTA's rows and its lowest index instead of y. Its nf.sq_ld
// carries the first id of a vocabulary slice (wgmma_gemm_argmax_slice; 0: the whole vocabulary),
// which decides whether a NaN output 0 takes the row (only at id 0).
constexpr int kArgmaxEpilogue = NormFold::kConsume + 1;
// The kernel's FOLD argument for the qkv epilogue (wgmma_gemm_qkv): without a norm, and after a
// folded norm (NormFold::kConsume's r first).
constexpr int kQkvEpilogue = kArgmaxEpilogue + 1, kQkvConsumeEpilogue = kArgmaxEpilogue + 2;
__host__ __device__ constexpr bool consumes_norm(int fold) {
  return fold == NormFold::kConsume || fold == kQkvConsumeEpilogue;
}
__host__ __device__ constexpr bool qkv_epilogue(int fold) {
  return fold == kQkvEpilogue || fold == kQkvConsumeEpilogue;
}

// NT tokens (a multiple of 8), ST stages of BOXES copies of 64 K elements, WG consumer warpgroups
// of 64 AC rows of W each (AC m64 accumulators, 1 or 2).
template <int NT, int ST, int BOXES, int WG, int AC>
struct Cfg {
  static_assert(AC == 1 || AC == 2, "one or two m64 accumulators a warpgroup");
  static constexpr int kBM = 64 * AC * WG;        // rows of W per CTA
  static constexpr int kWgRows = 64 * AC;         // rows of W per warpgroup
  static constexpr int kRedStride = kBM + 4;      // floats between the reduction's token rows
  static constexpr int kStages = ST;
  static constexpr int kBK = BOXES * kBox;
  static constexpr int kWBox = kBM * kBox * 2;  // 8, 16 or 32 KiB
  static constexpr int kXBox = NT * kBox * 2;   // a multiple of 1024 (NT % 8 == 0)
  static constexpr int kWBytes = BOXES * kWBox;
  static constexpr int kStageBytes = kWBytes + BOXES * kXBox;
  // The stages, their full and empty barriers, a folded norm's r barrier and r [NT].
  static constexpr int kSmem = 1024 + kStages * kStageBytes + 2 * kStages * 8 + 8 + NT * 4;
  // The reduction buffer and a folded norm's sums of squares (a float per group of 4 outputs).
  static_assert(NT * kRedStride * 4 + NT * (kBM / 4) * 4 <= kStages * kStageBytes,
                "reduction buffers fit the stages");
};

// A launch's threads: the consumer warpgroups, the producer warp and, for a folded norm's
// consumer (FOLD kConsume), the warp that computes its r.
template <int WG, int FOLD>
__host__ __device__ constexpr int threads_of() {
  return 128 * WG + 32 + (consumes_norm(FOLD) ? 32 : 0);
}

// The sum over the cluster's CTAs, in rank order, of the 4 floats at `mine` in each one's shared
// memory (all reads issued before the first add).
__device__ __forceinline__ float4 cluster_sum(cg::cluster_group& cluster, const float* mine,
                                              int splits) {
  float4 part[kMaxSplits];
#pragma unroll
  for (int q = 0; q < kMaxSplits; ++q)
    if (q < splits) part[q] = *reinterpret_cast<const float4*>(cluster.map_shared_rank(mine, q));
  float4 sum = part[0];
#pragma unroll
  for (int q = 1; q < kMaxSplits; ++q) {
    if (q < splits) {
      sum.x += part[q].x;
      sum.y += part[q].y;
      sum.z += part[q].z;
      sum.w += part[q].w;
    }
  }
  return sum;
}

// The qkv epilogue's group of 4 sums of token t from row row0 on (interleave_rope_rows' order):
// x[j], x[j + D/2], x[j + 1], x[j + 1 + D/2] of head row0 / D, j = (row0 % D) / 2 (even). Its
// other inputs are read (qkv_group_inputs) before the sums are gathered from the cluster, so that
// their loads and the remote reads are in flight together; then bias, rotation and the store as
// qkv_post does them (store_qkv_group).
struct QkvGroup {
  bool store = false;  // a row of the product and a slot inside the pools (or a q head)
  bool rotate = false;  // q or k
  int j = 0, half = 0;
  uint16_t* dst = nullptr;
  uint8_t* dst8 = nullptr;
  float inv_scale = 1.f;
  float2 c{}, s{};
  float bias[4] = {0.f, 0.f, 0.f, 0.f};  // in the sums' order
};
__device__ __forceinline__ QkvGroup qkv_group_inputs(const QkvEpilogue& e, int t, int row0,
                                                     bool in_product) {
  const QkvParams& p = e.p;
  QkvGroup q;
  const int D = p.head_dim, head = row0 / D;
  q.half = D / 2;
  q.j = (row0 % D) / 2;
  q.store = in_product && qkv_destination(p, e.q, nullptr, nullptr, t, head, q.dst, q.dst8,
                                          q.inv_scale);
  if (!q.store) return q;
  if (e.bias) {
    const float* b = e.bias + int64_t(head) * D + q.j;
    q.bias[0] = __ldg(b);
    q.bias[1] = __ldg(b + q.half);
    q.bias[2] = __ldg(b + 1);
    q.bias[3] = __ldg(b + q.half + 1);
  }
  q.rotate = head < p.num_q_heads + p.num_kv_heads;
  if (q.rotate) {
    q.c = *reinterpret_cast<const float2*>(e.cos + int64_t(t) * q.half + q.j);
    q.s = *reinterpret_cast<const float2*>(e.sin + int64_t(t) * q.half + q.j);
  }
  return q;
}
__device__ __forceinline__ void store_qkv_group(const QkvEpilogue& e, const QkvGroup& q,
                                                const float (&v)[4]) {
  float lo[2] = {v[0], v[2]}, hi[2] = {v[1], v[3]};  // x[j], x[j + 1]; x[j + D/2], x[j + 1 + D/2]
  if (e.bias) {
    lo[0] = add_bias(lo[0], q.bias[0]);
    hi[0] = add_bias(hi[0], q.bias[1]);
    lo[1] = add_bias(lo[1], q.bias[2]);
    hi[1] = add_bias(hi[1], q.bias[3]);
  }
  if (q.rotate) {
    rope_rotate(lo[0], hi[0], q.c.x, q.s.x);
    rope_rotate(lo[1], hi[1], q.c.y, q.s.y);
  }
  store_pairs<2>(q.dst, q.dst8, q.inv_scale, q.j, q.half, lo, hi);
}

// GLU: the gate/up product with SwiGLU (W [2 N, K]: a CTA's first half of rows are gate rows
// [H b, H b + H), H = half its rows, its second half the matching up rows N + H b ...; y [T, N]
// bf16).
// FOLD: a NormFold::Mode, the norm's part in this launch (a template argument, so that a product
// without one compiles to the same code and registers as before), or kArgmaxEpilogue: a.y is
// ArgmaxPair [T][row blocks], each row block's (largest value, lowest index) of every token, with
// argmax_rows's rules (NaNs never win; a NaN at output 0 gives (NaN, 0) in block 0; a block of
// NaNs only gives (-inf, INT32_MAX)); or kQkvEpilogue / kQkvConsumeEpilogue: qe's stores
// (store_qkv_group) instead of y, after the norm's r for the latter.
template <int NT, int ST, int BOXES, int WG, int AC, bool GLU, int FOLD>
__global__ void __launch_bounds__(threads_of<WG, FOLD>(), 1)
    wgmma_gemm_kernel(const __grid_constant__ CUtensorMap tw,
                      const __grid_constant__ CUtensorMap tx, const GemvArgs a,
                      const NormFold nf, const QkvEpilogue qe) {
  using C = Cfg<NT, ST, BOXES, WG, AC>;
  constexpr int kBK = C::kBK, kBM = C::kBM, kHalf = C::kBM / 2, kRedStride = C::kRedStride;
  constexpr int kThreads = threads_of<WG, FOLD>();
  extern __shared__ uint8_t smem_raw[];
  uint8_t* base =
      reinterpret_cast<uint8_t*>((reinterpret_cast<uintptr_t>(smem_raw) + 1023) & ~uintptr_t(1023));
  uint64_t* full = reinterpret_cast<uint64_t*>(base + ST * C::kStageBytes);
  uint64_t* empty = full + ST;
  uint64_t* r_ready = empty + ST;                      // a folded norm's consumer: r is written
  float* r_tok = reinterpret_cast<float*>(r_ready + 1);  // [NT] its r per token
  auto w_tile = [&](int s) { return base + s * C::kStageBytes; };
  auto x_tile = [&](int s) { return base + s * C::kStageBytes + C::kWBytes; };

  const int splits = int(gridDim.x), split = int(blockIdx.x), row_block = int(blockIdx.y);
  const int kblocks = (a.K + kBK - 1) / kBK;
  const int kb0 = split * kblocks / splits, n = (split + 1) * kblocks / splits - kb0;
  // Stage s holding K block i: copy b of W and of x at K element (kb0 + i) * kBK + 64 b.
  auto load_w = [&](int s, int i) {
    for (int b = 0; b < BOXES; ++b) {
      const int k = (kb0 + i) * kBK + b * kBox;
      if constexpr (GLU) {
        tma_load_2d(w_tile(s) + b * C::kWBox, &tw, &full[s], k, row_block * kHalf);
        tma_load_2d(w_tile(s) + b * C::kWBox + kHalf * 128, &tw, &full[s], k,
                    a.N + row_block * kHalf);
      } else {
        tma_load_2d(w_tile(s) + b * C::kWBox, &tw, &full[s], k, row_block * kBM);
      }
    }
  };
  auto load_x = [&](int s, int i) {
    for (int b = 0; b < BOXES; ++b)
      tma_load_2d(x_tile(s) + b * C::kXBox, &tx, &full[s], (kb0 + i) * kBK + b * kBox, 0);
  };
  const int warp = int(threadIdx.x) / 32, lane = int(threadIdx.x) % 32;
  if (threadIdx.x == 0) {
    for (int s = 0; s < ST; ++s) {
      mbar_init(&full[s], 1);
      mbar_init(&empty[s], 4 * WG);  // one arrival per consumer warp
    }
    mbar_init(r_ready, 32);  // the r warp's lanes
    mbar_fence_init();
  }
  __syncthreads();
  allow_dependent_launch();

  // A consumer warpgroup owns rows [kWgRows wg, kWgRows (wg + 1)) of the block; acc[a] its rows
  // 64 a .. 64 a + 63.
  constexpr int kWgRows = C::kWgRows;
  const int wg = warp / 4;
  float acc[AC][NT / 2];
#pragma unroll
  for (int c = 0; c < AC; ++c)
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) acc[c][j] = 0.f;

  if (warp == 4 * WG) {
    if (lane == 0) {
      prefetch_tensor_map(&tw);
      prefetch_tensor_map(&tx);
      // W does not depend on the kernels before this one: its first stages are requested before
      // they finish; x (their output) after.
      const int first = n < ST ? n : ST;
      for (int i = 0; i < first; ++i) {
        mbar_arrive_expect_tx(&full[i], C::kStageBytes);
        load_w(i, i);
      }
      wait_for_dependency();
      for (int i = 0; i < first; ++i) load_x(i, i);
      for (int i = first; i < n; ++i) {
        const int s = i % ST;
        mbar_wait(&empty[s], ((i / ST) - 1) & 1);
        mbar_arrive_expect_tx(&full[s], C::kStageBytes);
        load_w(s, i);
        load_x(s, i);
      }
    }
  } else if (warp == 4 * WG + 1) {
    if constexpr (consumes_norm(FOLD)) {
      // The r warp: r per token from the producer's sums of squares (in order) while the
      // products run; the consumers take it in their epilogue.
      // NOTE: measured on an H100 (Llama-3-8B, 8-64 sequences): computed by the consumers before
      // their first product it held them back, the ring having filled during the kernel ahead;
      // by the producer warp's idle lanes, diverged from the lane that issues the copies, the
      // step was 1.3-2.9% longer still.
      wait_for_dependency();
      // Each token's parts summed as two halves (every other group of 4 vectors, 4 vectors in
      // flight), then added in order. The last vector's values past the parts are not the
      // producer's (zeros in their place add nothing).
      const int parts = (a.K + 63) / 64, vecs = (parts + 3) / 4;
      for (int t = lane; t < a.T; t += 32) {
        const float4* p = reinterpret_cast<const float4*>(nf.sq + int64_t(t) * nf.sq_ld);
        float halves[2];
        for (int half = 0; half < 2; ++half) {
          float sum = 0.f;
          for (int q0 = 4 * half; q0 < vecs; q0 += 8) {
            float4 v[4];
#pragma unroll
            for (int j = 0; j < 4; ++j)
              v[j] = q0 + j < vecs ? p[q0 + j] : make_float4(0.f, 0.f, 0.f, 0.f);
#pragma unroll
            for (int j = 0; j < 4; ++j) {
              const int q = 4 * (q0 + j);
              sum += (q < parts ? v[j].x : 0.f) + (q + 1 < parts ? v[j].y : 0.f) +
                     (q + 2 < parts ? v[j].z : 0.f) + (q + 3 < parts ? v[j].w : 0.f);
            }
          }
          halves[half] = sum;
        }
        r_tok[t] = rsqrtf((halves[0] + halves[1]) / float(a.K) + nf.eps);
      }
      mbar_arrive(r_ready);
    }
  } else {
    // The warpgroup through a shuffle from lane 0: ptxas then knows it warp-uniform and builds
    // the descriptors in uniform registers (else an R2UR pair waits before every wgmma).
    const int wgu = __shfl_sync(0xffffffffu, wg, 0);
    for (int i = 0; i < n; ++i) {
      const int s = i % ST;
      mbar_wait(&full[s], (i / ST) & 1);
      const uint32_t wa = smem_u32(w_tile(s)) + wgu * kWgRows * 128, xa = smem_u32(x_tile(s));
#pragma unroll
      for (int c = 0; c < AC; ++c) fence_regs(acc[c]);
      wgmma_fence();
#pragma unroll
      for (int kk = 0; kk < kBK / 16; ++kk) {
        // Copy kk / 4; 16 elements along K inside its 128-byte rows.
        const uint32_t wb = wa + (kk / 4) * C::kWBox + (kk % 4) * 32;
        const uint64_t db = wgmma_desc(xa + (kk / 4) * C::kXBox + (kk % 4) * 32, 16, 1024);
#pragma unroll
        for (int c = 0; c < AC; ++c)
          wgmma_ss<Bf16, NT>(acc[c], wgmma_desc(wb + c * 64 * 128, 16, 1024), db, 1);
      }
      wgmma_commit();
      wgmma_wait<1>();  // stage i - 1's products are done: its buffers go back to the producer
#pragma unroll
      for (int c = 0; c < AC; ++c) fence_regs(acc[c]);
      if (i > 0 && lane == 0) mbar_arrive(&empty[(i - 1) % ST]);
    }
    wgmma_wait<0>();
#pragma unroll
    for (int c = 0; c < AC; ++c) fence_regs(acc[c]);
  }
  // Every stage has landed and been read: the stage memory becomes the reduction buffer.
  __syncthreads();
  float* red = reinterpret_cast<float*>(base);  // [NT][kRedStride]
  if (warp < 4 * WG) {
    // m64nNT accumulator layout: d[4 g + e] is row 16 (warp % 4) + lane / 4 (+ 8 for e >= 2) of
    // the warpgroup's 64, column (token) 8 g + 2 (lane % 4) + (e & 1).
#pragma unroll
    for (int j = 0; j < NT / 2; ++j) {
      const int g = j / 4, e = j % 4;
      const int row = kWgRows * wg + 16 * (warp % 4) + lane / 4 + (e >= 2 ? 8 : 0);
      const int t = 8 * g + 2 * (lane % 4) + (e & 1);
#pragma unroll
      for (int c = 0; c < AC; ++c) red[t * kRedStride + 64 * c + row] = acc[c][j];
    }
  }
  constexpr int kOutRows = GLU ? kHalf : kBM;
  constexpr int kGroupsPerToken = kOutRows / 4;
  float* sq4 = red + NT * kRedStride;  // [t - t0][group]: a folded norm's squares of 4 outputs
  if constexpr (consumes_norm(FOLD)) mbar_wait(r_ready, 0);  // r_tok is written
  cg::cluster_group cluster = cg::this_cluster();
  cluster.sync();
  wait_for_dependency();  // y may be the output of the kernels before this one
  // Groups of 4 outputs (token t, rows r .. r + 3), the tokens split evenly over the cluster's
  // CTAs; every CTA's 16-byte copy of a group is requested before any is added (remote reads take
  // hundreds of cycles), then they are added in split order. GLU: a group is 4 gate sums and
  // their 4 up sums (kHalf rows on).
  // (A producer of a folded norm splits whole tokens, whose squares it then sums.)
  constexpr bool produce = !GLU && FOLD == NormFold::kProduce;
  constexpr bool argmax = !GLU && FOLD == kArgmaxEpilogue;
  const int t0 = split * a.T / splits, t1 = (split + 1) * a.T / splits;
  const int groups = a.T * kGroupsPerToken;
  const int g0 = produce ? t0 * kGroupsPerToken : split * groups / splits;
  const int g1 = produce ? t1 * kGroupsPerToken : (split + 1) * groups / splits;
  if constexpr (argmax) {
    // Whole tokens per CTA (t0 .. t1); each half-warp takes a token, its lanes a group of 4
    // outputs at a time, then folds the lanes' results.
    ArgmaxPair* pairs = static_cast<ArgmaxPair*>(a.y) + row_block;  // [T][gridDim.y]
    const int half = lane / 16, q0 = lane % 16;
    constexpr int kWarpsAll = kThreads / 32;
    for (int tp = t0 + 2 * warp; tp < t1; tp += 2 * kWarpsAll) {  // the same count in a warp
      const int t = tp + half;
      float best = -INFINITY;
      int32_t idx = INT32_MAX;
      bool nan0 = false;  // output 0 of token t is a NaN
      for (int q = q0; t < t1 && q < kGroupsPerToken; q += 16) {
        const float4 sum = cluster_sum(cluster, red + t * kRedStride + 4 * q, splits);
        const float v[4] = {sum.x, sum.y, sum.z, sum.w};
        const int row0 = row_block * kOutRows + 4 * q;
        nan0 = nan0 || (row0 == 0 && nf.sq_ld == 0 && isnan(v[0]));
#pragma unroll
        for (int j = 0; j < 4; ++j)
          if (row0 + j < a.N) argmax_take(v[j], row0 + j, best, idx);
      }
      for (int o = 8; o > 0; o >>= 1) {  // within the half-warp
        const float ob = __shfl_xor_sync(0xffffffffu, best, o);
        const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
        argmax_take(ob, oi, best, idx);
      }
      const unsigned nans = __ballot_sync(0xffffffffu, nan0) >> (16 * half);
      if (q0 == 0 && t < t1) {
        pairs[int64_t(t) * gridDim.y] = (nans & 0xffffu) ? ArgmaxPair{NAN, 0}
                   : idx == INT32_MAX ? ArgmaxPair{-INFINITY, INT32_MAX}
                                      : ArgmaxPair{best, idx};
      }
    }
  }
  for (int g = g0 + int(threadIdx.x); !argmax && g < g1; g += kThreads) {
    const int t = g / kGroupsPerToken, r = (g % kGroupsPerToken) * 4;
    const int row0 = row_block * kOutRows + r, rows = min(4, a.N - row0);
    QkvGroup qg;
    if constexpr (qkv_epilogue(FOLD)) qg = qkv_group_inputs(qe, t, row0, row0 < a.N);
    const float* mine = red + t * kRedStride + r;
    const float4 sum = cluster_sum(cluster, mine, splits);
    float v[4] = {sum.x, sum.y, sum.z, sum.w};
    const float scale = consumes_norm(FOLD) ? r_tok[t] : 1.f;
    if constexpr (consumes_norm(FOLD)) {
#pragma unroll
      for (int j = 0; j < 4; ++j) v[j] *= scale;
    }
    if constexpr (GLU) {
      // As the unfused path computes it: gate and up rounded to bf16 (the product's output),
      // then silu(g) * u in f32 (llama_kernels.cu's swiglu).
      const float4 up = cluster_sum(cluster, mine + kHalf, splits);
      const float u[4] = {up.x * scale, up.y * scale, up.z * scale, up.w * scale};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        const float gb = bf16_to_f32(f32_to_bf16(v[j])), ub = bf16_to_f32(f32_to_bf16(u[j]));
        v[j] = gb / (1.f + __expf(-gb)) * ub;
      }
    }
    if constexpr (qkv_epilogue(FOLD)) {
      if (qg.store) store_qkv_group(qe, qg, v);  // (a.N: whole heads, groups of 4)
    } else if constexpr (!produce) {
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (row0 + j >= a.N) break;
        const int64_t at = int64_t(t) * a.ldy + row0 + j;
        if (GLU || a.y_bf16) {
          static_cast<uint16_t*>(a.y)[at] = f32_to_bf16(v[j]);
        } else {
          float* y = static_cast<float*>(a.y) + at;
          *y = a.accumulate ? *y + v[j] : v[j];
        }
      }
    } else {
      // Every load before the first store (a store through y could alias them otherwise).
      float* y = static_cast<float*>(a.y) + int64_t(t) * a.ldy + row0;
      float out[4], gw[4] = {0.f, 0.f, 0.f, 0.f};
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        out[j] = j < rows ? y[j] + v[j] : 0.f;  // (a producer accumulates)
        if (j < rows) gw[j] = __ldg(nf.weight + row0 + j);
      }
      float squares = 0.f;
#pragma unroll
      for (int j = 0; j < 4; ++j) {
        if (j >= rows) break;
        y[j] = out[j];
        nf.out[int64_t(t) * a.N + row0 + j] = f32_to_bf16(out[j] * gw[j]);
        squares += out[j] * out[j];
      }
      sq4[g - g0] = squares;
    }
  }
  if constexpr (produce) {
    // The squares of each token's 64-row parts, the 16 groups of a part added in order.
    __syncthreads();
    constexpr int kParts = kOutRows >= 64 ? kOutRows / 64 : 1;  // (GLU never produces)
    for (int j = int(threadIdx.x); j < (t1 - t0) * kParts; j += kThreads) {
      const int t = t0 + j / kParts, part = j % kParts;
      const int first_row = row_block * kOutRows + 64 * part;
      if (first_row >= a.N) continue;
      const float* p = sq4 + (t - t0) * kGroupsPerToken + 16 * part;
      float sum = 0.f;
      for (int q = 0; q < 16; ++q) sum += p[q];
      nf.sq[int64_t(t) * nf.sq_ld + first_row / 64] = sum;
    }
  }
  cluster.sync();  // no CTA leaves while another still reads its shared memory
}

// The tensor maps of W and x, cached by what they describe (a map holds only the address, the
// shape and the box: an entry for a freed and reused address is still right).
struct MapKey {
  const void* ptr;
  int64_t rows, cols, box_rows;
  bool operator==(const MapKey& o) const {
    return ptr == o.ptr && rows == o.rows && cols == o.cols && box_rows == o.box_rows;
  }
};
struct MapKeyHash {
  size_t operator()(const MapKey& k) const {
    size_t h = std::hash<const void*>()(k.ptr);
    for (int64_t v : {k.rows, k.cols, k.box_rows}) h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

// A [rows][cols] bf16 matrix (rows cols apart), boxes of box_rows x 64.
CUtensorMap map_of(const void* ptr, int64_t rows, int64_t cols, int box_rows) {
  static std::mutex mu;
  static std::unordered_map<MapKey, CUtensorMap, MapKeyHash> cache;
  const MapKey key{ptr, rows, cols, box_rows};
  std::lock_guard<std::mutex> lock(mu);
  if (auto it = cache.find(key); it != cache.end()) return it->second;
  CUtensorMap m;
  const cuuint64_t dims[2] = {cuuint64_t(cols), cuuint64_t(rows)};
  const cuuint64_t strides[1] = {cuuint64_t(cols) * 2};
  const cuuint32_t box[2] = {cuuint32_t(kBox), cuuint32_t(box_rows)};
  PA_CHECK(encode_tensor_map_16bit(&m, DType::bf16, ptr, 2, dims, strides, box),
           "wgmma_gemm: the driver refused a tensor map of ", rows, " x ", cols);
  if (cache.size() >= 4096) cache.clear();
  cache.emplace(key, m);
  return m;
}

// K slices per row block (the cluster's size): the most, up to ctas_per_sm CTAs per SM, whose
// clusters all fit the GPU at once (a second wave of a few clusters would double the time); 1
// where the row blocks alone fill it. A cluster's CTAs must share a GPC, so fewer clusters fit
// than SMs * CTAs per SM / size: the runtime says how many.
template <int NT, int ST, int BOXES, int WG, int AC, bool GLU, int FOLD>
int splits_for(int blocks, int kblocks, int ctas_per_sm) {
  struct Fit {
    int sms = 1;
    std::array<int, kMaxSplits + 1> clusters{};  // clusters of s CTAs that fit at once
  };
  static std::mutex mu;
  static std::unordered_map<int, Fit> by_device;  // the answers differ between GPU models
  int dev = 0;
  if (cudaGetDevice(&dev) != cudaSuccess) return 1;
  Fit fit;
  {
    std::lock_guard<std::mutex> lock(mu);
    auto it = by_device.find(dev);
    if (it == by_device.end()) {
      Fit f;
      f.sms = std::max(1, cuda_sm_count());
      for (int s = 1; s <= kMaxSplits; ++s) {
        cudaLaunchConfig_t cfg = {};
        cfg.gridDim = dim3(unsigned(s));
        cfg.blockDim = dim3(threads_of<WG, FOLD>());
        cfg.dynamicSmemBytes = size_t(Cfg<NT, ST, BOXES, WG, AC>::kSmem);
        cudaLaunchAttribute at[1] = {cluster_attribute(unsigned(s))};
        cfg.attrs = at;
        cfg.numAttrs = 1;
        int n = 0;
        const auto kernel = wgmma_gemm_kernel<NT, ST, BOXES, WG, AC, GLU, FOLD>;
        if (cudaOccupancyMaxActiveClusters(&n, kernel, &cfg) == cudaSuccess)
          f.clusters[size_t(s)] = n;
      }
      (void)cudaGetLastError();
      it = by_device.emplace(dev, f).first;
    }
    fit = it->second;
  }
  for (int s = std::min({kMaxSplits, ctas_per_sm * fit.sms / blocks, kblocks}); s > 1; --s)
    if (fit.clusters[size_t(s)] >= blocks) return s;
  return 1;
}

template <int NT, int ST, int BOXES, int WG, int AC, bool GLU, int FOLD>
cudaError_t launch(const GemvArgs& a, const NormFold& nf, const QkvEpilogue& qe, int ctas_per_sm,
                   cudaStream_t stream) {
  using C = Cfg<NT, ST, BOXES, WG, AC>;
  // NOTE: per device: every rank of a tensor-parallel process sets it on its own GPU.
  static std::atomic<uint64_t> smem_set{0};
  set_smem_limit_on_this_device(wgmma_gemm_kernel<NT, ST, BOXES, WG, AC, GLU, FOLD>, C::kSmem,
                                smem_set,
                                "wgmma_gemm: shared memory limit");
  const int out_rows = GLU ? C::kBM / 2 : C::kBM;  // outputs per row block
  const int blocks = (a.N + out_rows - 1) / out_rows, kblocks = (a.K + C::kBK - 1) / C::kBK;
  const int splits = splits_for<NT, ST, BOXES, WG, AC, GLU, FOLD>(blocks, kblocks, ctas_per_sm);
  const CUtensorMap tw = map_of(a.w, GLU ? 2 * int64_t(a.N) : a.N, a.K, out_rows);
  const CUtensorMap tx = map_of(a.x, a.T, a.K, NT);
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(unsigned(splits), unsigned(blocks));
  cfg.blockDim = dim3(threads_of<WG, FOLD>());
  cfg.dynamicSmemBytes = C::kSmem;
  cfg.stream = stream;
  cudaLaunchAttribute at[2] = {cluster_attribute(unsigned(splits)), pdl_attribute()};
  cfg.attrs = at;
  cfg.numAttrs = 2;
  return cudaLaunchKernelEx(&cfg, wgmma_gemm_kernel<NT, ST, BOXES, WG, AC, GLU, FOLD>, tw, tx, a,
                            nf, qe);
}

// Version v at NT tokens: 1, 128 rows a CTA, five (NT 64: four) stages of one copy, two CTAs
// per SM; 2, ten (eight) stages of one copy, one CTA per SM; 3, two stages of two copies (128 K
// elements), two CTAs per SM; 4, 256 rows a CTA (two consumer warpgroups sharing each x tile:
// half the x reads), five stages, one CTA per SM; 5, 64 rows a CTA (twice the row blocks, so
// fewer K slices: longer streams, a smaller sum), a ring of about 200 KiB, one CTA per SM; 6, 64
// rows, about 100 KiB, two CTAs per SM.
// (The qkv epilogue only on versions 1, 5 and 6: wgmma_gemm_qkv_version_ok.)
template <int NT, bool GLU, int FOLD>
cudaError_t launch_version(const GemvArgs& a, const NormFold& nf, const QkvEpilogue& qe, int v,
                           cudaStream_t stream) {
  constexpr bool wide = NT > 32, all = !qkv_epilogue(FOLD);
  constexpr int kStage64 = 64 * kBox * 2 + NT * kBox * 2;  // a stage of 64 rows and NT tokens
  switch (v) {
    case 1:
      return launch<NT, wide ? 4 : 5, 1, 1, 2, GLU, FOLD>(a, nf, qe, 2, stream);
    case 2:
      if constexpr (all) return launch<NT, wide ? 8 : 10, 1, 1, 2, GLU, FOLD>(a, nf, qe, 1, stream);
      break;
    case 3:
      if constexpr (all) return launch<NT, 2, 2, 1, 2, GLU, FOLD>(a, nf, qe, 2, stream);
      break;
    case 4:
      if constexpr (all) return launch<NT, 5, 1, 2, 2, GLU, FOLD>(a, nf, qe, 1, stream);
      break;
    case 5:
      return launch<NT, 200 * 1024 / kStage64, 1, 1, 1, GLU, FOLD>(a, nf, qe, 1, stream);
    case 6:
      return launch<NT, 100 * 1024 / kStage64, 1, 1, 1, GLU, FOLD>(a, nf, qe, 2, stream);
  }
  return cudaErrorInvalidValue;  // (refused before)
}

template <bool GLU, int FOLD>
cudaError_t launch_tokens(const GemvArgs& a, const NormFold& nf, int v, cudaStream_t stream,
                          const QkvEpilogue& qe = {}) {
  return a.T <= 8    ? launch_version<8, GLU, FOLD>(a, nf, qe, v, stream)
         : a.T <= 16 ? launch_version<16, GLU, FOLD>(a, nf, qe, v, stream)
         : a.T <= 32 ? launch_version<32, GLU, FOLD>(a, nf, qe, v, stream)
                     : launch_version<64, GLU, FOLD>(a, nf, qe, v, stream);
}

template <bool GLU>
cudaError_t launch_folded(const GemvArgs& a, const NormFold& nf, int v, cudaStream_t stream) {
  switch (nf.mode) {
    case NormFold::kConsume:
      return launch_tokens<GLU, NormFold::kConsume>(a, nf, v, stream);
    case NormFold::kProduce:
      if constexpr (!GLU) return launch_tokens<GLU, NormFold::kProduce>(a, nf, v, stream);
      return cudaErrorInvalidValue;  // (refused before: a SwiGLU product never produces)
    default:
      return launch_tokens<GLU, NormFold::kNone>(a, nf, v, stream);
  }
}

// The argmax epilogue on version 1's configuration (launch_version's): 128 rows a CTA, two CTAs
// an SM, one's start and end under the other's stream.
// NOTE: measured on an H100 (Llama-3-8B's lm_head in the step, three rounds alternating): at
// batch 64 7.708-7.715 ms a step against 7.732-7.775 on version 5's configuration and
// 7.728-7.773 on version 6's; level at 8 and 32 (the comparison's switch: branch
// `product-versions-knob`).
constexpr int kArgmaxRows = 128;
cudaError_t launch_argmax(const GemvArgs& a, int32_t vocab0, cudaStream_t stream) {
  constexpr int F = kArgmaxEpilogue;
  NormFold none{};
  none.sq_ld = vocab0;  // (kArgmaxEpilogue's)
  const QkvEpilogue qe{};
  return a.T <= 8    ? launch<8, 5, 1, 1, 2, false, F>(a, none, qe, 2, stream)
         : a.T <= 16 ? launch<16, 5, 1, 1, 2, false, F>(a, none, qe, 2, stream)
         : a.T <= 32 ? launch<32, 5, 1, 1, 2, false, F>(a, none, qe, 2, stream)
                     : launch<64, 4, 1, 1, 2, false, F>(a, none, qe, 2, stream);
}

}  // namespace

bool wgmma_gemm_available() {
  static PerDeviceAnswers answers;
  return hopper_kernel_runs_here(answers, [](cudaFuncAttributes* fa) {
    return cudaFuncGetAttributes(fa, wgmma_gemm_kernel<8, 5, 1, 1, 2, false, NormFold::kNone>);
  });
}

bool wgmma_gemm_supported(const GemvArgs& a) { return product_args_ok(a, kWgmmaGemmMaxTokens); }

bool wgmma_gemm_pick(int32_t T, int32_t N, int32_t K) {
  static const int forced = [] {  // -1: the rule below
    const char* v = std::getenv("PAGEDATTN_WGMMA_GEMM");
    if (!v || *v < '0' || *v > '9') return -1;
    return std::clamp(std::atoi(v), 0, int(kWgmmaGemmMaxTokens));
  }();
  if (T < 1 || N < 1 || K < 8 || K % 8 != 0) return false;
  if (T > (forced >= 0 ? forced : kWgmmaGemmMaxTokens)) return false;
  return wgmma_gemm_available();
}

int wgmma_gemm_version_for(int32_t T, int32_t N, int32_t K) {
  static const int forced = [] {  // 0: the rule below
    const char* v = std::getenv("PAGEDATTN_WGMMA_GEMM_VERSION");
    const int n = v ? std::atoi(v) : 0;
    return n >= 1 && n <= kWgmmaGemmVersions ? n : 0;
  }();
  if (forced) return forced;
  // Small weights (SmolLM2's): the product is mostly launch and latency, and two 128-row CTAs
  // an SM start sooner than one with a 200 KiB ring. (Version 1 on the lm_head from 32 tokens,
  // faster alone in the lab, made Llama-3-8B's step 0.3-0.5% longer at 32 and 64 sequences: an
  // H100, 2026-11-27.)
  (void)T;
  return int64_t(N) * K <= kWgmmaGemmSmallElements ? 1 : kWgmmaGemmDefaultVersion;
}

bool wgmma_gemm_swiglu_takes(int32_t T, int32_t inter, int32_t K) {
  return wgmma_gemm_pick(T, 2 * inter, K);
}

// The version asked for (0: wgmma_gemm_version_for's), checked.
static int version_of(const GemvArgs& a, int version, int32_t rows, const char* what) {
  const int v = version == 0 ? wgmma_gemm_version_for(a.T, rows, a.K) : version;
  PA_CHECK(v >= 1 && v <= kWgmmaGemmVersions, what, ": version ", version, " (1 to ",
           kWgmmaGemmVersions, ")");
  return v;
}

// The sums of squares of `width` values a token: a part per 64 of them, whole 16-byte vectors.
static bool sums_ok(const NormFold& f, int32_t width) {
  return f.sq && reinterpret_cast<uintptr_t>(f.sq) % 16 == 0 && f.sq_ld % 4 == 0 &&
         int64_t(f.sq_ld) * 64 >= int64_t(width);
}

bool norm_fold_ok(const GemvArgs& a, const NormFold& f) {
  switch (f.mode) {
    case NormFold::kNone:
      return true;
    case NormFold::kProduce:
      return a.accumulate && !a.y_bf16 && f.weight && f.out && sums_ok(f, a.N);
    case NormFold::kConsume:
      return !a.accumulate && sums_ok(f, a.K) && f.eps >= 0.f;
  }
  return false;
}

void wgmma_gemm_swiglu(const GemvArgs& a, cudaStream_t stream, int version,
                       const NormFold* fold) {
  PA_CHECK(wgmma_gemm_supported(a) && a.y_bf16 && !a.accumulate,
           "wgmma_gemm_swiglu: ", "unsupported arguments (T ", a.T, ", N ", a.N, ", K ", a.K,
           ", ldy ", a.ldy, ")");
  const NormFold nf = fold ? *fold : NormFold{};
  PA_CHECK(nf.mode != NormFold::kProduce && norm_fold_ok(a, nf),
           "wgmma_gemm_swiglu: a folded norm it cannot take (mode ", int(nf.mode), ")");
  PA_CHECK(wgmma_gemm_available(), "wgmma_gemm_swiglu: this device cannot run it (sm_90 only)");
  const int v = version == 0 ? kWgmmaGemmSwigluVersion
                             : version_of(a, version, 2 * a.N, "wgmma_gemm_swiglu");
  const cudaError_t e = launch_folded<true>(a, nf, v, stream);
  PA_CHECK(e == cudaSuccess, "wgmma_gemm_swiglu: launch failed: ", cudaGetErrorString(e));
}

void wgmma_gemm(const GemvArgs& a, cudaStream_t stream, int version, const NormFold* fold) {
  PA_CHECK(wgmma_gemm_supported(a), "wgmma_gemm: unsupported arguments (T ", a.T, ", N ", a.N,
           ", K ", a.K, ", ldy ", a.ldy, ")");
  const NormFold nf = fold ? *fold : NormFold{};
  PA_CHECK(norm_fold_ok(a, nf), "wgmma_gemm: a folded norm it cannot take (mode ", int(nf.mode),
           ", sq_ld ", nf.sq_ld, ")");
  PA_CHECK(wgmma_gemm_available(), "wgmma_gemm: this device cannot run it (sm_90 only)");
  const int v = version_of(a, version, a.N, "wgmma_gemm");
  const cudaError_t e = launch_folded<false>(a, nf, v, stream);
  PA_CHECK(e == cudaSuccess, "wgmma_gemm: launch failed: ", cudaGetErrorString(e));
}

bool wgmma_gemm_qkv_version_ok(int version) {
  return version == 1 || version == 5 || version == 6;
}

void wgmma_gemm_qkv(const GemvArgs& a, const QkvEpilogue& e, cudaStream_t stream, int version,
                    const NormFold* fold) {
  const QkvParams& p = e.p;
  const int64_t heads = int64_t(p.num_q_heads) + 2 * int64_t(p.num_kv_heads);
  PA_CHECK(wgmma_gemm_supported(a) && !a.accumulate && !a.y_bf16,
           "wgmma_gemm_qkv: unsupported arguments (T ", a.T, ", N ", a.N, ", K ", a.K, ")");
  PA_CHECK((p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256) && p.num_q_heads > 0 &&
               p.num_kv_heads > 0 && heads * p.head_dim == a.N && p.num_tokens == a.T,
           "wgmma_gemm_qkv: ", p.num_q_heads, " q and ", p.num_kv_heads, " kv heads of ",
           p.head_dim, " (64, 128 or 256) at ", p.num_tokens, " tokens do not make the product's ",
           a.N, " rows at ", a.T);
  PA_CHECK(p.k_pool && p.v_pool && p.slots && p.page_size > 0 && p.num_pages > 0 && e.q &&
               e.cos && e.sin && (!p.fp8 || (p.k_scale && p.v_scale)),
           "wgmma_gemm_qkv: q, the pools, their slots and scales and the RoPE rows must be given");
  PA_CHECK(p.interleaved,
           "wgmma_gemm_qkv: the weights' rows must be in interleave_rope_rows' order "
           "(p.interleaved)");
  const NormFold nf = fold ? *fold : NormFold{};
  PA_CHECK((nf.mode == NormFold::kNone || nf.mode == NormFold::kConsume) && norm_fold_ok(a, nf),
           "wgmma_gemm_qkv: a folded norm it cannot take (mode ", int(nf.mode), ")");
  PA_CHECK(wgmma_gemm_available(), "wgmma_gemm_qkv: this device cannot run it (sm_90 only)");
  const int v = version_of(a, version, a.N, "wgmma_gemm_qkv");
  PA_CHECK(wgmma_gemm_qkv_version_ok(v), "wgmma_gemm_qkv: version ", v,
           " has no qkv epilogue (1, 5 or 6)");
  const cudaError_t err =
      nf.mode == NormFold::kConsume
          ? launch_tokens<false, kQkvConsumeEpilogue>(a, nf, v, stream, e)
          : launch_tokens<false, kQkvEpilogue>(a, nf, v, stream, e);
  PA_CHECK(err == cudaSuccess, "wgmma_gemm_qkv: launch failed: ", cudaGetErrorString(err));
}

int32_t wgmma_gemm_argmax_blocks(int32_t N) { return (N + kArgmaxRows - 1) / kArgmaxRows; }

bool wgmma_gemm_argmax_takes(int32_t T, int32_t N, int32_t K) {
  static const bool off = [] {
    const char* v = std::getenv("PAGEDATTN_LM_HEAD_ARGMAX");
    return v && std::string(v) == "0";
  }();
  return !off && wgmma_gemm_pick(T, N, K);
}

namespace {

// The product with the argmax epilogue into pairs [T, row blocks] (the first id vocab0); `op`
// names the caller in the errors, `ok` its own arguments' checks.
void argmax_product(const char* op, const GemvArgs& a, int32_t vocab0, ArgmaxPair* pairs, bool ok,
                    cudaStream_t stream) {
  GemvArgs b = a;
  b.y = pairs;
  b.ldy = std::max(a.ldy, a.N);
  PA_CHECK(ok && pairs && vocab0 >= 0 && !a.accumulate && !a.y_bf16 && wgmma_gemm_supported(b),
           op, ": unsupported arguments (T ", a.T, ", N ", a.N, ", K ", a.K, ", vocab0 ", vocab0,
           ")");
  PA_CHECK(wgmma_gemm_available(), op, ": this device cannot run it (sm_90 only)");
  const cudaError_t e = launch_argmax(b, vocab0, stream);
  PA_CHECK(e == cudaSuccess, op, ": launch failed: ", cudaGetErrorString(e));
}

}  // namespace

void wgmma_gemm_argmax(const GemvArgs& a, ArgmaxPair* pairs, int32_t* ids, cudaStream_t stream) {
  argmax_product("wgmma_gemm_argmax", a, 0, pairs, ids != nullptr, stream);
  argmax_combine_by_row(pairs, wgmma_gemm_argmax_blocks(a.N), a.T, ids, stream);
}

void wgmma_gemm_argmax_slice(const GemvArgs& a, int32_t vocab0, ArgmaxPair* pairs,
                             ArgmaxPair* out, cudaStream_t stream) {
  argmax_product("wgmma_gemm_argmax_slice", a, vocab0, pairs, out != nullptr, stream);
  argmax_combine_by_row_pairs(pairs, wgmma_gemm_argmax_blocks(a.N), a.T, vocab0, out, stream);
}

}  // namespace pagedattn::cuda
