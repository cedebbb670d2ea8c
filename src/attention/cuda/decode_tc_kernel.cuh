// The tensor-core split-KV paged decode kernel for GQA groups (one device body; decode_<q>_<kv>.cu
// instantiate it).
//
// Grid: x = decode items (query row, chunk range), y = num_kv_heads * head_tiles. Block: 4 warps.
// A CTA serves ROWS (8 or 16) query heads of one KV head. The heads are the N side of m16n8k16
// mma.sync and the keys its M side, so each K/V row loaded serves the whole group at tensor-core
// cost (the CUDA-core kernel spends a shuffle reduction and GT dot products per key, which caps it
// well below the memory bandwidth for groups of 4 and more):
//   S^T [16 keys x 8 heads] = K [16 x D] Q^T    (D / 16 mma; K via ldmatrix, Q in registers)
//   online softmax down the columns             (fp32; 8 lanes share a head, 2 keys each)
//   O^T [D x 8] += V^T [D x 16 keys] P^T        (D / 16 mma; V via ldmatrix.trans, P^T from
//                                                S^T's registers via movmatrix.trans)
// Each step covers kStep = 64 positions; warp w owns positions [16 w, 16 w + 16) of the step and
// is its own pipeline: its lanes cp.async exactly the warp's K and V rows into the warp's slice of
// a kStages-deep ring (16-byte chunks XOR-swizzled by row), so a commit-group wait plus __syncwarp
// makes them visible (no CTA barrier inside a chunk).
// fp8 pools: the e4m3 rows are read from shared memory by the same ldmatrix as 16-bit ones (as
// pairs of bytes) and converted to f16 in registers (exact), straight into mma fragments: K's
// dims are permuted within each k16 step (Q's fragments follow), V's rows come from
// ldmatrix.trans plus a byte permute, which puts dims 2 r and 2 r + 1 (not r and r + 8) in a
// thread's O^T rows. The mma then runs in f16, q converted from bf16 exactly within f16's range
// (clamped beyond it).
// At the end of each chunk (DecodeItem::chunk_tokens positions) the four warp states are combined
// in warp order into the chunk's state, written out as a split-KV partial or merged (merge_state)
// into the CTA's running state, as in the CUDA-core kernel: the split partition is fixed by
// position.
#pragma once

#include <type_traits>

#include "cuda_common.cuh"
#include "decode_launch.cuh"
#include "decode_merge.cuh"
#include "kernels.h"
#include "mma.cuh"
#include "pagedattn/attention_cuda.h"

namespace pagedattn::cuda {

constexpr int kDecodeTcThreads = 128;

template <class KV, int HEAD_DIM, int ROWS>
struct DecodeTcShape {
  static constexpr int kWarps = kDecodeTcThreads / 32;
  static constexpr int kWarpKeys = 16;              // positions per warp per step
  static constexpr int kStep = kWarps * kWarpKeys;  // positions per step
  static constexpr bool kFp8 = KV::kBytes == 1;
  static constexpr int kRowChunks = HEAD_DIM * KV::kBytes / 16;  // 16-byte chunks per pool row
  static constexpr int kTileChunks = kWarpKeys * kRowChunks;     // a warp's K (or V) rows
  static constexpr int kLaneChunks = kTileChunks / 32;
  static constexpr size_t kWarpStageBytes = size_t(2) * kTileChunks * 16;  // K, then V
  static constexpr size_t kStageBytes = kWarps * kWarpStageBytes;
  // Copies in flight per CTA: about 96 KiB for 16-bit pools (two CTAs per SM at head_dim <= 128),
  // 48 KiB for fp8 (four CTAs per SM: its in-register conversions want more warps to hide their
  // latency; with 64 KiB, three CTAs, it reached 67% of the copy bandwidth on an H100).
  static constexpr int kTargetStages = int((kFp8 ? 49152 : 98304) / kStageBytes);
  static constexpr int kStages = kTargetStages < 2 ? 2 : (kTargetStages > 4 ? 4 : kTargetStages);
  static constexpr size_t kPipeBytes = size_t(kStages) * kStageBytes;
  // The chunk combine's [kWarps][ROWS][HEAD_DIM] floats reuse the stage consumed last (idle while
  // it runs) where they fit, else have their own room.
  static constexpr size_t kComboBytes = size_t(kWarps) * ROWS * HEAD_DIM * 4;
  static constexpr bool kComboInStage = kComboBytes <= kStageBytes;
  static constexpr size_t kComboOwnBytes = kComboInStage ? 0 : kComboBytes;
  // s_m, s_l, s_w [kWarps][ROWS], s_cm, s_cd [ROWS]
  static constexpr size_t kSmemBytes =
      kPipeBytes + kComboOwnBytes + sizeof(float) * (3 * kWarps * ROWS + 2 * ROWS);
  // The swizzle: chunk c of row r sits at chunk c ^ (r & kSwz) of the row.
  static constexpr int kSwz = (kRowChunks < 8 ? kRowChunks : 8) - 1;
  // Output elements per thread: a contiguous run of one row, a whole number of float4s.
  static constexpr int kOwn = ROWS * HEAD_DIM / kDecodeTcThreads;
  static_assert(kOwn % 4 == 0 && HEAD_DIM % kOwn == 0, "owned elements must tile the rows");
  static_assert(kRowChunks % 8 == 0 || kFp8, "16-bit rows must span 8 chunks (the swizzle)");
  static_assert(kSmemBytes >= sizeof(float) * ROWS * (HEAD_DIM + 5), "merge window of one chunk");
  static_assert(ROWS == 8 || ROWS == 16, "heads come in one or two n8 tiles of the mma");
};

// Two q elements (Q) at src as one register of two MT elements. Q -> f16 (fp8 pools only) is exact
// within f16's range and clamped beyond it.
template <class Q, class MT>
__device__ __forceinline__ uint32_t load_q_pair(const uint16_t* src) {
  const uint32_t w = *reinterpret_cast<const uint32_t*>(src);
  if constexpr (std::is_same_v<Q, MT>) {
    return w;
  } else {
    float f[2];
    Q::word_to_float(w, f);
    const float lim = 65504.f;
    return pack2<MT>(fminf(fmaxf(f[0], -lim), lim), fminf(fmaxf(f[1], -lim), lim));
  }
}

// The transpose of an 8x8 16-bit matrix held as an mma fragment (one register per lane).
__device__ __forceinline__ uint32_t movmatrix_trans(uint32_t x) {
  uint32_t y;
  asm volatile("movmatrix.sync.aligned.m8n8.trans.b16 %0, %1;\n" : "=r"(y) : "r"(x));
  return y;
}

template <class Q, class KV, int HEAD_DIM, int ROWS>
__global__ void __launch_bounds__(kDecodeTcThreads) decode_tc_kernel(const AttentionParams p) {
  allow_dependent_launch();
  decode_trace_mark(p, 0);
  using S = DecodeTcShape<KV, HEAD_DIM, ROWS>;
  using MT = std::conditional_t<S::kFp8, F16, Q>;  // the mma's operand type
  constexpr int kWarps = S::kWarps, kWK = S::kWarpKeys, kStep = S::kStep, kStages = S::kStages;
  constexpr int kRowChunks = S::kRowChunks, kTileChunks = S::kTileChunks;
  constexpr int kN = ROWS / 8;       // n8 tiles of heads
  constexpr int kM = HEAD_DIM / 16;  // m16 tiles of O^T (and k16 steps of S^T)
  extern __shared__ __align__(128) uint8_t smem[];
  uint8_t* pipe = smem;  // [kStages][kWarps][2 (K, V)][kTileChunks] 16-byte chunks
  float* combo_own = reinterpret_cast<float*>(smem + S::kPipeBytes);  // when not in a stage
  float* s_m =
      reinterpret_cast<float*>(smem + S::kPipeBytes + S::kComboOwnBytes);  // [kWarps][ROWS]
  float* s_l = s_m + kWarps * ROWS;                                        // [kWarps][ROWS]
  float* s_w = s_l + kWarps * ROWS;                                        // [kWarps][ROWS]
  float* s_cm = s_w + kWarps * ROWS;                                       // [ROWS]
  float* s_cd = s_cm + ROWS;                                               // [ROWS]

  const DecodeItem it = p.decode_items[blockIdx.x];
  const int kvh = blockIdx.y / p.head_tiles;
  const int g0 = (blockIdx.y % p.head_tiles) * ROWS;
  const int gcount = min(ROWS, p.group - g0);
  const int head0 = kvh * p.group + g0;
  const int tid = threadIdx.x, warp = tid / 32, lane = tid % 32;
  // Lane i: the block-table entry of the item's page i % kDecodeItemPages (read beside the item).
  const int item_page = p.decode_items[blockIdx.x].pages[lane % kDecodeItemPages];
  // Fragment coordinates: rows (keys of S^T, dims of O^T) lane / 4 and lane / 4 + 8; columns
  // (heads) 2 t and 2 t + 1 of each n8 tile.
  const int fr = lane / 4, fc = (lane % 4) * 2;

  const int lo = it.lo, hi = it.hi;  // the row's visible positions (planned on the host)

  const auto* kpool = static_cast<const uint8_t*>(p.k_pages);
  const auto* vpool = static_cast<const uint8_t*>(p.v_pages);
  const int64_t head_off = int64_t(kvh) * p.head_stride * KV::kBytes;
  const int32_t* bt = p.block_table + int64_t(it.seq) * p.max_pages_per_seq;

  // The CTA's running state of its kOwn output elements: row own_g, dims own_d .. own_d + kOwn (one
  // max and sum for them all: merge_state gives every element of a row the same ones).
  constexpr int kOwn = S::kOwn;
  const int own_g = tid * kOwn / HEAD_DIM, own_d = tid * kOwn % HEAD_DIM;
  float run_m = -INFINITY, run_d = 0.f, run_acc[kOwn];
#pragma unroll
  for (int j = 0; j < kOwn; ++j) run_acc[j] = 0.f;

  // ---- the producer: the warp's copies of one step, kStages - 1 steps ahead of their use ----
  int pc = it.chunk_begin;  // producer cursor: chunk and first position of the step
  int pbase = max(pc * it.chunk_tokens, lo);
  const int first_page = pbase / p.page_size;  // the item's page 0 (DecodeItem::pages)
  auto issue = [&](int stage) {
    const bool live = pc < it.chunk_end;
    const int te = min((pc + 1) * it.chunk_tokens, hi);
    // Lane r < kWK finds the byte offset of the warp's row r (-1: past the chunk, zero-filled),
    // its page from the item's copy where it has it, else from the block table.
    int64_t row_off = -1;
    const int t = pbase + warp * kWK + lane;
    const int idx = t / p.page_size - first_page;
    const int copied = __shfl_sync(0xffffffffu, item_page, idx & (kDecodeItemPages - 1));
    if (lane < kWK && live && t < te) {
      const int page = idx < kDecodeItemPages && copied >= 0 ? copied : bt[t / p.page_size];
      row_off = (int64_t(page) * p.page_stride + int64_t(t % p.page_size) * HEAD_DIM) * KV::kBytes +
                head_off;
    }
    uint4* dk =
        reinterpret_cast<uint4*>(pipe + (size_t(stage) * kWarps + warp) * S::kWarpStageBytes);
    uint4* dv = dk + kTileChunks;
#pragma unroll
    for (int j = 0; j < S::kLaneChunks; ++j) {
      const int i = lane + 32 * j, r = i / kRowChunks, c = i % kRowChunks;
      const int64_t off = __shfl_sync(0xffffffffu, row_off, r);
      const bool valid = off >= 0;
      const int64_t src = valid ? off + c * 16 : 0;
      const int slot = r * kRowChunks + (c ^ (r & S::kSwz));
      cp_async16(dk + slot, kpool + src,
                 valid);  // invalid: zero-filled, nothing read
      cp_async16(dv + slot, vpool + src, valid);
    }
    cp_async_commit();
    if (live) {
      pbase += kStep;
      if (pbase >= te) {
        ++pc;
        pbase = max(pc * it.chunk_tokens, lo);
      }
    }
  };
  // q, this step's K/V and their scales are the kernels' before this one (launched as a
  // programmatic dependent: everything above reads only the plan's metadata, uploaded before
  // them). The first stages whose positions all lie below it.cached_end (written before the
  // kernel ahead started: CudaPlanOptions::decode_early_cached_kv) are copied before the wait.
  // NOTE: the condition is uniform across the CTA (the producer cursor is).
  int st = 0;
  for (; st < kStages - 1; ++st) {
    const int te = min((pc + 1) * it.chunk_tokens, hi);
    if (pc < it.chunk_end && min(pbase + kStep, te) > it.cached_end) break;
    issue(st);
  }
  wait_for_dependency();
  for (; st < kStages - 1; ++st) issue(st);
  const float k_mul = S::kFp8 ? p.k_scale[kvh] : 1.f;
  const float v_mul = S::kFp8 ? p.v_scale[kvh] : 1.f;
  const float s_mul = p.scale * k_mul;

  // q after the first copies: its loads wait behind theirs, not the other way round (batch 32,
  // context 520, 8 KV heads on an H100: the prologue to the first copies took 2.0 us).
  // B fragments of Q^T [HEAD_DIM x heads]: head n * 8 + lane / 4, dims 2 t (+1) and 2 t + 8 (+9) of
  // each k16 step (fp8: dims 4 t (+1) and 4 t + 2 (+3), K's order); heads past gcount are zero.
  uint32_t qb[kM][kN][2];
  {
    const uint16_t* qbase =
        static_cast<const uint16_t*>(p.q) + (int64_t(it.q_row) * p.num_q_heads + head0) * HEAD_DIM;
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      const int h = n * 8 + fr;
#pragma unroll
      for (int kk = 0; kk < kM; ++kk) {
#pragma unroll
        for (int i = 0; i < 2; ++i) {
          const int d = kk * 16 + (S::kFp8 ? 2 * fc + 2 * i : fc + 8 * i);
          qb[kk][n][i] = h < gcount ? load_q_pair<Q, MT>(qbase + h * HEAD_DIM + d) : 0u;
        }
      }
    }
  }

  decode_trace_mark(p, 1);

  int step = 0;
  for (int c = it.chunk_begin; c < it.chunk_end; ++c) {
    const int t_begin = max(c * it.chunk_tokens, lo);
    const int t_end = min((c + 1) * it.chunk_tokens, hi);

    // Per head column (n, j): head n * 8 + 2 t + j.
    float m[kN][2], l[kN][2], o[kM][kN][4];
#pragma unroll
    for (int n = 0; n < kN; ++n) {
      m[n][0] = m[n][1] = -INFINITY;
      l[n][0] = l[n][1] = 0.f;
#pragma unroll
      for (int dm = 0; dm < kM; ++dm) o[dm][n][0] = o[dm][n][1] = o[dm][n][2] = o[dm][n][3] = 0.f;
    }

    // NOTE: the trip count is uniform across the CTA and the producer walks the same (chunk, step)
    // sequence, every chunk being non-empty.
    for (int base = t_begin; base < t_end; base += kStep, ++step) {
      __syncwarp();  // the warp is done reading the stage that issue() refills
      issue((step + kStages - 1) % kStages);
      cp_async_wait<kStages - 1>();  // this thread's copies of this step have landed
      __syncwarp();                  // ... and every lane's, for the whole warp
      const uint8_t* tK =
          pipe + (size_t(step % kStages) * kWarps + warp) * S::kWarpStageBytes;  // [16][HEAD_DIM]
      const uint8_t* tV = tK + kTileChunks * 16;
      // The 16-byte chunk that lane's ldmatrix row address points at: row (lane & 7) +
      // 8 * ((lane >> 3) & 1), chunk c0 + (lane >> 4); the four matrices are rows 0-7 and 8-15 of
      // chunk c0, then of chunk c0 + 1.
      const int lrow = (lane & 7) + ((lane >> 3) & 1) * 8;
      auto chunk_at = [&](const uint8_t* tile, int c0) {
        return tile + (lrow * kRowChunks + ((c0 + (lane >> 4)) ^ (lrow & S::kSwz))) * 16;
      };

      // ---- S^T = K Q^T: [16 keys x 8 heads] per n tile ----
      float s[kN][4];
#pragma unroll
      for (int n = 0; n < kN; ++n) s[n][0] = s[n][1] = s[n][2] = s[n][3] = 0.f;
      if constexpr (S::kFp8) {
        // One ldmatrix covers two k16 steps (2 chunks of 16 e4m3); bytes 4 t .. 4 t + 3 of a row
        // are a thread's dims 4 t .. 4 t + 3: a0/a2 (rows 0-7), a1/a3 (rows 8-15).
#pragma unroll
        for (int kb = 0; kb < kM / 2; ++kb) {
          uint32_t r[4];
          ldmatrix_x4(r, chunk_at(tK, 2 * kb));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            uint32_t a[4];
            e4m3x4_to_f16x4(r[2 * h], a[0], a[2]);
            e4m3x4_to_f16x4(r[2 * h + 1], a[1], a[3]);
#pragma unroll
            for (int n = 0; n < kN; ++n)
              mma16816<MT>(s[n], a, qb[2 * kb + h][n][0], qb[2 * kb + h][n][1]);
          }
        }
      } else {
#pragma unroll
        for (int kk = 0; kk < kM; ++kk) {
          uint32_t a[4];
          ldmatrix_x4(a, chunk_at(tK, 2 * kk));
#pragma unroll
          for (int n = 0; n < kN; ++n) mma16816<MT>(s[n], a, qb[kk][n][0], qb[kk][n][1]);
        }
      }

      // ---- scale, soft-cap, mask positions past the chunk (keys fr and fr + 8) ----
      const int key0 = base + warp * kWK + fr;
      const bool ok0 = key0 < t_end, ok1 = key0 + 8 < t_end;
#pragma unroll
      for (int n = 0; n < kN; ++n)
#pragma unroll
        for (int e = 0; e < 4; ++e) {
          float x = s[n][e] * s_mul;
          if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
          s[n][e] = (e < 2 ? ok0 : ok1) ? x * kLog2e : -INFINITY;
        }

        // ---- online softmax per head column (8 lanes share one, 2 keys each) ----
#pragma unroll
      for (int n = 0; n < kN; ++n)
#pragma unroll
        for (int j = 0; j < 2; ++j) {
          float mx = fmaxf(s[n][j], s[n][2 + j]);
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 4));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 8));
          mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 16));
          const float mn = fmaxf(m[n][j], mx);
          const float mref = mn == -INFINITY ? 0.f : mn;
          const float alpha = exp2f(m[n][j] - mref);
          m[n][j] = mn;
          s[n][j] = exp2f(s[n][j] - mref);
          s[n][2 + j] = exp2f(s[n][2 + j] - mref);
          l[n][j] = l[n][j] * alpha + (s[n][j] + s[n][2 + j]);
#pragma unroll
          for (int dm = 0; dm < kM; ++dm) {
            o[dm][n][j] *= alpha;
            o[dm][n][2 + j] *= alpha;
          }
        }

      // ---- O^T += V^T P^T: P^T's B fragments are the transposes of S^T's 8x8 halves ----
      uint32_t pb[kN][2];
#pragma unroll
      for (int n = 0; n < kN; ++n) {
        pb[n][0] = movmatrix_trans(pack2<MT>(s[n][0], s[n][1]));  // keys 0-7
        pb[n][1] = movmatrix_trans(pack2<MT>(s[n][2], s[n][3]));  // keys 8-15
      }
      if constexpr (S::kFp8) {
        // ldmatrix.trans of byte pairs gives (key 2 t, key 2 t + 1) x (dim 2 p, 2 p + 1), p = lane
        // / 4; a byte permute splits it into dim 2 p (O^T row p) and dim 2 p + 1 (row p + 8).
#pragma unroll
        for (int vb = 0; vb < kM / 2; ++vb) {
          uint32_t r[4];
          ldmatrix_x4_trans(r, chunk_at(tV, 2 * vb));
#pragma unroll
          for (int h = 0; h < 2; ++h) {
            const uint32_t k07 = __byte_perm(r[2 * h], 0, 0x3120);       // keys 0-7
            const uint32_t k815 = __byte_perm(r[2 * h + 1], 0, 0x3120);  // keys 8-15
            uint32_t a[4];
            e4m3x4_to_f16x4(k07, a[0], a[1]);
            e4m3x4_to_f16x4(k815, a[2], a[3]);
#pragma unroll
            for (int n = 0; n < kN; ++n) mma16816<MT>(o[2 * vb + h][n], a, pb[n][0], pb[n][1]);
          }
        }
      } else {
#pragma unroll
        for (int dm = 0; dm < kM; ++dm) {
          // Transposed: (dims 0-7, keys 0-7), (dims 0-7, keys 8-15), (dims 8-15, keys 0-7), (dims
          // 8-15, keys 8-15); the A fragment wants the middle two swapped.
          uint32_t r[4];
          ldmatrix_x4_trans(r, chunk_at(tV, 2 * dm));
          const uint32_t a[4] = {r[0], r[2], r[1], r[3]};
#pragma unroll
          for (int n = 0; n < kN; ++n) mma16816<MT>(o[dm][n], a, pb[n][0], pb[n][1]);
        }
      }
    }

    // ---- the chunk's state: the warps' states combined in warp order ----
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        l[n][j] += __shfl_xor_sync(0xffffffffu, l[n][j], 4);
        l[n][j] += __shfl_xor_sync(0xffffffffu, l[n][j], 8);
        l[n][j] += __shfl_xor_sync(0xffffffffu, l[n][j], 16);
      }
    __syncthreads();               // every warp is done with the tiles the combine buffer
                                   // reuses
    float* s_o = S::kComboInStage  // [kWarps][ROWS][HEAD_DIM]
                     ? reinterpret_cast<float*>(pipe + size_t((step + kStages - 1) % kStages) *
                                                           S::kStageBytes)
                     : combo_own;
#pragma unroll
    for (int n = 0; n < kN; ++n)
#pragma unroll
      for (int j = 0; j < 2; ++j) {
        const int head = n * 8 + fc + j;
        // O^T rows fr and fr + 8 of each m16 tile: dims fr and fr + 8 (fp8: 2 fr and 2 fr + 1).
        float* dst = s_o + (size_t(warp) * ROWS + head) * HEAD_DIM + (S::kFp8 ? 2 * fr : fr);
        constexpr int kHi = S::kFp8 ? 1 : 8;
#pragma unroll
        for (int dm = 0; dm < kM; ++dm) {
          dst[dm * 16] = o[dm][n][j];
          dst[dm * 16 + kHi] = o[dm][n][2 + j];
        }
        if (fr == 0) {
          s_m[warp * ROWS + head] = m[n][j];
          s_l[warp * ROWS + head] = l[n][j];
        }
      }
    __syncthreads();
    if (tid < ROWS) {
      weigh_states<kWarps>(
          s_m + tid, s_l + tid, ROWS, [&](int w, float wt) { s_w[w * ROWS + tid] = wt; },
          s_cm[tid], s_cd[tid]);
    }
    __syncthreads();
    {
      float acc[kOwn];
#pragma unroll
      for (int j = 0; j < kOwn; ++j) acc[j] = 0.f;
#pragma unroll
      for (int w = 0; w < kWarps; ++w) {
        const float wt = s_w[w * ROWS + own_g];
        const float4* src =
            reinterpret_cast<const float4*>(s_o + (size_t(w) * ROWS + own_g) * HEAD_DIM + own_d);
#pragma unroll
        for (int j = 0; j < kOwn; j += 4) {
          const float4 v = src[j / 4];
          acc[j] = fmaf(v.x, wt, acc[j]);
          acc[j + 1] = fmaf(v.y, wt, acc[j + 1]);
          acc[j + 2] = fmaf(v.z, wt, acc[j + 2]);
          acc[j + 3] = fmaf(v.w, wt, acc[j + 3]);
        }
      }
      const float cm = s_cm[own_g], cd = s_cd[own_g];
      if (it.partial >= 0) {
        if (own_g < gcount) {
          const int64_t slot =
              int64_t(it.partial + c - it.chunk_begin) * p.num_q_heads + head0 + own_g;
          float4* dst = reinterpret_cast<float4*>(p.partial_o + slot * HEAD_DIM + own_d);
#pragma unroll
          for (int j = 0; j < kOwn; j += 4)
            dst[j / 4] = make_float4(acc[j], acc[j + 1], acc[j + 2], acc[j + 3]);
          if (own_d == 0) {
            p.partial_md[slot * 2] = cm;
            p.partial_md[slot * 2 + 1] = cd;
          }
        }
      } else {
        // merge_state for each element, its max and sum updated once (the same for all).
        SoftmaxState st{run_m, run_d, 0.f};
#pragma unroll
        for (int j = 0; j < kOwn; ++j) {
          st = {run_m, run_d, run_acc[j]};
          merge_state(st, cm, cd, acc[j]);
          run_acc[j] = st.acc;
        }
        run_m = st.m;
        run_d = st.d;
      }
    }
    __syncthreads();  // the combine buffer is read before the next step's copies
                      // refill it
  }

  cp_async_wait<0>();
  decode_trace_mark(p, 2);
  if (it.partial >= 0) {
    const bool merged = merge_if_last<Q, HEAD_DIM, kDecodeTcThreads, ROWS>(
        p, it, head0, gcount, v_mul, smem, S::kSmemBytes);
    decode_trace_mark(p, 3, merged ? uint64_t(1) << 63 : 0);
    return;
  }
  if (own_g < gcount) {
    uint16_t* out = static_cast<uint16_t*>(p.out) +
                    (int64_t(it.q_row) * p.num_q_heads + head0 + own_g) * HEAD_DIM + own_d;
#pragma unroll
    for (int j = 0; j < kOwn; j += 2) {
      const uint32_t w =
          uint32_t(Q::from_float(finalize_state({run_m, run_d, run_acc[j]}, v_mul))) |
          uint32_t(Q::from_float(finalize_state({run_m, run_d, run_acc[j + 1]}, v_mul))) << 16;
      *reinterpret_cast<uint32_t*>(out + j) = w;
    }
  }
  decode_trace_mark(p, 3);
}

template <class Q, class KV, int HEAD_DIM, int ROWS>
void launch_decode_tc_t(const AttentionParams& p, cudaStream_t s) {
  launch_decode_kernel<decode_tc_kernel<Q, KV, HEAD_DIM, ROWS>, kDecodeTcThreads,
                       DecodeTcShape<KV, HEAD_DIM, ROWS>::kSmemBytes>(p, ROWS, s);
}

template <class Q, class KV, int HEAD_DIM>
void launch_decode_tc_dim(const AttentionParams& p, cudaStream_t s) {
  // NOTE: 16 rows at head_dim 256 would spill registers; decode_tc_rows never asks for them.
  if constexpr (HEAD_DIM <= 128) {
    if (p.decode_tc_rows == 16) return launch_decode_tc_t<Q, KV, HEAD_DIM, 16>(p, s);
  }
  return launch_decode_tc_t<Q, KV, HEAD_DIM, 8>(p, s);
}

}  // namespace pagedattn::cuda
