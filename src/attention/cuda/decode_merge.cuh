// The split-KV merge, fused into the decode kernels: the last CTA of a split row merges the row's
// partial states, so a split step costs one launch, not two.
#pragma once

#include "cuda_common.cuh"
#include "hopper.cuh"
#include "kernels.h"

namespace pagedattn::cuda {

// CudaPlanOptions::decode_trace: event e of this CTA, from its first thread (lab instrument).
constexpr int kDecodeTraceEvents = 8;
__device__ __forceinline__ void decode_trace_mark(const AttentionParams& p, int e,
                                                  uint64_t flag = 0) {
  if (p.decode_trace == nullptr || threadIdx.x != 0) return;
  uint64_t t;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
  p.decode_trace[(int64_t(blockIdx.x) * gridDim.y + blockIdx.y) * kDecodeTraceEvents + e] =
      t | flag;
}

// old = *ptr, *ptr += v: one device-scope atomic that is both a release (what this thread, and by
// a barrier before it its CTA, wrote before) and an acquire (what the CTAs that added before it
// had released).
__device__ __forceinline__ int atomic_add_acq_rel_gpu(int* ptr, int v) {
  int old;
  asm volatile("atom.acq_rel.gpu.global.add.s32 %0, [%1], %2;"
               : "=r"(old)
               : "l"(ptr), "r"(v)
               : "memory");
  return old;
}

// The merge of a split row's partials by one CTA (merge_if_last below), with OWN consecutive output
// elements of one row per thread (threadIdx.x * OWN on; a thread past the rows repeats the last
// OWN and writes nothing), so the loops have no branches and each chunk's weights and sum are read
// once per thread.
template <class Q, int HEAD_DIM, int THREADS, int MAX_HEADS, int OWN>
__device__ __forceinline__ void merge_partials(const AttentionParams& p, const MergeItem& mi,
                                               int head0, int gcount, float v_mul, uint8_t* smem,
                                               size_t smem_bytes) {
  // Window: per chunk gcount rows of HEAD_DIM outputs and gcount (max, sum, w_run, w_chunk).
  constexpr int kWarps = THREADS / 32;
  const int row_floats = gcount * HEAD_DIM;
  const size_t per_chunk = size_t(gcount) * (HEAD_DIM + 4) * sizeof(float);
  const int window = int(smem_bytes / per_chunk);  // >= 1: the kernels' static_asserts
  float* s_o = reinterpret_cast<float*>(smem);     // [window][gcount][HEAD_DIM]
  float4* s_q = reinterpret_cast<float4*>(s_o + size_t(window) * row_floats);  // [window][gcount]
  __shared__ float s_run_m[MAX_HEADS];  // the running max before the window
  if (threadIdx.x < MAX_HEADS) s_run_m[threadIdx.x] = -INFINITY;
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  // The outputs come in by bulk copies (one per chunk, one thread issuing them): the cp.async of
  // 16 bytes by every thread reach about 20 GB/s on one SM (4 us for the 64 KB of 32 chunks).
  constexpr bool kBulk = true;
  __shared__ alignas(8) uint64_t s_bar;
  uint32_t phase = 0;
  if (threadIdx.x == 0) {
    mbar_init(&s_bar, 1);
    mbar_fence_init();
  }
#else
  constexpr bool kBulk = false;
#endif

  static_assert(HEAD_DIM % OWN == 0, "a thread's elements lie in one row");
  const int own_e = min(int(threadIdx.x) * OWN, row_floats - OWN);  // the first owned element
  const int own_g = own_e / HEAD_DIM;
  float acc[OWN], den = 0.f;  // the elements' running outputs and their row's running sum
#pragma unroll
  for (int j = 0; j < OWN; ++j) acc[j] = 0.f;
  for (int c0 = 0; c0 < mi.num_chunks; c0 += window) {
    const int nc = min(window, mi.num_chunks - c0);
    // The outputs (L2 only: the partials were written by other SMs), all in flight together.
    if constexpr (kBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      fence_proxy_async();  // the window's earlier generic accesses before the copies' writes
      __syncthreads();      // (and the barrier's initialisation)
      // One copy per lane of warp 0 (issued by one thread, 32 copies took 0.3 us).
      if (warp == 0) {
        if (lane == 0) mbar_arrive_expect_tx(&s_bar, uint32_t(nc * row_floats) * 4);
        __syncwarp();
        fence_proxy_async_global();
        for (int c = lane; c < nc; c += 32)
          bulk_load(s_o + size_t(c) * row_floats,
                    p.partial_o + (int64_t(mi.partial + c0 + c) * p.num_q_heads + head0) * HEAD_DIM,
                    uint32_t(row_floats) * 4, &s_bar);
      }
#endif
    } else {
      const int vecs = row_floats / 4;
      for (int c = 0; c < nc; ++c) {
        const float* src =
            p.partial_o + (int64_t(mi.partial + c0 + c) * p.num_q_heads + head0) * HEAD_DIM;
        for (int v = threadIdx.x; v < vecs; v += THREADS)
          cp_async16(s_o + size_t(c) * row_floats + v * 4, src + v * 4, true);
      }
      cp_async_commit();
    }
    // The (max, sum) pairs, four loads in flight per thread before their stores.
    const int pairs = nc * gcount;
    for (int i0 = 0; i0 < pairs; i0 += 4 * THREADS) {
      float2 v[4];
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = min(i0 + k * THREADS + int(threadIdx.x), pairs - 1);
        const int64_t slot = int64_t(mi.partial + c0 + i / gcount) * p.num_q_heads + head0;
        v[k] = __ldcg(reinterpret_cast<const float2*>(p.partial_md) + slot + i % gcount);
      }
#pragma unroll
      for (int k = 0; k < 4; ++k) {
        const int i = i0 + k * THREADS + int(threadIdx.x);
        if (i < pairs) s_q[i] = make_float4(v[k].x, v[k].y, 0.f, 0.f);
      }
    }
    __syncthreads();
    // The weights: one warp per row scans the chunk maxima 32 at a time (an inclusive prefix max
    // from the running max before the window); a new max of -inf leaves the state as it is (1, 0).
    for (int g = warp; g < gcount; g += kWarps) {
      float carry = s_run_m[g];
      for (int s0 = 0; s0 < nc; s0 += 32) {
        const int c = s0 + lane;
        const float cm = c < nc ? s_q[c * gcount + g].x : -INFINITY;
        float mn = cm;
#pragma unroll
        for (int o = 1; o < 32; o *= 2) {
          const float y = __shfl_up_sync(0xffffffffu, mn, o);
          if (lane >= o) mn = fmaxf(mn, y);
        }
        mn = fmaxf(mn, carry);
        const float up = __shfl_up_sync(0xffffffffu, mn, 1);
        const float mprev = lane == 0 ? carry : up;
        if (c < nc) {
          const bool keep = mn == -INFINITY;
          s_q[c * gcount + g].z = keep ? 1.f : exp2f(mprev - mn);
          s_q[c * gcount + g].w = keep ? 0.f : exp2f(cm - mn);
        }
        carry = __shfl_sync(0xffffffffu, mn, 31);
      }
      __syncwarp();  // every lane has read the running max before it moves on
      if (lane == 0) s_run_m[g] = carry;
    }
    decode_trace_mark(p, c0 == 0 ? 5 : 7);
    if constexpr (kBulk) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
      mbar_wait(&s_bar, phase);
      phase ^= 1;
#endif
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (c0 == 0) decode_trace_mark(p, 6);
    // run = run * w_run + chunk * w_chunk, in chunk order, for every owned element and its sum.
#pragma unroll 4
    for (int c = 0; c < nc; ++c) {
      const float4 q = s_q[c * gcount + own_g];
      const float* oc = s_o + size_t(c) * row_floats + own_e;
      float o[OWN];
      if constexpr (OWN % 4 == 0) {
#pragma unroll
        for (int j = 0; j < OWN; j += 4) {
          const float4 v = reinterpret_cast<const float4*>(oc)[j / 4];
          o[j] = v.x, o[j + 1] = v.y, o[j + 2] = v.z, o[j + 3] = v.w;
        }
      } else {
#pragma unroll
        for (int j = 0; j < OWN; ++j) o[j] = oc[j];
      }
#pragma unroll
      for (int j = 0; j < OWN; ++j)
        acc[j] = __fadd_rn(__fmul_rn(acc[j], q.z), __fmul_rn(o[j], q.w));
      den = __fadd_rn(__fmul_rn(den, q.z), __fmul_rn(q.y, q.w));
    }
    __syncthreads();  // the window is read before the next one is copied in
  }
  decode_trace_mark(p, 7);
  uint16_t* out =
      static_cast<uint16_t*>(p.out) + (int64_t(mi.q_row) * p.num_q_heads + head0) * HEAD_DIM;
  if (int(threadIdx.x) * OWN < row_floats) {
#pragma unroll
    for (int j = 0; j < OWN; ++j)
      out[own_e + j] = Q::from_float(finalize_state({0.f, den, acc[j]}, v_mul));
  }
}

// Called by every thread of a decode CTA that has written its chunk partials (it.partial >= 0) for
// query heads head0 .. head0 + gcount - 1 (gcount <= MAX_HEADS), once its own cp.async copies are
// done (smem, of smem_bytes, is free). The CTAs of the row count themselves on p.merge_counters
// (one counter per row and blockIdx.y); the last one merges all num_chunks partials in position
// order with merge_state's arithmetic, exactly as an unsplit CTA merges its chunks (so the output
// is bit-identical with or without the split), writes the output rows and resets the counter for
// the next launch. Returns whether this CTA merged.
//
// merge_state(run, cm, cd, ca) is run = run * w_run + chunk * w_chunk with weights that depend on
// the row only (exp2f of the previous running max and of the chunk max against the new one). The
// merge computes every (chunk, row)'s weights at once (the running max is a prefix max: a warp
// scan per row), and leaves each output element and each row's sum a multiply-add chain over the
// chunks with merge_state's roundings, its operands in shared memory, where the partials of a
// window of chunks are copied first, all copies in flight at once.
// NOTE: measured on an H100 at batch 1 (lab trace, CudaPlanOptions::decode_trace): the previous
// merge, with the running max and the row sums as loops of one thread per row, the (max, sum)
// pairs read one round trip per loop step and a branch per element and chunk, took the merging
// CTA 12.9 us at context 8192 (32 chunks) and 49 us at 32768, two fifths of the kernel's time.
template <class Q, int HEAD_DIM, int THREADS, int MAX_HEADS>
__device__ __forceinline__ bool merge_if_last(const AttentionParams& p, const DecodeItem& it,
                                              int head0, int gcount, float v_mul, uint8_t* smem,
                                              size_t smem_bytes) {
  __shared__ int s_last;
  const MergeItem mi = p.merge_items[it.merge];
  __syncthreads();  // every thread's partials are written before thread 0's release
  if (threadIdx.x == 0) {
    int32_t* counter = p.merge_counters + int64_t(it.merge) * gridDim.y + blockIdx.y;
    // NOTE: one thread's release after the barrier publishes the whole CTA's partials, and the
    // last CTA's acquire (the same atomic) sees every other CTA's; the barrier below passes that
    // on to its threads. Measured on an H100 (lab trace, batch 1, context 8192): a fence by every
    // thread before the count and again after it took the merging CTA 1.31 us, this 0.83-0.90.
    const int done = atomic_add_acq_rel_gpu(counter, 1);
    s_last = done == mi.num_ctas - 1;
    if (s_last) *counter = 0;  // every other CTA of the row has counted already
  }
  __syncthreads();
  if (!s_last) return false;
  decode_trace_mark(p, 4);
  // As few elements per thread as the rows need: the tile's MAX_HEADS rows, or half of them.
  constexpr int kOwn = (MAX_HEADS * HEAD_DIM + THREADS - 1) / THREADS;
  constexpr int kHalf = (MAX_HEADS / 2 * HEAD_DIM + THREADS - 1) / THREADS;
  if constexpr (kHalf >= 1 && kHalf < kOwn) {
    if (gcount * HEAD_DIM <= kHalf * THREADS) {
      merge_partials<Q, HEAD_DIM, THREADS, MAX_HEADS, kHalf>(p, mi, head0, gcount, v_mul, smem,
                                                             smem_bytes);
      return true;
    }
  }
  merge_partials<Q, HEAD_DIM, THREADS, MAX_HEADS, kOwn>(p, mi, head0, gcount, v_mul, smem,
                                                        smem_bytes);
  return true;
}

}  // namespace pagedattn::cuda
