// The fused element-wise kernels of LlamaModelCuda (everything but the matrix products and
// attention). Host launchers; each checks its launch and throws Error on failure. Asynchronous on
// `stream`. bf16 values are raw uint16_t bits. Compiled as C++17 (nvcc), so no C++20 headers here.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagedattn::cuda {

// The step's RoPE rows, copied by the embedding kernels from the tables (rope_table) by position:
// qkv_post then reads a token's rows by its index, with its other inputs, instead of reading the
// position and then the rows (two dependent loads after its wait, on every layer's path). Null
// cos: no rows.
//   cos_table, sin_table [table rows, half];  positions [num_tokens];  cos, sin [num_tokens, half]
struct RopeRowsGather {
  const float* cos_table = nullptr;
  const float* sin_table = nullptr;
  const int32_t* positions = nullptr;
  int32_t half = 0;
  float* cos = nullptr;
  float* sin = nullptr;
};

// x[t] = embed[tokens[t]] as fp32 (and the tokens' RoPE rows, when rope.cos is set). A token
// -(r + 1) is chained_ids[r] (a greedy pass begun before this one picked it: Model::begin_greedy).
//   embed  [vocab, hidden] bf16;  tokens [num_tokens];  x [num_tokens, hidden] f32
void embed_gather(const uint16_t* embed, const int32_t* tokens, const int32_t* chained_ids,
                  int32_t num_tokens, int32_t hidden, float* x, const RopeRowsGather& rope,
                  cudaStream_t stream);
// A vocabulary shard's part of it (tensor parallelism): x[t] = embed[tokens[t] - vocab0] when
// vocab0 <= tokens[t] < vocab0 + vocab_rows, else zeros (another rank holds that row; the ranks'
// x are summed after). The RoPE rows of every token. Stand-ins as embed_gather's.
//   embed  [vocab_rows, hidden] bf16;  tokens [num_tokens];  x [num_tokens, hidden] f32
void embed_gather_shard(const uint16_t* embed, int32_t vocab0, int32_t vocab_rows,
                        const int32_t* tokens, const int32_t* chained_ids, int32_t num_tokens,
                        int32_t hidden, float* x, const RopeRowsGather& rope,
                        cudaStream_t stream);

// out[r] = rms_norm(x[rows ? rows[r] : r]) * weight, fp32 math, bf16 out.
//   x [*, hidden] f32;  weight [hidden] f32;  rows [num_rows] or null;  out [num_rows, hidden] bf16
void rms_norm_bf16(const float* x, const float* weight, const int32_t* rows, int32_t num_rows,
                   int32_t hidden, float eps, uint16_t* out, cudaStream_t stream);

// From the fused projection qkv [num_tokens, (Hq + 2 Hkv) * D] f32: adds the bias (when given),
// applies the per-head RMSNorm to q and k (when q_norm is given), rotates q and k (HF rotate_half
// with the cos/sin tables) and stores q [T, Hq, D], k, v [T, Hkv, D] as bf16 -- or, when k_pool
// is set, k and v straight into their slots of the page pools, bf16 or fp8 e4m3 (what
// write_kv_cuda would store from the bf16 k and v, bit for bit: fp8 as e4m3(bf16(x) * (1 / scale))
// with the head's scale; one launch fewer; a slot outside the pools is skipped, as write_kv skips
// it).
//   bias [(Hq + 2 Hkv) * D] f32 or null;  q_norm, k_norm [D] f32 or null
//   rope_cos, rope_sin [num_tokens, D / 2] f32 (each token's rows: RopeRowsGather)
//   k_pool, v_pool [num_pages, Hkv, page_size, D] bf16 or e4m3 (PagedKVView's layout);  slots [T]
//   k_scale, v_scale [Hkv] f32 (fp8 pools)
struct QkvParams {
  int32_t num_tokens = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0;
  float eps = 1e-5f;
  void* k_pool = nullptr;  // null: k and v go to the k and v arguments
  void* v_pool = nullptr;
  bool fp8 = false;  // the pools hold e4m3 values, scaled by k_scale and v_scale
  const float* k_scale = nullptr;
  const float* v_scale = nullptr;
  const int32_t* slots = nullptr;
  int32_t page_size = 0, num_pages = 0;
  // qkv's rows of each head in interleave_rope_rows' order (the product of weights in that
  // order): element 2 j + e of a head is element j + e D / 2 of the head.
  bool interleaved = false;
};
void qkv_post(const float* qkv, const float* bias, const float* q_norm, const float* k_norm,
              const float* rope_cos, const float* rope_sin, const QkvParams& p, uint16_t* q,
              uint16_t* k, uint16_t* v, cudaStream_t stream);

// The rows of a projection of heads of head_dim rows (q, k and v stacked) in the order whose
// groups of 4 rows hold two whole RoPE pairs: row 2 j + e of each head of dst is row
// j + e head_dim / 2 of that head of src (e = 0, 1), so that the qkv product's epilogue finds both
// halves of a rotation among its own rows (wgmma_gemm_qkv). src, dst [rows, cols] bf16, distinct;
// rows a multiple of head_dim (even), at most 65535. Throws Error otherwise.
void interleave_rope_rows(const uint16_t* src, uint16_t* dst, int64_t rows, int64_t cols,
                          int32_t head_dim, cudaStream_t stream);

// The RoPE tables of positions [0, rows), computed on the device as rope_tables (rope.h) computes
// them (the angle and its cos and sin in double precision, times scale, rounded to f32).
//   inv_freq [half] f64;  cos, sin [rows, half] f32
void rope_table(const double* inv_freq, int32_t half, int32_t rows, float* cos, float* sin,
                cudaStream_t stream, double scale = 1.0);

// a[t, j] = silu(gu[t, j]) * gu[t, inter + j], fp32 math, bf16 out (the projections' outputs are
// bf16, as in the Hugging Face bf16 models: half the bytes of f32 for this memory-bound pass).
//   gu [num_tokens, 2 * inter] bf16;  a [num_tokens, inter] bf16
void swiglu(const uint16_t* gu, int32_t num_tokens, int32_t inter, uint16_t* a,
            cudaStream_t stream);

// ids[r] = the argmax of row r, with the host rule of sampling.h's argmax: the lowest index holding
// the largest value; NaNs never win, except that a NaN x[r, 0] gives 0 (as does vocab 0). One block
// per row; the result does not depend on the launch (deterministic).
//   x [rows, vocab] f32;  ids [rows] int32
void argmax_rows(const float* x, int32_t rows, int32_t vocab, int32_t* ids, cudaStream_t stream);

// The same argmax split over the vocabulary's slices (tensor-parallel ranks): pairs[r] = the
// largest value of row r of one slice x [rows, width] (row stride `stride`) and vocab0 plus its
// lowest index, or (-inf, INT32_MAX) when the slice holds only NaNs; the slice that starts at id 0
// carries argmax_rows's rule for a NaN x[r, 0] as (NaN, 0). argmax_combine folds the slices' pairs
// [world, rows] (any order of slices; the one at id 0 first) into ids [rows]: the ids argmax_rows
// gives over whole rows, bit for bit.
struct ArgmaxPair {
  float value;
  int32_t index;
};
void argmax_rows_slice(const float* x, int32_t rows, int32_t width, int64_t stride, int32_t vocab0,
                       ArgmaxPair* pairs, cudaStream_t stream);
void argmax_combine(const ArgmaxPair* pairs, int32_t world, int32_t rows, int32_t* ids,
                    cudaStream_t stream);
// The same fold of pairs laid out [rows, world] (each row's slices side by side).
void argmax_combine_by_row(const ArgmaxPair* pairs, int32_t world, int32_t rows, int32_t* ids,
                           cudaStream_t stream);
// The same fold of one slice's blocks (indices from the slice's start) into the slice's pair of
// each row, as argmax_rows_slice writes it: out[r] = (value, vocab0 + index), (-inf, INT32_MAX)
// for blocks of NaNs only, (NaN, 0) where the first block says a NaN output 0 takes the row.
void argmax_combine_by_row_pairs(const ArgmaxPair* pairs, int32_t world, int32_t rows,
                                 int32_t vocab0, ArgmaxPair* out, cudaStream_t stream);

// dst[i] = bf16(src[i]) for n values (weights at load).
void f32_to_bf16_device(const float* src, int64_t n, uint16_t* dst, cudaStream_t stream);

// Synthetic weights (synthetic_fill.h): dst[i] = synthetic::value(key, i, center, half_width)
// for n values, as bf16 (round to nearest even) or f32.
//   dst [n]
void fill_synthetic_bf16(uint16_t* dst, int64_t n, uint64_t key, float center, float half_width,
                         cudaStream_t stream);
void fill_synthetic_f32(float* dst, int64_t n, uint64_t key, float center, float half_width,
                        cudaStream_t stream);
// A block of a synthetic matrix (a tensor-parallel shard): dst[r, c] = value(key, offset + r * ld +
// c) for r < rows, c < cols, as bf16 or f32. offset = row0 * ld + col0 picks the block.
//   dst [rows, cols]
void fill_synthetic_block_bf16(uint16_t* dst, int64_t rows, int64_t cols, int64_t ld,
                               int64_t offset, uint64_t key, float center, float half_width,
                               cudaStream_t stream);
void fill_synthetic_block_f32(float* dst, int64_t rows, int64_t cols, int64_t ld, int64_t offset,
                              uint64_t key, float center, float half_width, cudaStream_t stream);

}  // namespace pagedattn::cuda
