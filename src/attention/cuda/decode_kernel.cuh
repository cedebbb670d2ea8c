// The split-KV paged decode kernel on CUDA cores (one device body; decode_<q>_<kv>.cu instantiate
// it with the tensor-core one of decode_tc_kernel.cuh, which GQA groups use).
//
// Grid: x = decode items (query row, chunk range), y = num_kv_heads * head_tiles. Block: 128
// threads. A CTA serves GT query heads of one KV head, so each K/V row it loads is used by all of
// them. Threads form groups of kTx = HEAD_DIM / kVec lanes; a group owns one key row at a time
// (each lane one 16-byte vector of it) and keeps its own online softmax state per query head.
// Loads run kStages - 1 steps ahead of use through a cp.async pipeline in shared memory: each
// thread copies exactly the vectors it will read itself, so a commit-group wait (no barrier)
// makes them visible, and the copies stay in flight across chunk boundaries and merges.
// At the end of each chunk (DecodeItem::chunk_tokens positions) the groups' states are combined
// in a fixed order into the chunk's state, which is either written out as a split-KV partial or
// merged (merge_state) into the CTA's running state. The split partition is therefore fixed by
// position and the arithmetic identical with or without splitting; the last CTA of a split row
// merges its partials (merge_if_last).
#pragma once

#include "cuda_common.cuh"
#include "decode_launch.cuh"
#include "decode_merge.cuh"
#include "decode_tc_kernel.cuh"
#include "kernels.h"
#include "pagedattn/attention_cuda.h"

namespace pagedattn::cuda {

constexpr int kDecodeThreads = 128;

template <class KV, int HEAD_DIM, int GT>
struct DecodeShape {
  static constexpr int kVec = kVecElems<KV>;
  static constexpr int kTx = HEAD_DIM / kVec;
  static constexpr int kGroups = kDecodeThreads / kTx;
  // Keys per group per step and pipeline depth in steps. NOTE: measured on an H100, 4 keys per
  // step for single-head CTAs reached 100% of copy bandwidth at batch 64 but lost 10-25% at
  // batch 1-8 (fewer CTAs fit), and 6 stages did not help fp8 GQA (bound by arithmetic there).
  static constexpr int kUnroll = 2;
  static constexpr int kStages = 4;
  static constexpr int kStep = kGroups * kUnroll;  // positions per step
  static constexpr int kOwn = (GT * HEAD_DIM + kDecodeThreads - 1) / kDecodeThreads;
  static_assert(kTx <= 32 && 32 % kTx == 0, "a key row must fit one warp");
  // pipe [kStages][2 (K, V)][kUnroll][kDecodeThreads] 16-byte vectors, then
  // s_acc [kGroups][GT][HEAD_DIM], s_m, s_d, s_w [kGroups][GT], s_cm, s_cd [GT] floats
  static constexpr size_t kPipeBytes = size_t(kStages) * 2 * kUnroll * kDecodeThreads * 16;
  // NOTE: single-head CTAs at head_dim 256 reserve at least 41 KiB, so that 5 fit an SM, not 6:
  // with 76 registers a thread (this kernel's count since its merge changed) 6 fit by shared
  // memory, and were 2.5-3.7% slower at batch 64, context 2048-8192, than the 5 that its former
  // 86 registers allowed (H100, one call, alternating).
  static constexpr size_t kOccupancyBytes = HEAD_DIM == 256 && GT == 1 ? 41 * 1024 : 0;
  static constexpr size_t kNeededBytes =
      kPipeBytes + sizeof(float) * (size_t(kGroups) * GT * HEAD_DIM + 3 * kGroups * GT + 2 * GT);
  static constexpr size_t kSmemBytes =
      kNeededBytes > kOccupancyBytes ? kNeededBytes : kOccupancyBytes;
  static_assert(kSmemBytes >= sizeof(float) * GT * (HEAD_DIM + 5), "merge window of one chunk");
};

// Loads kVec<KV> elements of a q row (Q: Bf16|F16) as floats times mul.
template <class Q, int N>
__device__ __forceinline__ void load_q(const uint16_t* src, float mul, float* f) {
#pragma unroll
  for (int i = 0; i < N; i += 8) {
    vec_to_float<Q>(ldg16(src + i), f + i);
  }
#pragma unroll
  for (int i = 0; i < N; ++i) f[i] *= mul;
}

template <class Q, class KV, int HEAD_DIM, int GT>
__global__ void __launch_bounds__(kDecodeThreads,
                                  (GT == 4 && KV::kBytes == 2 && HEAD_DIM <= 128) ? 4 : 1)
    decode_kernel(const AttentionParams p) {
  allow_dependent_launch();
  using S = DecodeShape<KV, HEAD_DIM, GT>;
  constexpr int kVec = S::kVec, kTx = S::kTx, kGroups = S::kGroups, kUnroll = S::kUnroll;
  constexpr int kStages = S::kStages, kStep = S::kStep;
  extern __shared__ uint4 smem_vec[];
  uint4* pipe = smem_vec;  // [kStages][2][kUnroll][kDecodeThreads]
  float* s_acc =
      reinterpret_cast<float*>(smem_vec + S::kPipeBytes / 16);  // [kGroups][GT][HEAD_DIM]
  float* s_m = s_acc + size_t(kGroups) * GT * HEAD_DIM;         // [kGroups][GT]
  float* s_d = s_m + kGroups * GT;                              // [kGroups][GT]
  float* s_w = s_d + kGroups * GT;                              // [kGroups][GT]
  float* s_cm = s_w + kGroups * GT;                             // [GT]
  float* s_cd = s_cm + GT;                                      // [GT]

  const DecodeItem it = p.decode_items[blockIdx.x];
  const int kvh = blockIdx.y / p.head_tiles;
  const int g0 = (blockIdx.y % p.head_tiles) * GT;
  const int gcount = min(GT, p.group - g0);
  const int head0 = kvh * p.group + g0;
  const int tid = threadIdx.x, grp = tid / kTx, lane = tid % kTx;
  // Lane i of each warp: the block-table entry of the item's page i % kDecodeItemPages (read
  // beside the item, so that the first copies wait on one dependent read, not two).
  const int item_page = p.decode_items[blockIdx.x].pages[tid % kDecodeItemPages];

  const int lo = it.lo, hi = it.hi;  // the row's visible positions (planned on the host)
  // q, the pages and their scales are the kernels' before this one (launched as a programmatic
  // dependent: everything above reads only the plan's metadata, uploaded before them).
  wait_for_dependency();
  const bool fp8 = KV::kBytes == 1;
  const float k_mul = fp8 ? p.k_scale[kvh] : 1.f;
  const float v_mul = fp8 ? p.v_scale[kvh] : 1.f;

  // This lane's slice of each query head, pre-multiplied by the softmax (and fp8 K) scale.
  float q[GT][kVec];
  const uint16_t* qbase = static_cast<const uint16_t*>(p.q) +
                          (int64_t(it.q_row) * p.num_q_heads + head0) * HEAD_DIM + lane * kVec;
#pragma unroll
  for (int g = 0; g < GT; ++g) {
    if (g < gcount) {
      load_q<Q, kVec>(qbase + g * HEAD_DIM, p.scale * k_mul, q[g]);
    } else {
#pragma unroll
      for (int i = 0; i < kVec; ++i) q[g][i] = 0.f;
    }
  }

  const auto* kpool = static_cast<const uint8_t*>(p.k_pages);
  const auto* vpool = static_cast<const uint8_t*>(p.v_pages);
  const int64_t head_off = (int64_t(kvh) * p.head_stride + lane * kVec) * KV::kBytes;
  const int32_t* bt = p.block_table + int64_t(it.seq) * p.max_pages_per_seq;

  SoftmaxState run[S::kOwn];
#pragma unroll
  for (int j = 0; j < S::kOwn; ++j) run[j] = {-INFINITY, 0.f, 0.f};

  // ---- the producer: issues the copies of one step, kStages - 1 steps ahead of its use ----
  int pc = it.chunk_begin;  // producer cursor: chunk and first position of the step
  int pbase = max(pc * it.chunk_tokens, lo);
  const int first_page = pbase / p.page_size;  // the item's page 0 (DecodeItem::pages)
  // NOTE: every thread calls issue() at the same points (its shuffles need the whole warp).
  auto issue = [&](int stage) {
    uint4* slot = pipe + stage * 2 * kUnroll * kDecodeThreads + tid;
    const bool live = pc < it.chunk_end;
    const int te = min((pc + 1) * it.chunk_tokens, hi);
#pragma unroll
    for (int u = 0; u < kUnroll; ++u) {
      const int t = pbase + u * kGroups + grp;
      const bool valid = live && t < te;
      const int idx = t / p.page_size - first_page;
      const int copied = __shfl_sync(0xffffffffu, item_page, idx & (kDecodeItemPages - 1));
      int64_t off = 0;
      if (valid) {
        const int page = idx < kDecodeItemPages && copied >= 0 ? copied : bt[t / p.page_size];
        off = (int64_t(page) * p.page_stride + int64_t(t % p.page_size) * HEAD_DIM) * KV::kBytes +
              head_off;
      }
      cp_async16(slot + u * kDecodeThreads, kpool + off, valid);  // invalid: zero-filled
      cp_async16(slot + (kUnroll + u) * kDecodeThreads, vpool + off, valid);
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
#pragma unroll
  for (int st = 0; st < kStages - 1; ++st) issue(st);

  int step = 0;
  for (int c = it.chunk_begin; c < it.chunk_end; ++c) {
    const int t_begin = max(c * it.chunk_tokens, lo);
    const int t_end = min((c + 1) * it.chunk_tokens, hi);

    float m[GT], d[GT], acc[GT][kVec];
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      m[g] = -INFINITY;
      d[g] = 0.f;
#pragma unroll
      for (int i = 0; i < kVec; ++i) acc[g][i] = 0.f;
    }

    // NOTE: the trip count is uniform across the CTA (shuffles need every lane of the warp), and
    // the producer walks the same (chunk, step) sequence, every chunk being non-empty.
    for (int base = t_begin; base < t_end; base += kStep, ++step) {
      issue((step + kStages - 1) % kStages);
      cp_async_wait<kStages - 1>();  // this step's copies (this thread's own) have landed
      const uint4* slot = pipe + (step % kStages) * 2 * kUnroll * kDecodeThreads + tid;
      uint4 kr[kUnroll], vr[kUnroll];
      bool valid[kUnroll];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        valid[u] = base + u * kGroups + grp < t_end;
        kr[u] = slot[u * kDecodeThreads];
        vr[u] = slot[(kUnroll + u) * kDecodeThreads];
      }
      float s[kUnroll][GT];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
        float kf[kVec];
        vec_to_float<KV>(kr[u], kf);
#pragma unroll
        for (int g = 0; g < GT; ++g) {
          float acc_dot = 0.f;
#pragma unroll
          for (int i = 0; i < kVec; ++i) acc_dot = fmaf(q[g][i], kf[i], acc_dot);
          s[u][g] = acc_dot;
        }
      }
#pragma unroll
      for (int off = kTx / 2; off > 0; off /= 2) {
#pragma unroll
        for (int u = 0; u < kUnroll; ++u)
#pragma unroll
          for (int g = 0; g < GT; ++g) s[u][g] += __shfl_xor_sync(0xffffffffu, s[u][g], off);
      }
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) {
#pragma unroll
        for (int g = 0; g < GT; ++g) {
          float x = s[u][g];
          if (p.softcap > 0.f) x = p.softcap * tanhf(x / p.softcap);
          s[u][g] = valid[u] ? x * kLog2e : -INFINITY;
        }
      }
      float vf[kUnroll][kVec];
#pragma unroll
      for (int u = 0; u < kUnroll; ++u) vec_to_float<KV>(vr[u], vf[u]);
#pragma unroll
      for (int g = 0; g < GT; ++g) {
        float mn = m[g];
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) mn = fmaxf(mn, s[u][g]);
        const float mref = mn == -INFINITY ? 0.f : mn;
        const float alpha = exp2f(m[g] - mref);
        float pu[kUnroll];
        float dsum = d[g] * alpha;
#pragma unroll
        for (int u = 0; u < kUnroll; ++u) {
          pu[u] = exp2f(s[u][g] - mref);
          dsum += pu[u];
        }
        d[g] = dsum;
        m[g] = mn;
#pragma unroll
        for (int i = 0; i < kVec; ++i) {
          float a = acc[g][i] * alpha;
#pragma unroll
          for (int u = 0; u < kUnroll; ++u) a = fmaf(pu[u], vf[u][i], a);
          acc[g][i] = a;
        }
      }
    }

    // ---- the chunk's state: the groups' states combined in group order ----
    __syncthreads();  // the previous chunk's readers of s_acc are done
#pragma unroll
    for (int g = 0; g < GT; ++g) {
      float4* dst =
          reinterpret_cast<float4*>(s_acc + (size_t(grp) * GT + g) * HEAD_DIM + lane * kVec);
#pragma unroll
      for (int i = 0; i < kVec; i += 4)
        dst[i / 4] = make_float4(acc[g][i], acc[g][i + 1], acc[g][i + 2], acc[g][i + 3]);
      if (lane == 0) {
        s_m[grp * GT + g] = m[g];
        s_d[grp * GT + g] = d[g];
      }
    }
    __syncthreads();
    // The groups' weights and the chunk's (max, sum) per head: one thread per head through shared
    // memory, or (one head) every thread for itself, one barrier fewer per chunk end; the same
    // arithmetic either way.
    float w1[GT == 1 ? kGroups : 1], cm1 = -INFINITY, cd1 = 0.f;
    if constexpr (GT == 1) {
      weigh_states<kGroups>(s_m, s_d, 1, [&](int r, float w) { w1[r] = w; }, cm1, cd1);
    } else {
      if (tid < GT) {
        weigh_states<kGroups>(
            s_m + tid, s_d + tid, GT, [&](int r, float w) { s_w[r * GT + tid] = w; }, s_cm[tid],
            s_cd[tid]);
      }
      __syncthreads();
    }
#pragma unroll
    for (int j = 0; j < S::kOwn; ++j) {
      const int e = tid + j * kDecodeThreads;
      if (e < GT * HEAD_DIM) {
        const int g = e / HEAD_DIM, dim = e % HEAD_DIM;
        float a = 0.f;
#pragma unroll
        for (int r = 0; r < kGroups; ++r)
          a = fmaf(s_acc[(size_t(r) * GT + g) * HEAD_DIM + dim], GT == 1 ? w1[r] : s_w[r * GT + g],
                   a);
        const float cm = GT == 1 ? cm1 : s_cm[g], cd = GT == 1 ? cd1 : s_cd[g];
        if (it.partial >= 0) {
          if (g < gcount) {
            const int64_t slot =
                int64_t(it.partial + c - it.chunk_begin) * p.num_q_heads + head0 + g;
            p.partial_o[slot * HEAD_DIM + dim] = a;
            if (dim == 0) {
              p.partial_md[slot * 2] = cm;
              p.partial_md[slot * 2 + 1] = cd;
            }
          }
        } else {
          merge_state(run[j], cm, cd, a);
        }
      }
    }
  }

  cp_async_wait<0>();
  if (it.partial >= 0) {
    merge_if_last<Q, HEAD_DIM, kDecodeThreads, GT>(
        p, it, head0, gcount, v_mul, reinterpret_cast<uint8_t*>(smem_vec), S::kSmemBytes);
    return;
  }
  uint16_t* out =
      static_cast<uint16_t*>(p.out) + (int64_t(it.q_row) * p.num_q_heads + head0) * HEAD_DIM;
#pragma unroll
  for (int j = 0; j < S::kOwn; ++j) {
    const int e = tid + j * kDecodeThreads;
    if (e < GT * HEAD_DIM && e / HEAD_DIM < gcount)
      out[e] = Q::from_float(finalize_state(run[j], v_mul));
  }
}

template <class Q, class KV, int HEAD_DIM, int GT>
void launch_decode_t(const AttentionParams& p, cudaStream_t s) {
  launch_decode_kernel<decode_kernel<Q, KV, HEAD_DIM, GT>, kDecodeThreads,
                       DecodeShape<KV, HEAD_DIM, GT>::kSmemBytes>(p, GT, s);
}

template <class Q, class KV, int HEAD_DIM>
void launch_decode_dim(const AttentionParams& p, cudaStream_t s) {
  if (p.decode_tc_rows > 0) return launch_decode_tc_dim<Q, KV, HEAD_DIM>(p, s);
  switch (decode_group_tile(p.group, KV::kBytes == 1)) {
    case 1:
      return launch_decode_t<Q, KV, HEAD_DIM, 1>(p, s);
    case 4:
      return launch_decode_t<Q, KV, HEAD_DIM, 4>(p, s);
    default:
      if constexpr (KV::kBytes == 2) return launch_decode_t<Q, KV, HEAD_DIM, 8>(p, s);
  }
}

template <class Q, class KV, int HEAD_DIM>
int decode_ctas_per_sm_dim(int tc_rows, int group_tile) {
  if (tc_rows > 0) {
    if constexpr (HEAD_DIM <= 128) {
      if (tc_rows == 16) {
        return resident_ctas<decode_tc_kernel<Q, KV, HEAD_DIM, 16>, kDecodeTcThreads,
                             DecodeTcShape<KV, HEAD_DIM, 16>::kSmemBytes>();
      }
    }
    return resident_ctas<decode_tc_kernel<Q, KV, HEAD_DIM, 8>, kDecodeTcThreads,
                         DecodeTcShape<KV, HEAD_DIM, 8>::kSmemBytes>();
  }
  switch (group_tile) {
    case 1:
      return resident_ctas<decode_kernel<Q, KV, HEAD_DIM, 1>, kDecodeThreads,
                           DecodeShape<KV, HEAD_DIM, 1>::kSmemBytes>();
    case 4:
      return resident_ctas<decode_kernel<Q, KV, HEAD_DIM, 4>, kDecodeThreads,
                           DecodeShape<KV, HEAD_DIM, 4>::kSmemBytes>();
    default:
      if constexpr (KV::kBytes == 2) {
        return resident_ctas<decode_kernel<Q, KV, HEAD_DIM, 8>, kDecodeThreads,
                             DecodeShape<KV, HEAD_DIM, 8>::kSmemBytes>();
      }
  }
  return 1;
}

// What decode_ctas_per_sm (kernels.h) answers for one (q, kv) dtype pair.
template <class Q, class KV>
int decode_ctas_per_sm_pair(int head_dim, int tc_rows, int group_tile) {
  switch (head_dim) {
    case 64:
      return decode_ctas_per_sm_dim<Q, KV, 64>(tc_rows, group_tile);
    case 128:
      return decode_ctas_per_sm_dim<Q, KV, 128>(tc_rows, group_tile);
    case 256:
      return decode_ctas_per_sm_dim<Q, KV, 256>(tc_rows, group_tile);
    default:
      fail("paged_attention_cuda: head_dim ", head_dim, " is not supported (64, 128 or 256)");
  }
}

// Entry point of one (q, kv) dtype pair; the decode_<q>_<kv>.cu files instantiate it.
template <class Q, class KV>
void launch_decode_pair(const AttentionParams& p, int head_dim, cudaStream_t s) {
  if (p.num_decode_items == 0) return;
  switch (head_dim) {
    case 64:
      return launch_decode_dim<Q, KV, 64>(p, s);
    case 128:
      return launch_decode_dim<Q, KV, 128>(p, s);
    case 256:
      return launch_decode_dim<Q, KV, 256>(p, s);
    default:
      fail("paged_attention_cuda: head_dim ", head_dim, " is not supported (64, 128 or 256)");
  }
}

}  // namespace pagedattn::cuda
