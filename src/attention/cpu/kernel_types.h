// The fused CPU attention kernel's plan and parameters, shared by its ISA variants.
//
// A call is planned into work items (sequence, KV head, block of query rows); each item is run by
// one thread and walks its sequence's keys in tiles of up to kTile tokens with online softmax. The
// same body reads K/V from the paged pools (through the block table) or, for the no-paging
// baseline of the benchmark, from a dense [num_seqs][num_kv_heads][max_len][head_dim] buffer.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/dtype.h"

namespace pagedattn {
enum class CpuIsa : uint8_t;
}

namespace pagedattn::cpu {

constexpr int kTile = 64;   // keys per tile
constexpr int kLanes = 16;  // accumulator width of the inner loops; rows are padded to it
// Items with at least this many query vectors compute logits from a transposed K tile (a
// broadcast-FMA over the tile's keys, no horizontal sums); fewer use one dot product per key.
constexpr int kTransposeMinVectors = 16;
// Keys per softmax chunk, a multiple of kTile. Every query vector runs its online softmax over the
// chunks [c * kChunk, (c + 1) * kChunk) of absolute positions separately and folds the chunk
// states in order of c (merge_state). NOTE: the chunks are fixed by position, so a decode item
// may be split into one part per chunk, run on several threads and folded afterwards, with the
// same result bit for bit as one thread walking all chunks: the result depends neither on the
// thread count nor on how the batch was planned.
constexpr int kChunk = 256;

// Where K/V rows come from.
struct KvSource {
  const void* k = nullptr;  // paged: [num_pages][num_kv_heads][page_size][head_dim]
  const void* v = nullptr;  // dense: [num_seqs][num_kv_heads][dense_max_len][head_dim]
  DType dtype = DType::f32;
  int32_t num_kv_heads = 0;
  // Paged (block_table != nullptr).
  const int32_t* block_table = nullptr;  // [num_seqs][max_pages_per_seq]
  int32_t max_pages_per_seq = 0;
  int32_t page_size = 1;
  // Dense (block_table == nullptr).
  int32_t dense_max_len = 0;
};

struct KernelParams {
  const void* q = nullptr;  // [num_tokens, num_q_heads, head_dim]
  DType q_dtype = DType::f32;
  void* out = nullptr;  // [num_tokens, num_q_heads, head_dim]
  DType out_dtype = DType::f32;
  int32_t num_q_heads = 0;
  int32_t group = 1;  // num_q_heads / num_kv_heads
  int32_t head_dim = 0;
  float scale = 1.f;  // effective softmax scale
  float softcap = 0.f;
  int32_t window = 0;
  bool causal = true;
  const int32_t* q_indptr = nullptr;  // [num_seqs + 1]
  const int32_t* kv_len = nullptr;    // [num_seqs]
  const float* k_scale = nullptr;     // [num_kv_heads], fp8 only
  const float* v_scale = nullptr;     // [num_kv_heads], fp8 only
  KvSource kv;
};

// Query rows [row_begin, row_end) of sequence seq (relative to its first query), all query heads
// of KV head kv_head.
struct WorkItem {
  int32_t seq = 0;
  int32_t kv_head = 0;
  int32_t row_begin = 0;
  int32_t row_end = 0;
  // A part of a split item (chunk >= 0): only the keys of chunk `chunk`, and the chunk's raw
  // softmax state goes to the call's workspace at float offset `state` instead of to `out`.
  int32_t chunk = -1;
  int64_t state = 0;
};

// An item split into parts for chunks first_chunk .. first_chunk + num_chunks - 1, whose raw
// states lie one after another in the workspace from float offset `state`.
struct SplitItem {
  WorkItem whole;
  int32_t first_chunk = 0;
  int32_t num_chunks = 0;
  int64_t state = 0;
};

// Raw softmax state of M query vectors in a workspace: [M][Dp] o, then [M] m, then [M] l.
inline int64_t state_floats(int32_t M, int32_t Dp) { return int64_t(M) * (Dp + 2); }

// Folds the chunk state (m2, l2, o2) into the running state (m, l, o); o rows of dp floats. An
// empty state (m = -inf, l = 0, o = 0) on either side is taken over exactly. Out of line and
// compiled once for every ISA, so the in-item fold and the fold of split parts are the same
// arithmetic.
void merge_state(float& m, float& l, float* o, float m2, float l2, const float* o2, int dp);

// Per-thread buffers, grown on demand and reused across items and calls.
struct Scratch {
  std::vector<float> q;           // [M][Dp] queries of the item, scaled
  std::vector<float> o;           // [M][Dp] running output
  std::vector<float> k, v;        // [kTile][Dp] a tile of K/V dequantised to f32
  std::vector<float> kt;          // [Dp][kTile] the K tile transposed (many query vectors)
  std::vector<float> s;           // [M][kTile] logits, then weights
  std::vector<float> m, l;        // [M] running max and sum of the current chunk
  std::vector<float> fo, fm, fl;  // [M][Dp], [M], [M]: the chunks folded so far
};

using ItemFn = void (*)(const KernelParams&, const WorkItem&, Scratch&, float* workspace);

// The instantiation for the parameters' KV dtype and head dim, per ISA. The avx2/avx512 versions
// return nullptr when they were not compiled in.
ItemFn select_item_fn_generic(const KernelParams& p);
ItemFn select_item_fn_avx2(const KernelParams& p);
ItemFn select_item_fn_avx512(const KernelParams& p);

// The items of a call: every (sequence, KV head, block of query rows), longest work first; when
// they are fewer than the pool needs, items of several chunks are split into one part per chunk.
struct Plan {
  std::vector<WorkItem> items;
  std::vector<SplitItem> split;
  int64_t workspace = 0;  // floats of raw states
};
Plan plan_items(const KernelParams& p, int32_t num_seqs, int32_t num_kv_heads);
// Runs the planned items on the thread pool with the given kernel variant (best: the widest this
// CPU supports; PAGEDATTN_CPU_ISA=generic|avx2 caps it), then folds the split ones.
void run_items(const KernelParams& p, const Plan& plan, CpuIsa isa);
// Writes out = o / l (times the V scale for fp8) for the M vectors of item it; a vector that saw
// no key gets zeros.
void write_output(const KernelParams& p, const WorkItem& it, const float* o, const float* l,
                  int32_t Dp);

// fp8 e4m3 byte -> f32 (unscaled), all 256 values.
const float* fp8_table();

// Branch-free f16 -> f32 (vectorisable; bit-identical to f16_to_f32).
inline float f16_to_f32_fast(uint16_t h) {
  const uint32_t sign = uint32_t(h & 0x8000u) << 16;
  uint32_t o = uint32_t(h & 0x7fffu) << 13;
  const uint32_t exp = o & 0x0f800000u;
  o += (127u - 15u) << 23;
  o += exp == 0x0f800000u ? (128u - 16u) << 23 : 0u;  // inf / NaN: exponent to 255
  o += exp == 0 ? 1u << 23 : 0u;                      // zero / subnormal: renormalise below
  float f = bits_f32(o);
  f = exp == 0 ? f - 6.103515625e-05f : f;  // minus 2^-14
  return bits_f32(f32_bits(f) | sign);
}

}  // namespace pagedattn::cpu
