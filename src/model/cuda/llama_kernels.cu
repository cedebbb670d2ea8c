// The fused element-wise kernels of LlamaModelCuda (see llama_kernels.h for the contracts).
#include <algorithm>
#include <cstdint>

#include "block_math.cuh"  // block_sum, pack_bf16x2
#include "cuda_common.cuh"  // allow_dependent_launch, wait_for_dependency
#include "pdl.h"
#include "llama_kernels.h"
#include "pagedattn/dtype.h"
#include "pagedattn/error.h"
#include "synthetic_fill.h"

namespace pagedattn::cuda {

namespace {

// grid (num_tokens), block 256
__global__ void embed_gather_kernel(const uint16_t* __restrict__ embed,       // [vocab, hidden]
                                    const int32_t* __restrict__ tokens,       // [num_tokens]
                                    int32_t hidden, float* __restrict__ x) {  // [T, hidden]
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  const uint16_t* row = embed + int64_t(tokens[blockIdx.x]) * hidden;
  float* out = x + int64_t(blockIdx.x) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = bf16_to_f32(row[i]);
}

__global__ void embed_gather_shard_kernel(const uint16_t* __restrict__ embed,  // [vocab_rows, hidden]
                                          int32_t vocab0, int32_t vocab_rows,
                                          const int32_t* __restrict__ tokens,       // [num_tokens]
                                          int32_t hidden, float* __restrict__ x) {  // [T, hidden]
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  allow_dependent_launch();
  const int32_t local = tokens[blockIdx.x] - vocab0;
  float* out = x + int64_t(blockIdx.x) * hidden;
  if (local < 0 || local >= vocab_rows) {
    for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = 0.f;
    return;
  }
  const uint16_t* row = embed + int64_t(local) * hidden;
  for (int i = threadIdx.x; i < hidden; i += blockDim.x) out[i] = bf16_to_f32(row[i]);
}

// grid (num_rows), block kNormThreads. The row is read once, in 16-byte vectors held in registers
// (up to kNormVecs per thread; wider rows are read again for the output), so the loads of a row
// are all in flight together: a loop of dependent scalar loads made this kernel latency-bound
// (15 us a row at hidden 4096 on an H100, 12% of a Llama-3-8B decode step at batch 32).
// The weight is no kernel's output: it is read before the wait, so that only x's loads follow the
// kernel ahead (weights after the wait: Llama-3-8B batch 32 7.33-7.41 ms a step against 7.13-7.16,
// one H100, one call, alternating).
constexpr int kNormThreads = 256, kNormVecs = 8;
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

// grid (num_tokens, Hq + 2 Hkv), block head_dim / 2: thread i owns the RoPE pair (i, i + D/2).
__global__ void qkv_post_kernel(const float* __restrict__ qkv,       // [T, (Hq + 2 Hkv) * D]
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
  // (CudaPlanOptions::decode_early_cached_kv), which every kernel ahead of the projection
  // before this one has finished with (that projection starts when the kernel ahead of it lets
  // it, after its own wait).
  allow_dependent_launch();
  wait_for_dependency();  // launched with launch_pdl: the kernels before it have finished
  const int t = blockIdx.x, head = blockIdx.y, i = threadIdx.x;
  const int D = p.head_dim, half = D / 2, Hq = p.num_q_heads, Hkv = p.num_kv_heads;
  const int64_t width = int64_t(Hq + 2 * Hkv) * D;
  const int64_t col = int64_t(head) * D;
  float a = qkv[t * width + col + i], b = qkv[t * width + col + i + half];
  if (bias) {
    a += bias[col + i];
    b += bias[col + i + half];
  }
  const bool is_q = head < Hq, is_k = !is_q && head < Hq + Hkv;
  uint16_t* dst;
  if (is_q) {
    dst = q + (int64_t(t) * Hq + head) * D;
  } else if (p.k_pool) {  // into the token's slot of the pool (PagedKVView::offset)
    const int32_t slot = p.slots[t];
    // NOTE: the same for every thread of the block (one token), so the whole block leaves.
    if (slot < 0 || slot >= int64_t(p.num_pages) * p.page_size) return;
    const int h = is_k ? head - Hq : head - Hq - Hkv;
    const int64_t at = (int64_t(slot / p.page_size) * Hkv + h) * p.page_size * D +
                       int64_t(slot % p.page_size) * D;
    dst = (is_k ? p.k_pool : p.v_pool) + at;
  } else if (is_k) {
    dst = k + (int64_t(t) * Hkv + (head - Hq)) * D;
  } else {
    dst = v + (int64_t(t) * Hkv + (head - Hq - Hkv)) * D;
  }
  if (is_q || is_k) {
    const float* w = is_q ? q_norm : k_norm;
    if (w) {  // uniform across the block: every thread takes this branch or none does
      const float inv = rsqrtf(block_sum(a * a + b * b) / float(D) + p.eps);
      a = a * inv * w[i];
      b = b * inv * w[i + half];
    }
    const float c = rope_cos[int64_t(t) * half + i], s = rope_sin[int64_t(t) * half + i];
    const float ra = a * c - b * s, rb = b * c + a * s;
    a = ra;
    b = rb;
  }
  dst[i] = f32_to_bf16(a);
  dst[i + half] = f32_to_bf16(b);
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

// The argmax fold: (v, i) replaces (best, idx) when v is larger, or equal at a lower index. A NaN v
// compares false both ways and never replaces anything; the order of the folds cannot change the
// result (the lowest index of the largest value), so the reduction below is deterministic.
__device__ __forceinline__ void argmax_take(float v, int32_t i, float& best, int32_t& idx) {
  if (v > best || (v == best && i < idx)) {
    best = v;
    idx = i;
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

// grid (ceil(rows / 128)), block 128: a thread per row folds the slices' pairs in order.
__global__ void argmax_combine_kernel(const ArgmaxPair* __restrict__ pairs,  // [world, rows]
                                      int32_t world, int32_t rows,
                                      int32_t* __restrict__ ids) {  // [rows]
  wait_for_dependency();
  allow_dependent_launch();
  const int32_t r = int32_t(blockIdx.x * blockDim.x + threadIdx.x);
  if (r >= rows) return;
  if (isnan(pairs[r].value)) {  // the first slice's x[r, 0] is a NaN: 0 (argmax_rows's rule)
    ids[r] = 0;
    return;
  }
  float best = -INFINITY;
  int32_t idx = INT32_MAX;
  for (int32_t w = 0; w < world; ++w) {
    const ArgmaxPair p = pairs[int64_t(w) * rows + r];
    argmax_take(p.value, p.index, best, idx);
  }
  ids[r] = idx;
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

void embed_gather(const uint16_t* embed, const int32_t* tokens, int32_t num_tokens, int32_t hidden,
                  float* x, cudaStream_t stream) {
  if (num_tokens == 0) return;
  check_cuda(launch_pdl(embed_gather_kernel, dim3(num_tokens), dim3(256), 0, stream, embed, tokens,
                        hidden, x),
             "LlamaModelCuda: embedding gather");
}

void embed_gather_shard(const uint16_t* embed, int32_t vocab0, int32_t vocab_rows,
                        const int32_t* tokens, int32_t num_tokens, int32_t hidden, float* x,
                        cudaStream_t stream) {
  if (num_tokens == 0) return;
  check_cuda(launch_pdl(embed_gather_shard_kernel, dim3(num_tokens), dim3(256), 0, stream, embed,
                        vocab0, vocab_rows, tokens, hidden, x),
             "LlamaModelCuda: embedding gather (vocabulary shard)");
}

void rms_norm_bf16(const float* x, const float* weight, const int32_t* rows, int32_t num_rows,
                   int32_t hidden, float eps, uint16_t* out, cudaStream_t stream) {
  if (num_rows == 0) return;
  check_cuda(launch_pdl(rms_norm_kernel, dim3(num_rows), dim3(kNormThreads), 0, stream, x, weight,
                        rows, hidden, eps, out),
             "LlamaModelCuda: rms_norm");
}

void qkv_post(const float* qkv, const float* bias, const float* q_norm, const float* k_norm,
              const float* rope_cos, const float* rope_sin, const QkvParams& p, uint16_t* q,
              uint16_t* k, uint16_t* v, cudaStream_t stream) {
  PA_CHECK(p.head_dim % 64 == 0 && p.head_dim <= 512,
           "LlamaModelCuda: head_dim must be a multiple of 64 up to 512, got ", p.head_dim);
  if (p.num_tokens == 0) return;
  const dim3 grid(unsigned(p.num_tokens), unsigned(p.num_q_heads + 2 * p.num_kv_heads));
  check_cuda(launch_pdl(qkv_post_kernel, grid, dim3(unsigned(p.head_dim / 2)), 0, stream, qkv,
                        bias, q_norm, k_norm, rope_cos, rope_sin, p, q, k, v),
             "LlamaModelCuda: qkv bias / norm / rope");
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
  check_cuda(launch_pdl(argmax_combine_kernel, dim3((rows + 127) / 128), dim3(128), 0, stream,
                        pairs, world, rows, ids),
             "LlamaModelCuda: argmax of the slices");
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
