// The tensor-core paged prefill kernel (one device body; prefill_<q>.cu instantiate it).
//
// Grid: x = prefill items (sequence, first packed row), y = num_kv_heads. Block: 8 warps.
// A CTA owns kPrefillRows packed rows of one sequence and one KV head: packed row r is query
// r / group, head r % group, so every K/V tile it loads serves the whole GQA group. Each warp owns
// 16 rows. K/V tiles of BN positions are gathered page by page with cp.async into swizzled shared
// memory (two stages: the next tile loads while this one is used); S = Q K^T and O += P V run on
// mma.sync m16n8k16 (bf16 or f16 in, fp32 accumulate); the online softmax is fp32 in registers.
// Masks (causal, window, kv_len) are applied only on tiles that cross a boundary.
#pragma once

#include "cuda_common.cuh"
#include "kernels.h"
#include "mma.cuh"

namespace pagedattn::cuda {

constexpr int kPrefillThreads = 256;

template <int HEAD_DIM>
struct PrefillShape {
  static constexpr int kBM = kPrefillRows;
  static constexpr int kBN = HEAD_DIM >= 256 ? 32 : 64;
  static constexpr int kChunks = HEAD_DIM / 8;  // 16-byte chunks per row
  static constexpr size_t kSmemBytes = sizeof(uint16_t) * HEAD_DIM * (kBM + 4 * kBN);
  static_assert(kBM == 16 * (kPrefillThreads / 32), "one warp per 16 rows");
};

template <class Q, int HEAD_DIM>
__global__ void __launch_bounds__(kPrefillThreads) prefill_kernel(const AttentionParams p) {
  allow_dependent_launch();
  using S = PrefillShape<HEAD_DIM>;
  constexpr int BM = S::kBM, BN = S::kBN, kChunks = S::kChunks;
  extern __shared__ __align__(128) uint16_t sm[];
  uint16_t* sQ = sm;                      // [BM][HEAD_DIM]
  uint16_t* sK = sQ + BM * HEAD_DIM;      // [2][BN][HEAD_DIM]
  uint16_t* sV = sK + 2 * BN * HEAD_DIM;  // [2][BN][HEAD_DIM]

  const PrefillItem it = p.prefill_items[blockIdx.x];
  const int kvh = blockIdx.y;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  const int G = p.group;
  const int q0 = p.q_indptr[it.seq], qlen = p.q_indptr[it.seq + 1] - q0, L = p.kv_len[it.seq];
  const int row_end = min(it.row_begin + BM, qlen * G);
  const int pos_base = L - qlen;
  const int pos_lo = pos_base + it.row_begin / G, pos_hi = pos_base + (row_end - 1) / G;
  const int key_hi = p.causal ? pos_hi + 1 : L;  // exclusive
  const int key_lo = p.window > 0 ? max(0, pos_lo - p.window + 1) : 0;
  const int t_first = key_lo / BN * BN;
  const int ntiles = key_hi > t_first ? (key_hi - t_first + BN - 1) / BN : 0;

  const uint16_t* q = static_cast<const uint16_t*>(p.q);
  const uint16_t* kpool = static_cast<const uint16_t*>(p.k_pages);
  const uint16_t* vpool = static_cast<const uint16_t*>(p.v_pages);
  const int32_t* bt = p.block_table + int64_t(it.seq) * p.max_pages_per_seq;

  // ---- Q tile (rows past the sequence's are zero) ----
  for (int i = tid; i < BM * kChunks; i += kPrefillThreads) {
    const int r = i / kChunks, c = i % kChunks, pr = it.row_begin + r;
    const bool valid = pr < row_end;
    const uint16_t* src = q;
    if (valid)
      src = q + (int64_t(q0 + pr / G) * p.num_q_heads + kvh * G + pr % G) * HEAD_DIM + c * 8;
    cp_async16(sQ + swz<HEAD_DIM>(r, c), src, valid);
  }
  auto load_kv = [&](int tile, int stage) {
    const int t0 = t_first + tile * BN;
    uint16_t* dk = sK + stage * BN * HEAD_DIM;
    uint16_t* dv = sV + stage * BN * HEAD_DIM;
    for (int i = tid; i < BN * kChunks; i += kPrefillThreads) {
      const int r = i / kChunks, c = i % kChunks, t = t0 + r;
      const bool valid = t < key_hi;
      int64_t off = 0;
      if (valid) {
        off = int64_t(bt[t / p.page_size]) * p.page_stride + int64_t(kvh) * p.head_stride +
              int64_t(t % p.page_size) * HEAD_DIM + c * 8;
      }
      cp_async16(dk + swz<HEAD_DIM>(r, c), kpool + off, valid);
      cp_async16(dv + swz<HEAD_DIM>(r, c), vpool + off, valid);
    }
  };
  if (ntiles > 0) load_kv(0, 0);
  cp_async_commit();

  // This thread's two rows (lane / 4 and lane / 4 + 8 of the warp's 16) and their positions.
  int row_pos[2];
  bool row_ok[2];
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    const int pr = it.row_begin + warp * 16 + lane / 4 + 8 * h;
    row_ok[h] = pr < row_end;
    row_pos[h] = pos_base + pr / G;
  }
  float o[HEAD_DIM / 8][4];
#pragma unroll
  for (int n = 0; n < HEAD_DIM / 8; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
  float m[2] = {-INFINITY, -INFINITY}, l[2] = {0.f, 0.f};

  for (int tile = 0; tile < ntiles; ++tile) {
    if (tile + 1 < ntiles) load_kv(tile + 1, (tile + 1) & 1);
    cp_async_commit();
    cp_async_wait<1>();
    __syncthreads();
    const uint16_t* tK = sK + (tile & 1) * BN * HEAD_DIM;
    const uint16_t* tV = sV + (tile & 1) * BN * HEAD_DIM;

    // ---- S = Q K^T (16 x BN per warp) ----
    float s[BN / 8][4];
#pragma unroll
    for (int n = 0; n < BN / 8; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
#pragma unroll
    for (int kk = 0; kk < HEAD_DIM / 16; ++kk) {
      uint32_t a[4];
      ldmatrix_x4(a, sQ + swz<HEAD_DIM>(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                        kk * 2 + (lane >> 4)));
#pragma unroll
      for (int nn = 0; nn < BN / 16; ++nn) {
        uint32_t b[4];
        ldmatrix_x4(b, tK + swz<HEAD_DIM>(nn * 16 + (lane & 7) + (lane >> 4) * 8,
                                          kk * 2 + ((lane >> 3) & 1)));
        mma16816<Q>(s[2 * nn], a, b[0], b[1]);
        mma16816<Q>(s[2 * nn + 1], a, b[2], b[3]);
      }
    }

    // ---- scale, soft-cap, mask (only where the tile crosses a boundary) ----
    const int t0 = t_first + tile * BN;
    const bool full = t0 + BN <= L && (!p.causal || t0 + BN <= pos_lo + 1) &&
                      (p.window == 0 || t0 > pos_hi - p.window) && it.row_begin + BM <= row_end;
#pragma unroll
    for (int n = 0; n < BN / 8; ++n)
#pragma unroll
      for (int e = 0; e < 4; ++e) {
        float x = s[n][e] * p.scale;
        if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
        x *= kLog2e;
        if (!full) {
          const int t = t0 + n * 8 + (lane & 3) * 2 + (e & 1), h = e >> 1;
          const bool vis = row_ok[h] && t < L && (!p.causal || t <= row_pos[h]) &&
                           (p.window == 0 || t > row_pos[h] - p.window);
          if (!vis) x = -INFINITY;
        }
        s[n][e] = x;
      }

      // ---- online softmax (rows lane/4 and lane/4 + 8; a quad shares a row) ----
#pragma unroll
    for (int h = 0; h < 2; ++h) {
      float mx = -INFINITY;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) mx = fmaxf(mx, fmaxf(s[n][2 * h], s[n][2 * h + 1]));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const float mn = fmaxf(m[h], mx);
      const float mref = mn == -INFINITY ? 0.f : mn;
      const float alpha = exp2f(m[h] - mref);
      m[h] = mn;
      float sum = 0.f;
#pragma unroll
      for (int n = 0; n < BN / 8; ++n) {
        s[n][2 * h] = exp2f(s[n][2 * h] - mref);
        s[n][2 * h + 1] = exp2f(s[n][2 * h + 1] - mref);
        sum += s[n][2 * h] + s[n][2 * h + 1];
      }
      l[h] = l[h] * alpha + sum;
#pragma unroll
      for (int n = 0; n < HEAD_DIM / 8; ++n) {
        o[n][2 * h] *= alpha;
        o[n][2 * h + 1] *= alpha;
      }
    }

    // ---- O += P V ----
#pragma unroll
    for (int kk = 0; kk < BN / 16; ++kk) {
      uint32_t a[4];
      a[0] = pack2<Q>(s[2 * kk][0], s[2 * kk][1]);
      a[1] = pack2<Q>(s[2 * kk][2], s[2 * kk][3]);
      a[2] = pack2<Q>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      a[3] = pack2<Q>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
#pragma unroll
      for (int dn = 0; dn < HEAD_DIM / 16; ++dn) {
        uint32_t b[4];
        ldmatrix_x4_trans(b, tV + swz<HEAD_DIM>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                dn * 2 + (lane >> 4)));
        mma16816<Q>(o[2 * dn], a, b[0], b[1]);
        mma16816<Q>(o[2 * dn + 1], a, b[2], b[3]);
      }
    }
    __syncthreads();  // this stage is reloaded two tiles from now
  }
  cp_async_wait<0>();

  // ---- normalise and store ----
  uint16_t* out = static_cast<uint16_t*>(p.out);
#pragma unroll
  for (int h = 0; h < 2; ++h) {
    float sum = l[h];
    sum += __shfl_xor_sync(0xffffffffu, sum, 1);
    sum += __shfl_xor_sync(0xffffffffu, sum, 2);
    if (!row_ok[h]) continue;
    const float inv = sum > 0.f ? 1.f / sum : 0.f;
    const int pr = it.row_begin + warp * 16 + lane / 4 + 8 * h;
    uint16_t* dst =
        out + (int64_t(q0 + pr / G) * p.num_q_heads + kvh * G + pr % G) * HEAD_DIM + (lane & 3) * 2;
#pragma unroll
    for (int n = 0; n < HEAD_DIM / 8; ++n)
      *reinterpret_cast<uint32_t*>(dst + n * 8) =
          pack2<Q>(o[n][2 * h] * inv, o[n][2 * h + 1] * inv);
  }
}

template <class Q, int HEAD_DIM>
void launch_prefill_t(const AttentionParams& p, cudaStream_t s) {
  using S = PrefillShape<HEAD_DIM>;
  static std::atomic<uint64_t> configured{0};  // per kernel instance, per device
  set_smem_limit_on_this_device(prefill_kernel<Q, HEAD_DIM>, int(S::kSmemBytes), configured,
                                "paged_attention_cuda: prefill shared memory attribute");
  const dim3 grid(unsigned(p.num_prefill_items), unsigned(p.num_kv_heads));
  prefill_kernel<Q, HEAD_DIM><<<grid, kPrefillThreads, S::kSmemBytes, s>>>(p);
  check_launch("paged_attention_cuda: prefill kernel launch");
}

template <class Q>
void launch_prefill_q(const AttentionParams& p, int head_dim, cudaStream_t s) {
  if (p.num_prefill_items == 0) return;
  switch (head_dim) {
    case 64:
      return launch_prefill_t<Q, 64>(p, s);
    case 128:
      return launch_prefill_t<Q, 128>(p, s);
    case 256:
      return launch_prefill_t<Q, 256>(p, s);
    default:
      fail("paged_attention_cuda: head_dim ", head_dim, " is not supported (64, 128 or 256)");
  }
}

}  // namespace pagedattn::cuda
