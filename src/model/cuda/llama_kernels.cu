// The fused element-wise kernels of LlamaModelCuda (see llama_kernels.h for the contracts).
#include <algorithm>
#include <cstdint>

#include "block_math.cuh"  // block_sum, pack_bf16x2, argmax_take
#include "cuda_common.cuh"  // allow_dependent_launch, wait_for_dependency
#include "pdl.h"
#include "llama_kernels.h"
#include "qkv_rows.cuh"  // qkv_destination, add_bias, rope_rotate, store_pairs
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#include "rope_rows.cuh"  // gather_rope_rows
#include "synthetic_fill.h"

namespace pagedattn::cuda {

namespace {

// grid (num_tokens), block 256
__global__ void embed_gather_kernel(const uint16_t* __restrict__ embed,  // [vocab, hidden]
                                    const int32_t* __restrict__ tokens,  // [num_tokens]
                                    const int32_t* __restrict__ chained_ids,  // or null
                                    int32_t hidden, float* __restrict__ x,  // [T, hidden]
                                    RopeRowsGather rope) {
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  gather_rope_rows(rope, blockIdx.x);
  int32_t token = tokens[blockIdx.x];
  if (token < 0) token = chained_ids[-token - 1];  // chained_token(r): the pass before's row r
  const uint16_t* row = embed + int64_t(token) * hidden;
  float* out = x + int64_t(blockIdx.x) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = bf16_to_f32(row[i]);
}

__global__ void embed_gather_shard_kernel(const uint16_t* __restrict__ embed,  // [vocab_rows, hidden]
                                          int32_t vocab0, int32_t vocab_rows,
                                          const int32_t* __restrict__ tokens,  // [num_tokens]
                                          const int32_t* __restrict__ chained_ids,  // or null
                                          int32_t hidden, float* __restrict__ x,  // [T, hidden]
                                          RopeRowsGather rope) {
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  gather_rope_rows(rope, blockIdx.x);
  int32_t token = tokens[blockIdx.x];
  if (token < 0) token = chained_ids[-token - 1];  // chained_token(r): the pass before's row r
  const int32_t local = token - vocab0;
  float* out = x + int64_t(blockIdx.x) * hidden;
  if (local < 0 || local >= vocab_rows) {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = 0.f;
    return;
  }
  const uint16_t* row = embed + int64_t(local) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = bf16_to_f32(row[i]);
}

// grid (num_rows), block kNormThreads. The row is read once, in 16-byte vectors held in registers
// (VECS per thread, the fewest that hold the row up to 8; wider rows are read again for the
// output), so the loads of a row are all in flight together: a loop of dependent scalar loads
// made this kernel latency-bound (15 us a row at hidden 4096 on an H100, 12% of a Llama-3-8B
// decode step at batch 32).
// The weight is no kernel's output: it is read before the wait, so that only x's loads follow the
// kernel ahead (weights after the wait: Llama-3-8B batch 32 7.33-7.41 ms a step against 7.13-7.16,
// one H100, one call, alternating).
// NOTE: with eight vectors a thread at every width it took 96 registers, two blocks an SM: 24 us a
// call for 2048 rows of 4096 in a prefill chunk on an H100, 17 being its traffic.
constexpr int kNormThreads = 256;
template <int kNormVecs>
__global__ void __launch_bounds__(kNormThreads)
    rms_norm_kernel(const float* __restrict__ x,       // [*, hidden]
                    const float* __restrict__ weight,  // [hidden]
                    const int32_t* __restrict__ rows,  // [num_rows] or null
                    int32_t hidden, float eps,
                    uint16_t* __restrict__ out) {  // [num_rows, hidden]
  float4 held_w[kNormVecs];
  if (hidden % 4 == 0) {
    const float4* wv = reinterpret_cast<const float4*>(weight);
#pragma unroll
    for (int k = 0; k < kNormVecs; ++k) {
      const int i = threadIdx.x + k * kNormThreads;
      held_w[k] = i < hidden / 4 ? wv[i] : make_float4(0.f, 0.f, 0.f, 0.f);
    }
  }
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  const int64_t src = rows ? rows[blockIdx.x] : blockIdx.x;
  const float* xr = x + src * hidden;
  uint16_t* o = out + int64_t(blockIdx.x) * hidden;
  float ss = 0.f;
  if (hidden % 4 == 0) {
    const int nv = hidden / 4;
    const float4* xv = reinterpret_cast<const float4*>(xr);
    float4 held[kNormVecs];
#pragma unroll
    for (int k = 0; k < kNormVecs; ++k) {
      const int i = threadIdx.x + k * kNormThreads;
      held[k] = i < nv ? xv[i] : make_float4(0.f, 0.f, 0.f, 0.f);
      ss += held[k].x * held[k].x + held[k].y * held[k].y + held[k].z * held[k].z +
            held[k].w * held[k].w;
    }
    for (int i = threadIdx.x + kNormVecs * kNormThreads; i < nv; i += kNormThreads) {
      const float4 v = xv[i];
      ss += v.x * v.x + v.y * v.y + v.z * v.z + v.w * v.w;
    }
    const float inv = rsqrtf(block_sum(ss) / float(hidden) + eps);
    const float4* wv = reinterpret_cast<const float4*>(weight);
    uint2* ov = reinterpret_cast<uint2*>(o);
#pragma unroll
    for (int k = 0; k < kNormVecs; ++k) {
      const int i = threadIdx.x + k * kNormThreads;
      if (i < nv) {
        const float4 w = held_w[k], v = held[k];
        ov[i] = make_uint2(pack_bf16x2(v.x * inv * w.x, v.y * inv * w.y),
                           pack_bf16x2(v.z * inv * w.z, v.w * inv * w.w));
      }
    }
    for (int i = threadIdx.x + kNormVecs * kNormThreads; i < nv; i += kNormThreads) {
      const float4 w = wv[i], v = xv[i];
      ov[i] = make_uint2(pack_bf16x2(v.x * inv * w.x, v.y * inv * w.y),
                         pack_bf16x2(v.z * inv * w.z, v.w * inv * w.w));
    }
    return;
  }
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) ss += xr[i] * xr[i];
  const float inv = rsqrtf(block_sum(ss) / float(hidden) + eps);
  for (int i = threadIdx.x; i < hidden; i += blockDim.x)
    o[i] = f32_to_bf16(xr[i] * inv * weight[i]);
}

// V consecutive floats of p (V = 1, 2, 4, 8 or 16; p aligned to min(V, 4) floats) into r.
template <int V>
__device__ __forceinline__ void load_floats(const float* p, float (&r)[V]) {
  if constexpr (V == 1) {
    r[0] = p[0];
  } else if constexpr (V == 2) {
    const float2 a = *reinterpret_cast<const float2*>(p);
    r[0] = a.x, r[1] = a.y;
  } else {
#pragma unroll
    for (int j = 0; j < V; j += 4) {
      const float4 a = *reinterpret_cast<const float4*>(p + j);
      r[j] = a.x, r[j + 1] = a.y, r[j + 2] = a.z, r[j + 3] = a.w;
    }
  }
}

// grid ceil(T (Hq + 2 Hkv) / 8), block 256: warp w of block b owns head (8 b + w) % (Hq + 2 Hkv) of
// token (8 b + w) / (Hq + 2 Hkv); lane l owns the RoPE pairs (i, i + D/2), i = l V .. l V + V - 1
// (V = D / 64: one vector load of each half a lane, whole rows a warp).
// NOTE: measured on an H100 (Llama-3-8B, 2048 tokens): a block of D / 2 threads per token and
// head, each with one pair, took 119 us a layer, five times its memory traffic.
template <int V>
__global__ void __launch_bounds__(256)
    qkv_post_kernel(const float* __restrict__ qkv,       // [T, (Hq + 2 Hkv) * D]
                    const float* __restrict__ bias,      // [(Hq + 2 Hkv) * D] or null
                    const float* __restrict__ q_norm,    // [D] or null
                    const float* __restrict__ k_norm,    // [D] or null
                    const float* __restrict__ rope_cos,  // [T, D / 2]
                    const float* __restrict__ rope_sin,  // [T, D / 2]
                    QkvParams p, uint16_t* __restrict__ q,  // [T, Hq, D]
                    uint16_t* __restrict__ k,               // [T, Hkv, D]
                    uint16_t* __restrict__ v) {             // [T, Hkv, D]
  // The attention kernel after this one may start now: it waits for this one before it reads q
  // and this step's K/V, and before that copies only positions written in earlier steps
  // (CudaPlanOptions::decode_early_cached_kv), which every earlier step has finished with: a
  // step's first RMSNorm (or peer all-reduce), ahead of all its attention kernels, lets its
  // dependents start only after its own wait (the later norms may be folded into the products,
  // which let them start at once).
  allow_dependent_launch();
  constexpr int D = 64 * V, half = D / 2;
  const int Hq = p.num_q_heads, Hkv = p.num_kv_heads, heads = Hq + 2 * Hkv;
  const int64_t unit = int64_t(blockIdx.x) * 8 + threadIdx.x / 32;
  if (unit >= int64_t(p.num_tokens) * heads) return;  // the whole warp
  const int t = int(unit / heads), head = int(unit % heads), i = (threadIdx.x % 32) * V;
  const int64_t col = int64_t(head) * D;
  // Before the wait, what no kernel of the step writes: the step's upload (slots) and the weights
  // (the upload precedes the step's first kernel).
  const bool is_q = head < Hq, is_k = !is_q && head < Hq + Hkv;
  uint16_t* dst;
  uint8_t* dst8;  // an fp8 pool's slot (then dst is not used)
  float inv_scale;
  if (!qkv_destination(p, q, k, v, t, head, dst, dst8, inv_scale)) return;  // the whole warp
  float ba[V] = {}, bb[V] = {}, wa[V], wb[V];
  if (bias) {
    load_floats<V>(bias + col + i, ba);
    load_floats<V>(bias + col + half + i, bb);
  }
  const float* w = is_q ? q_norm : k_norm;
  const bool norm = (is_q || is_k) && w;  // uniform across the warp
  if (norm) {
    load_floats<V>(w + i, wa);
    load_floats<V>(w + half + i, wb);
  }
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  const float* src = qkv + int64_t(t) * heads * D + col;
  float a[V], b[V], c[V], s[V];
  if (p.interleaved) {  // x[i + j] at 2 (i + j), x[i + j + D/2] after it
    float ab[2 * V];
    load_floats<2 * V>(src + 2 * i, ab);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = ab[2 * j], b[j] = ab[2 * j + 1];
  } else {
    load_floats<V>(src + i, a);
    load_floats<V>(src + half + i, b);
  }
  if (is_q || is_k) {  // the token's rows, written by this step's embedding kernel
    load_floats<V>(rope_cos + int64_t(t) * half + i, c);
    load_floats<V>(rope_sin + int64_t(t) * half + i, s);
  }
  if (bias) {
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = add_bias(a[j], ba[j]), b[j] = add_bias(b[j], bb[j]);
  }
  if (norm) {
    float ss = 0.f;
#pragma unroll
    for (int j = 0; j < V; ++j) ss += a[j] * a[j] + b[j] * b[j];
#pragma unroll
    for (int o = 16; o > 0; o /= 2) ss += __shfl_xor_sync(0xffffffffu, ss, o);
    const float inv = rsqrtf(ss / float(D) + p.eps);
#pragma unroll
    for (int j = 0; j < V; ++j) a[j] = a[j] * inv * wa[j], b[j] = b[j] * inv * wb[j];
  }
  if (is_q || is_k) {
#pragma unroll
    for (int j = 0; j < V; ++j) rope_rotate(a[j], b[j], c[j], s[j]);
  }
  store_pairs<V>(dst, dst8, inv_scale, i, half, a, b);
}

// grid (ceil(cols / 256), rows), block 256: row 2 j + e of each head of dst = row j + e D / 2 of
// the same head of src (e = 0, 1; j < D / 2).
__global__ void interleave_rope_rows_kernel(const uint16_t* __restrict__ src,
                                            uint16_t* __restrict__ dst, int64_t cols, int32_t D) {
  const int64_t r = blockIdx.y, c = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (c >= cols) return;
  const int64_t head = r / D, w = r % D;
  const int64_t from = head * D + w / 2 + (w % 2) * (D / 2);
  dst[r * cols + c] = src[from * cols + c];
}

// grid ceil(rows half / 256), block 256: rope_tables' values of positions [0, rows) (a double
// product and double cos and sin, rounded to f32).
__global__ void rope_table_kernel(const double* __restrict__ inv_freq, int32_t half, int64_t n,
                                  double scale, float* __restrict__ cos, float* __restrict__ sin) {
  const int64_t e = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (e >= n) return;
  const double angle = double(e / half) * inv_freq[e % half];
  double sv, cv;
  ::sincos(angle, &sv, &cv);
  cos[e] = float(cv * scale);
  sin[e] = float(sv * scale);
}

// grid (ceil(inter / (256 * V)), T), block 256; V = 8 (16-byte vectors, inter % 8 == 0) or 1.
template <int V>
__global__ void swiglu_kernel(const uint16_t* __restrict__ gu,  // [T, 2 * inter] bf16
                              int32_t inter,
                              uint16_t* __restrict__ a) {  // [T, inter]
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  const int j = (blockIdx.x * blockDim.x + threadIdx.x) * V;
  if (j >= inter) return;
  const int64_t t = blockIdx.y;
  const uint16_t* g = gu + t * 2 * inter + j;
  const uint16_t* u = g + inter;
  uint16_t* out = a + t * inter + j;
  auto one = [](uint16_t gb, uint16_t ub) {
    const float x = bf16_to_f32(gb);
    return x / (1.f + __expf(-x)) * bf16_to_f32(ub);
  };
  if constexpr (V == 8) {
    const uint4 gv = *reinterpret_cast<const uint4*>(g), uv = *reinterpret_cast<const uint4*>(u);
    const uint32_t gw[4] = {gv.x, gv.y, gv.z, gv.w}, uw[4] = {uv.x, uv.y, uv.z, uv.w};
    uint32_t ow[4];
#pragma unroll
    for (int i = 0; i < 4; ++i) {
      ow[i] = pack_bf16x2(one(uint16_t(gw[i]), uint16_t(uw[i])),
                          one(uint16_t(gw[i] >> 16), uint16_t(uw[i] >> 16)));
    }
    *reinterpret_cast<uint4*>(out) = make_uint4(ow[0], ow[1], ow[2], ow[3]);
  } else {
    *out = f32_to_bf16(one(*g, *u));
  }
}

// grid (rows), block kArgmaxThreads. The row is read in 16-byte vectors, kArgmaxUnroll of them in
// flight per thread; the scalar head up to the first 16-byte boundary (rows start unaligned when
// vocab % 4 != 0) and the scalar tail go to the first threads. PAIRS: a slice of the vocabulary
// (argmax_rows_slice), whose (value, vocab0 + index) goes to pairs; else the id to ids.
constexpr int kArgmaxThreads = 512, kArgmaxUnroll = 4;
template <bool PAIRS>
__global__ void __launch_bounds__(kArgmaxThreads)
    argmax_rows_kernel(const float* __restrict__ x,  // [rows, stride]
                       int32_t vocab,                // the row's (or slice's) width
                       int64_t stride, int32_t vocab0,
                       int32_t* __restrict__ ids,       // [rows] (!PAIRS)
                       ArgmaxPair* __restrict__ pairs) {  // [rows] (PAIRS)
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  const float* row = x + int64_t(blockIdx.x) * stride;
  // The host rule: its running maximum starts at x[0], which a NaN never leaves, so the answer
  // is 0. Every thread reads the same value: the whole block returns or none of it does.
  if (vocab0 == 0 && (vocab == 0 || isnan(row[0]))) {
    if (threadIdx.x == 0) {
      if (PAIRS) pairs[blockIdx.x] = ArgmaxPair{NAN, 0};
      else ids[blockIdx.x] = 0;
    }
    return;
  }
  // idx == vocab: nothing taken yet (any real element, -inf included, replaces it).
  float best = -INFINITY;
  int32_t idx = vocab;
  const int32_t misalign = int32_t((reinterpret_cast<uintptr_t>(row) % 16) / 4);  // floats past
  const int32_t head = min(vocab, (4 - misalign) % 4);
  const int32_t nv = (vocab - head) / 4;  // float4s after the head
  const int32_t tail = head + 4 * nv;     // first index after them
  if (int32_t(threadIdx.x) < head) argmax_take(row[threadIdx.x], int32_t(threadIdx.x), best, idx);
  const float4* xv = reinterpret_cast<const float4*>(row + head);
  auto take4 = [&](const float4& v, int32_t i) {  // i: the index of v.x
    argmax_take(v.x, i, best, idx);
    argmax_take(v.y, i + 1, best, idx);
    argmax_take(v.z, i + 2, best, idx);
    argmax_take(v.w, i + 3, best, idx);
  };
  int32_t i = int32_t(threadIdx.x);
  for (; i + (kArgmaxUnroll - 1) * kArgmaxThreads < nv; i += kArgmaxUnroll * kArgmaxThreads) {
    float4 v[kArgmaxUnroll];
#pragma unroll
    for (int k = 0; k < kArgmaxUnroll; ++k) v[k] = xv[i + k * kArgmaxThreads];
#pragma unroll
    for (int k = 0; k < kArgmaxUnroll; ++k) take4(v[k], head + 4 * (i + k * kArgmaxThreads));
  }
  for (; i < nv; i += kArgmaxThreads) take4(xv[i], head + 4 * i);
  if (tail + int32_t(threadIdx.x) < vocab) {
    argmax_take(row[tail + threadIdx.x], tail + int32_t(threadIdx.x), best, idx);
  }

  // Within each warp, then across the warps (kArgmaxThreads / 32 <= 32 partials).
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    argmax_take(ob, oi, best, idx);
  }
  __shared__ float part_best[32];
  __shared__ int32_t part_idx[32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    part_best[warp] = best;
    part_idx[warp] = idx;
  }
  __syncthreads();
  if (warp != 0) return;
  best = -INFINITY;
  idx = vocab;
  if (lane < kArgmaxThreads / 32) {
    best = part_best[lane];
    idx = part_idx[lane];
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    argmax_take(ob, oi, best, idx);
  }
  // Whole rows: x[0] is a number, so some element was taken and idx < vocab. A slice past id 0
  // may hold only NaNs (idx == vocab): a pair that never wins.
  if (lane == 0) {
    if (!PAIRS) ids[blockIdx.x] = idx;
    else if (idx == vocab) pairs[blockIdx.x] = ArgmaxPair{-INFINITY, INT32_MAX};
    else pairs[blockIdx.x] = ArgmaxPair{best, vocab0 + idx};
  }
}

// grid (rows), block kCombineThreads: a block per row, its threads folding every
// kCombineThreads-th slice's pair, then the threads' results (the order of the folds does not
// change the answer). Slice w's pair of row r at pairs[w * w_stride + r * r_stride]: world may be
// a few ranks ([world, rows]) or thousands of a product's row blocks ([rows, world], so that a
// row's pairs are read in whole lines: wgmma_gemm_argmax).
constexpr int kCombineThreads = 256;
__global__ void __launch_bounds__(kCombineThreads)
    argmax_combine_kernel(const ArgmaxPair* __restrict__ pairs, int32_t world, int64_t w_stride,
                          int64_t r_stride, int32_t* __restrict__ ids,  // [rows]
                          ArgmaxPair* __restrict__ out, int32_t vocab0) {  // [rows] (or null)
  wait_for_dependency();
  allow_dependent_launch();
  const int32_t r = int32_t(blockIdx.x);
  const ArgmaxPair* row = pairs + r * r_stride;
  // The first slice's x[r, 0] is a NaN: 0 (argmax_rows's rule). Every thread reads it.
  if (isnan(row[0].value)) {
    if (threadIdx.x == 0) {
      if (out) out[r] = ArgmaxPair{NAN, 0};
      else ids[r] = 0;
    }
    return;
  }
  float best = -INFINITY;
  int32_t idx = INT32_MAX;
  int32_t w = int32_t(threadIdx.x);
  for (; w + 3 * kCombineThreads < world; w += 4 * kCombineThreads) {  // 4 loads in flight
    ArgmaxPair p[4];
#pragma unroll
    for (int j = 0; j < 4; ++j) p[j] = row[(w + j * kCombineThreads) * w_stride];
#pragma unroll
    for (int j = 0; j < 4; ++j) argmax_take(p[j].value, p[j].index, best, idx);
  }
  for (; w < world; w += kCombineThreads) {
    const ArgmaxPair p = row[w * w_stride];
    argmax_take(p.value, p.index, best, idx);
  }
  for (int o = 16; o > 0; o >>= 1) {
    const float ob = __shfl_xor_sync(0xffffffffu, best, o);
    const int32_t oi = __shfl_xor_sync(0xffffffffu, idx, o);
    argmax_take(ob, oi, best, idx);
  }
  __shared__ float part_best[kCombineThreads / 32];
  __shared__ int32_t part_idx[kCombineThreads / 32];
  const int lane = threadIdx.x % 32, warp = threadIdx.x / 32;
  if (lane == 0) {
    part_best[warp] = best;
    part_idx[warp] = idx;
  }
  __syncthreads();
  if (threadIdx.x != 0) return;
  for (int w = 1; w < kCombineThreads / 32; ++w) argmax_take(part_best[w], part_idx[w], best, idx);
  if (out) {
    out[r] = idx == INT32_MAX ? ArgmaxPair{-INFINITY, INT32_MAX} : ArgmaxPair{best, vocab0 + idx};
  } else {
    ids[r] = idx;
  }
}

// grid (ceil(n / 256)), block 256
__global__ void f32_to_bf16_kernel(const float* __restrict__ src, int64_t n,
                                   uint16_t* __restrict__ dst) {
  const int64_t idx = int64_t(blockIdx.x) * blockDim.x + threadIdx.x;
  if (idx < n) dst[idx] = f32_to_bf16(src[idx]);
}

// grid (min(ceil(n / 256), 65536)), block 256, grid-stride
template <class T>
__global__ void fill_synthetic_kernel(T* __restrict__ dst, int64_t n, uint64_t key, float center,
                                      float half_width) {  // dst [n]
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const float v = synthetic::value(key, uint64_t(i), center, half_width);
    if constexpr (sizeof(T) == 2) {
      dst[i] = f32_to_bf16(v);
    } else {
      dst[i] = v;
    }
  }
}

template <typename T>
__global__ void fill_synthetic_block_kernel(T* __restrict__ dst, int64_t rows, int64_t cols,
                                            int64_t ld, int64_t offset, uint64_t key, float center,
                                            float half_width) {  // dst [rows, cols]
  const int64_t n = rows * cols;
  for (int64_t i = int64_t(blockIdx.x) * blockDim.x + threadIdx.x; i < n;
       i += int64_t(gridDim.x) * blockDim.x) {
    const int64_t r = i / cols, c = i - r * cols;
    const float v = synthetic::value(key, uint64_t(offset + r * ld + c), center, half_width);
    if constexpr (sizeof(T) == 2) {
      dst[i] = f32_to_bf16(v);
    } else {
      dst[i] = v;
    }
  }
}

unsigned blocks_for(int64_t n) { return unsigned((n + 255) / 256); }

}  // namespace

void embed_gather(const uint16_t* embed, const int32_t* tokens, const int32_t* chained_ids,
                  int32_t num_tokens, int32_t hidden, float* x, const RopeRowsGather& rope,
                  cudaStream_t stream) {
  if (num_tokens == 0) return;
  check_cuda(launch_pdl(embed_gather_kernel, dim3(num_tokens), dim3(256), 0, stream, embed, tokens,
                        chained_ids, hidden, x, rope),
             "LlamaModelCuda: embedding gather");
}

void embed_gather_shard(const uint16_t* embed, int32_t vocab0, int32_t vocab_rows,
                        const int32_t* tokens, const int32_t* chained_ids, int32_t num_tokens,
                        int32_t hidden, float* x, const RopeRowsGather& rope,
                        cudaStream_t stream) {
  if (num_tokens == 0) return;
  check_cuda(launch_pdl(embed_gather_shard_kernel, dim3(num_tokens), dim3(256), 0, stream, embed,
                        vocab0, vocab_rows, tokens, chained_ids, hidden, x, rope),
             "LlamaModelCuda: embedding gather (vocabulary shard)");
}

void rms_norm_bf16(const float* x, const float* weight, const int32_t* rows, int32_t num_rows,
                   int32_t hidden, float eps, uint16_t* out, cudaStream_t stream) {
  if (num_rows == 0) return;
  const int vecs = (hidden / 4 + kNormThreads - 1) / kNormThreads;  // 16-byte vectors a thread
  auto* kernel = vecs <= 1   ? rms_norm_kernel<1>
                 : vecs <= 2 ? rms_norm_kernel<2>
                 : vecs <= 4 ? rms_norm_kernel<4>
                             : rms_norm_kernel<8>;
  check_cuda(launch_pdl(kernel, dim3(num_rows), dim3(kNormThreads), 0, stream, x, weight, rows,
                        hidden, eps, out),
             "LlamaModelCuda: rms_norm");
}

void qkv_post(const float* qkv, const float* bias, const float* q_norm, const float* k_norm,
              const float* rope_cos, const float* rope_sin, const QkvParams& p, uint16_t* q,
              uint16_t* k, uint16_t* v, cudaStream_t stream) {
  PA_CHECK(p.head_dim == 64 || p.head_dim == 128 || p.head_dim == 256 || p.head_dim == 512,
           "LlamaModelCuda: head_dim must be 64, 128, 256 or 512, got ", p.head_dim);
  if (p.num_tokens == 0) return;
  const int64_t units = int64_t(p.num_tokens) * (p.num_q_heads + 2 * p.num_kv_heads);
  auto* kernel = p.head_dim == 64    ? qkv_post_kernel<1>
                 : p.head_dim == 128 ? qkv_post_kernel<2>
                 : p.head_dim == 256 ? qkv_post_kernel<4>
                                     : qkv_post_kernel<8>;
  // NOTE: two warps a block instead of eight at up to 4096 units measured level on an H100
  // (Llama-3-8B decode steps at batch 1, 32 and 64, three rounds).
  check_cuda(launch_pdl(kernel, dim3(unsigned((units + 7) / 8)), dim3(256), 0, stream, qkv, bias,
                        q_norm, k_norm, rope_cos, rope_sin, p, q, k, v),
             "LlamaModelCuda: qkv bias / norm / rope");
}

void interleave_rope_rows(const uint16_t* src, uint16_t* dst, int64_t rows, int64_t cols,
                          int32_t head_dim, cudaStream_t stream) {
  PA_CHECK(head_dim > 0 && head_dim % 2 == 0 && rows % head_dim == 0 && rows <= 65535 &&
               src != dst,
           "interleave_rope_rows: ", rows, " rows of ", cols, " in heads of ", head_dim,
           " (whole heads of an even size, at most 65535 rows, another buffer)");
  if (rows == 0 || cols == 0) return;
  interleave_rope_rows_kernel<<<dim3(unsigned((cols + 255) / 256), unsigned(rows)), 256, 0,
                                stream>>>(src, dst, cols, head_dim);
  check_cuda(cudaGetLastError(), "interleave_rope_rows");
}

void rope_table(const double* inv_freq, int32_t half, int32_t rows, float* cos, float* sin,
                cudaStream_t stream, double scale) {
  const int64_t n = int64_t(rows) * half;
  if (n == 0) return;
  rope_table_kernel<<<unsigned((n + 255) / 256), 256, 0, stream>>>(inv_freq, half, n, scale, cos,
                                                                   sin);
  check_cuda(cudaGetLastError(), "LlamaModelCuda: rope table");
}

void swiglu(const uint16_t* gu, int32_t num_tokens, int32_t inter, uint16_t* a,
            cudaStream_t stream) {
  if (num_tokens == 0 || inter == 0) return;
  const bool wide = inter % 8 == 0;
  check_cuda(launch_pdl(wide ? swiglu_kernel<8> : swiglu_kernel<1>,
                        dim3(blocks_for(wide ? inter / 8 : inter), unsigned(num_tokens)),
                        dim3(256), 0, stream, gu, inter, a),
             "LlamaModelCuda: swiglu");
}

void argmax_rows(const float* x, int32_t rows, int32_t vocab, int32_t* ids, cudaStream_t stream) {
  if (rows == 0) return;
  check_cuda(launch_pdl(argmax_rows_kernel<false>, dim3(rows), dim3(kArgmaxThreads), 0, stream, x,
                        vocab, int64_t(vocab), int32_t(0), ids, static_cast<ArgmaxPair*>(nullptr)),
             "LlamaModelCuda: argmax");
}

void argmax_rows_slice(const float* x, int32_t rows, int32_t width, int64_t stride, int32_t vocab0,
                       ArgmaxPair* pairs, cudaStream_t stream) {
  if (rows == 0) return;
  check_cuda(launch_pdl(argmax_rows_kernel<true>, dim3(rows), dim3(kArgmaxThreads), 0, stream, x,
                        width, stride, vocab0, static_cast<int32_t*>(nullptr), pairs),
             "LlamaModelCuda: argmax of a slice");
}

void argmax_combine(const ArgmaxPair* pairs, int32_t world, int32_t rows, int32_t* ids,
                    cudaStream_t stream) {
  if (rows == 0) return;
  check_cuda(launch_pdl(argmax_combine_kernel, dim3(rows), dim3(kCombineThreads), 0, stream,
                        pairs, world, int64_t(rows), int64_t(1), ids,
                        static_cast<ArgmaxPair*>(nullptr), int32_t(0)),
             "LlamaModelCuda: argmax of the slices");
}

void argmax_combine_by_row(const ArgmaxPair* pairs, int32_t world, int32_t rows, int32_t* ids,
                           cudaStream_t stream) {
  if (rows == 0) return;
  check_cuda(launch_pdl(argmax_combine_kernel, dim3(rows), dim3(kCombineThreads), 0, stream,
                        pairs, world, int64_t(1), int64_t(world), ids,
                        static_cast<ArgmaxPair*>(nullptr), int32_t(0)),
             "LlamaModelCuda: argmax of the row blocks");
}

void argmax_combine_by_row_pairs(const ArgmaxPair* pairs, int32_t world, int32_t rows,
                                 int32_t vocab0, ArgmaxPair* out, cudaStream_t stream) {
  if (rows == 0) return;
  check_cuda(launch_pdl(argmax_combine_kernel, dim3(rows), dim3(kCombineThreads), 0, stream,
                        pairs, world, int64_t(1), int64_t(world), static_cast<int32_t*>(nullptr),
                        out, vocab0),
             "LlamaModelCuda: argmax of a slice's row blocks");
}

void f32_to_bf16_device(const float* src, int64_t n, uint16_t* dst, cudaStream_t stream) {
  if (n == 0) return;
  f32_to_bf16_kernel<<<blocks_for(n), 256, 0, stream>>>(src, n, dst);
  check_launch("LlamaModelCuda: weight conversion");
}

void fill_synthetic_bf16(uint16_t* dst, int64_t n, uint64_t key, float center, float half_width,
                         cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(blocks_for(n), 65536));
  fill_synthetic_kernel<<<grid, 256, 0, stream>>>(dst, n, key, center, half_width);
  check_launch("LlamaModelCuda: synthetic weight fill");
}

void fill_synthetic_f32(float* dst, int64_t n, uint64_t key, float center, float half_width,
                        cudaStream_t stream) {
  if (n == 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(blocks_for(n), 65536));
  fill_synthetic_kernel<<<grid, 256, 0, stream>>>(dst, n, key, center, half_width);
  check_launch("LlamaModelCuda: synthetic weight fill");
}

void fill_synthetic_block_bf16(uint16_t* dst, int64_t rows, int64_t cols, int64_t ld,
                               int64_t offset, uint64_t key, float center, float half_width,
                               cudaStream_t stream) {
  if (rows * cols == 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(blocks_for(rows * cols), 65536));
  fill_synthetic_block_kernel<<<grid, 256, 0, stream>>>(dst, rows, cols, ld, offset, key, center,
                                                        half_width);
  check_launch("LlamaModelCuda: synthetic weight fill");
}

void fill_synthetic_block_f32(float* dst, int64_t rows, int64_t cols, int64_t ld, int64_t offset,
                              uint64_t key, float center, float half_width, cudaStream_t stream) {
  if (rows * cols == 0) return;
  const unsigned grid = unsigned(std::min<int64_t>(blocks_for(rows * cols), 65536));
  fill_synthetic_block_kernel<<<grid, 256, 0, stream>>>(dst, rows, cols, ld, offset, key, center,
                                                        half_width);
  check_launch("LlamaModelCuda: synthetic weight fill");
}

}  // namespace pagedattn::cuda
