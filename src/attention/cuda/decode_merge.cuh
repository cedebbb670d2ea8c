// The split-KV merge, fused into the decode kernels: the last CTA of a split row merges the row's
// partial states, so a split step costs one launch, not two.
#pragma once

#include "cuda_common.cuh"
#include "kernels.h"

namespace pagedattn::cuda {

// Called by every thread of a decode CTA that has written its chunk partials (it.partial >= 0) for
// query heads head0 .. head0 + gcount - 1 (gcount <= MAX_HEADS), once its own cp.async copies are
// done (smem, of smem_bytes, is free). The CTAs of the row count themselves on p.merge_counters
// (one counter per row and blockIdx.y); the last one merges all num_chunks partials in position
// order with merge_state, exactly as an unsplit CTA merges its chunks (so the output is
// bit-identical with or without the split), writes the output rows and resets the counter for the
// next launch.
//
// NOTE: the partials are first copied into shared memory, a window of chunks at a time, with all
// copies in flight at once: merging straight from global memory costs one L2 round trip per chunk
// (32 chunks at context 8192: about 20 us of a batch-1 step).
template <class Q, int HEAD_DIM, int THREADS, int MAX_HEADS>
__device__ __forceinline__ void merge_if_last(const AttentionParams& p, const DecodeItem& it,
                                              int head0, int gcount, float v_mul, uint8_t* smem,
                                              size_t smem_bytes) {
  __shared__ int s_last;
  __threadfence();  // this thread's partials are visible device-wide before the
                    // count moves
  __syncthreads();
  const MergeItem mi = p.merge_items[it.merge];
  if (threadIdx.x == 0) {
    int32_t* counter = p.merge_counters + int64_t(it.merge) * gridDim.y + blockIdx.y;
    const int done = atomicAdd(counter, 1);
    s_last = done == mi.num_ctas - 1;
    if (s_last) *counter = 0;  // every other CTA of the row has counted already
  }
  __syncthreads();
  if (!s_last) return;
  __threadfence();

  // Window: per chunk gcount rows of HEAD_DIM outputs, gcount (max, sum) pairs and gcount (running
  // max, w_run, w_chunk) triples.
  const int row_floats = gcount * HEAD_DIM;
  const size_t per_chunk = size_t(row_floats + 5 * gcount) * sizeof(float);
  const int window = int(smem_bytes / per_chunk);   // >= 1: the kernels' static_asserts
  float* s_o = reinterpret_cast<float*>(smem);      // [window][gcount][HEAD_DIM]
  float* s_md = s_o + size_t(window) * row_floats;  // [window][gcount][2]
  float* s_w = s_md + size_t(window) * 2 * gcount;  // [window][gcount][3]
  __shared__ float s_run_m[MAX_HEADS], s_run_d[MAX_HEADS];
  if (threadIdx.x < gcount) {
    s_run_m[threadIdx.x] = -INFINITY;
    s_run_d[threadIdx.x] = 0.f;
  }

  // merge_state(run, cm, cd, ca) is run = run * w_run + chunk * w_chunk with weights that depend on
  // the row only (exp2f of the running and the chunk max against the new max): they are computed
  // once per (chunk, row), in parallel, and each element is left a multiply-add chain with the same
  // roundings, so the result is bit-identical to merge_state per element.
  constexpr int kOwn = (MAX_HEADS * HEAD_DIM + THREADS - 1) / THREADS;
  float acc[kOwn];  // element threadIdx.x + j * THREADS
#pragma unroll
  for (int j = 0; j < kOwn; ++j) acc[j] = 0.f;
  for (int c0 = 0; c0 < mi.num_chunks; c0 += window) {
    const int nc = min(window, mi.num_chunks - c0);
    // Copies (L2 only: the partials were written by other SMs), all in flight together.
    const int vecs = row_floats / 4;
    for (int i = threadIdx.x; i < nc * vecs; i += THREADS) {
      const int c = i / vecs, v = i % vecs;
      const int64_t slot = int64_t(mi.partial + c0 + c) * p.num_q_heads + head0;
      cp_async16(s_o + size_t(c) * row_floats + v * 4, p.partial_o + slot * HEAD_DIM + v * 4, true);
    }
    cp_async_commit();
    for (int i = threadIdx.x; i < nc * 2 * gcount; i += THREADS) {
      const int c = i / (2 * gcount), k = i % (2 * gcount);
      const int64_t slot = int64_t(mi.partial + c0 + c) * p.num_q_heads + head0;
      s_md[i] = __ldcg(p.partial_md + slot * 2 + k);
    }
    __syncthreads();
    // The running max after each chunk (a prefix max; one thread per row), in s_w[..][0].
    if (threadIdx.x < gcount) {
      float m = s_run_m[threadIdx.x];
      for (int c = 0; c < nc; ++c) {
        m = fmaxf(m, s_md[(c * gcount + threadIdx.x) * 2]);
        s_w[(c * gcount + threadIdx.x) * 3] = m;
      }
    }
    __syncthreads();
    // The weights of every (chunk, row); a new max of -inf leaves the state as it is (1, 0).
    for (int i = threadIdx.x; i < nc * gcount; i += THREADS) {
      const int c = i / gcount, g = i % gcount;
      const float mn = s_w[i * 3];
      const float mprev = c == 0 ? s_run_m[g] : s_w[(i - gcount) * 3];
      const bool keep = mn == -INFINITY;
      s_w[i * 3 + 1] = keep ? 1.f : exp2f(mprev - mn);
      s_w[i * 3 + 2] = keep ? 0.f : exp2f(s_md[i * 2] - mn);
    }
    __syncthreads();
    if (threadIdx.x < gcount) {  // the row's sum and max, in chunk order
      const int g = threadIdx.x;
      float d = s_run_d[g], m = s_run_m[g];
      for (int c = 0; c < nc; ++c) {
        const float* w = s_w + (c * gcount + g) * 3 + 1;
        const float cm = s_md[(c * gcount + g) * 2];
        if (fmaxf(m, cm) == -INFINITY) continue;
        d = __fadd_rn(__fmul_rn(d, w[0]), __fmul_rn(s_md[(c * gcount + g) * 2 + 1], w[1]));
        m = fmaxf(m, cm);
      }
      s_run_d[g] = d;
      s_run_m[g] = m;
    }
    cp_async_wait<0>();
    __syncthreads();
    for (int c = 0; c < nc; ++c) {
#pragma unroll
      for (int j = 0; j < kOwn; ++j) {
        const int e = threadIdx.x + j * THREADS;
        if (e < row_floats) {
          const float* w = s_w + (c * gcount + e / HEAD_DIM) * 3 + 1;
          acc[j] =
              __fadd_rn(__fmul_rn(acc[j], w[0]), __fmul_rn(s_o[size_t(c) * row_floats + e], w[1]));
        }
      }
    }
    __syncthreads();  // the window is read before the next one is copied in
  }
  uint16_t* out =
      static_cast<uint16_t*>(p.out) + (int64_t(mi.q_row) * p.num_q_heads + head0) * HEAD_DIM;
#pragma unroll
  for (int j = 0; j < kOwn; ++j) {
    const int e = threadIdx.x + j * THREADS;
    if (e < row_floats) {
      const int g = e / HEAD_DIM;
      out[e] = Q::from_float(finalize_state({s_run_m[g], s_run_d[g], acc[j]}, v_mul));
    }
  }
}

}  // namespace pagedattn::cuda
