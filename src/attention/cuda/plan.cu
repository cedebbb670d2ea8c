// Plan, then run: the step's batch metadata and work lists built once on the host, uploaded into a
// fixed device workspace, and reused by every layer's paged_attention_cuda call.
#include <algorithm>
#include <climits>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "cuda_common.cuh"
#include "kernels.h"
#include "pagedattn/attention_cuda.h"

namespace pagedattn {

using cuda::check_cuda;

struct CudaAttentionPlan::Impl {
  CudaPlanOptions opts;
  int sm_count = 0;
  int l2_bytes = 0;
  uint8_t* ws = nullptr;  // device workspace
  size_t ws_bytes = 0;
  std::vector<uint8_t> host;  // staging for the metadata upload
  bool planned = false;
  // What was planned (run() checks its arguments against these).
  int32_t num_tokens = 0, num_q_heads = 0, num_kv_heads = 0, head_dim = 0, page_size = 0;
  int32_t num_pages = 0;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16;
  cuda::AttentionParams params;  // device metadata pointers; data pointers are set by run()
};

std::string CudaAttentionPlan::launch_signature() const {
  const Impl& im = *impl_;
  const int32_t fixed[] = {im.num_tokens,       im.num_q_heads,      im.num_kv_heads,
                           im.head_dim,         im.page_size,        im.num_pages,
                           int32_t(im.q_dtype), int32_t(im.kv_dtype)};
  std::string sig(reinterpret_cast<const char*>(fixed), sizeof(fixed));
  sig.append(reinterpret_cast<const char*>(&im.params), sizeof(im.params));
  return sig;
}

namespace {

// An attribute of the current device; 0 where there is none (no driver, no device).
int current_device_attribute(cudaDeviceAttr attr) {
  int dev = 0, n = 0;
  if (cudaGetDevice(&dev) != cudaSuccess || cudaDeviceGetAttribute(&n, attr, dev) != cudaSuccess) {
    (void)cudaGetLastError();
    return 0;
  }
  return n;
}

}  // namespace

int cuda_sm_count() { return current_device_attribute(cudaDevAttrMultiProcessorCount); }

namespace {

// The Hopper kernel's CTAs where the options leave them to the plan (-1): one per SM, or
// PAGEDATTN_HOPPER_CTAS when set to a count >= 0 (0: one CTA per work; a comparison switch).
int32_t hopper_ctas(int32_t asked, int sm_count) {
  static const int32_t from_env = [] {
    const char* e = std::getenv("PAGEDATTN_HOPPER_CTAS");
    if (!e || !*e) return -1;
    char* end = nullptr;
    const long v = std::strtol(e, &end, 10);
    return *end == '\0' && v >= 0 && v <= INT32_MAX ? int32_t(v) : -1;
  }();
  if (asked >= 0) return asked;
  return from_env >= 0 ? from_env : sm_count;
}

}  // namespace

CudaAttentionPlan::CudaAttentionPlan(size_t workspace_bytes, CudaPlanOptions opts)
    : impl_(std::make_unique<Impl>()) {
  PA_CHECK(workspace_bytes >= (size_t(1) << 16),
           "CudaAttentionPlan: workspace_bytes must be >= 64 KiB, got ", workspace_bytes);
  PA_CHECK(opts.target_ctas_per_sm >= -1 && opts.chunks_per_cta >= 0,
           "CudaAttentionPlan: opts.target_ctas_per_sm must be >= -1 and opts.chunks_per_cta >= 0");
  PA_CHECK(opts.tensor_core_decode_min_group >= 1,
           "CudaAttentionPlan: opts.tensor_core_decode_min_group must be >= 1, got ",
           opts.tensor_core_decode_min_group);
  PA_CHECK(opts.decode_chunk_tokens >= 0 && opts.decode_chunk_tokens % 64 == 0 &&
               opts.decode_chunk_tokens <= (1 << 24),
           "CudaAttentionPlan: opts.decode_chunk_tokens must be 0 or a positive multiple of 64 up "
           "to 2^24, got ",
           opts.decode_chunk_tokens);
  PA_CHECK(opts.hopper_ctas >= -1, "CudaAttentionPlan: opts.hopper_ctas must be >= -1, got ",
           opts.hopper_ctas);
  PA_CHECK(opts.hopper_head_section == -1 || opts.hopper_head_section >= 1,
           "CudaAttentionPlan: opts.hopper_head_section must be -1 or >= 1, got ",
           opts.hopper_head_section);
  impl_->opts = opts;
  impl_->sm_count = cuda_sm_count();
  PA_CHECK(impl_->sm_count > 0, "CudaAttentionPlan: no CUDA device is available");
  impl_->l2_bytes = current_device_attribute(cudaDevAttrL2CacheSize);
  check_cuda(cudaMalloc(&impl_->ws, workspace_bytes),
             "CudaAttentionPlan: cudaMalloc of the workspace");
  impl_->ws_bytes = workspace_bytes;
}

CudaAttentionPlan::~CudaAttentionPlan() {
  if (impl_ && impl_->ws) (void)cudaFree(impl_->ws);
}

namespace {

constexpr size_t kAlign = 256;
size_t align_up(size_t n) { return (n + kAlign - 1) / kAlign * kAlign; }

// Appends n elements to the staging buffer at an aligned offset; returns that offset.
template <class T>
size_t stage(std::vector<uint8_t>& host, const T* src, size_t n) {
  const size_t off = align_up(host.size());
  host.resize(off + n * sizeof(T));
  if (n) std::memcpy(host.data() + off, src, n * sizeof(T));
  return off;
}

// The staged block table's row stride: the batch's max_pages_per_seq rounded up to a multiple of
// 64 pages, or of an eighth of the largest power of two below it past 512 (at most 12.5% more
// bytes), so that a batch whose sequences grow keeps its launches' arguments, and the model's CUDA
// graph of them, for 64 pages (1024 positions at page 16) or more at a time.
// NOTE: with the batch's own maximum, every new page changed them: a decode step ran its launches
// directly, the next captured a graph again (host time, the GPU idle: Llama-3-8B at batch 64 on an
// H100 spent about a third of its host time a step there).
int32_t table_stride(int32_t m) {
  int32_t q = 64;
  if (m > 512) {
    int32_t p = 512;
    while (p * 2 <= m) p *= 2;  // the largest power of two <= m
    q = p / 8;
  }
  return int32_t((int64_t(m) + q - 1) / q * q);
}

// Stages [n, stride] of the batch's [n, max_pages_per_seq] block table (zeros past each row).
size_t stage_table(std::vector<uint8_t>& host, const BatchLayout& batch, int32_t stride) {
  const size_t off = align_up(host.size());
  const size_t n = size_t(batch.num_seqs), m = size_t(batch.max_pages_per_seq);
  host.resize(off + n * size_t(stride) * sizeof(int32_t));  // value-initialized: zeros
  auto* dst = reinterpret_cast<int32_t*>(host.data() + off);
  for (size_t s = 0; s < n; ++s)
    if (m) std::memcpy(dst + s * size_t(stride), batch.block_table + s * m, m * sizeof(int32_t));
  return off;
}

// One query row of the decode kernel before split-KV: its keys [lo, hi), in decode chunks
// [chunk_lo, chunk_hi) of chunk_tokens positions. split_decode_rows turns each into one or more
// cuda::DecodeItem, the kernels' per-CTA work (a row's whole range, or one slice of its chunks
// plus where its partial result goes to be merged).
struct DecodeQueryRow {
  int32_t seq, q_row, lo, hi, chunk_lo, chunk_hi, chunk_tokens;
};

// Chunks of `c` positions that hold positions [lo, hi).
int64_t chunks_spanned(int32_t lo, int32_t hi, int64_t c) {
  return lo < hi ? (int64_t(hi) + c - 1) / c - lo / c : 0;
}

// A row's chunk size (CudaPlanOptions::decode_chunk_tokens): fixed (> 0); where `short_rows` (the
// CUDA-core kernel at head dim 128, 16-bit K/V), kDecodeShortChunkTokens for a row within
// kDecodeShortRowChunks of them; else kDecodeChunkTokens doubled while the row spans more than
// max_chunks chunks (up to 2^20 positions). It depends on the row's own positions and the model's
// shape only, so the row's output does not depend on the batch.
// NOTE: every chunk ends with a combine of the CTA's warp states, and each chunk of a split row
// is one partial state for its merging CTA to read and fold: a row of 32768 positions in 256-
// position chunks left 128 partials, 17 us of merge at batch 1 on an H100. Measured there (one
// call, alternating): at most 16 chunks a row against 32, batch 1 / 8 KV heads / context 8192
// 21.2 against 21.8 us, batch 8 102.2 against 105.1; but fp8 pools on the tensor-core kernel (a
// 48 KiB copy pipeline a CTA, 4 CTAs an SM) at batch 1, context 32768, 51.0 against 44.4 (128
// CTAs do not keep the memory busy), so those keep 32.
// NOTE: short rows on the CUDA-core kernel (group 1, 32 KV heads, H100, three rounds in one call):
// 128-position chunks give twice the CTAs where the grid is split, batch 1 at context 512
// 14.7-14.8 -> 11.0-11.2 us, at 1024 15.0-15.1 -> 13.5-13.6; but the unsplit grids pay the extra
// chunk ends, batch 8 / 512 28.0-28.3 -> 28.2-28.6, batch 64 / 1024 372.2-372.9 -> 374.4-375.1.
// Taken where that cost stays under 1%: head dim 128 with 16-bit K/V. Head dim 64 (batch 8 / 512
// 18.0-18.3 -> 18.8-19.1), fp8 (batch 8 / 512 +7%) and head dim 256 keep 256. The tensor-core
// kernel's chunk ends cost more (a pipeline stage holds the combine): batch 64 / 512 with 8 KV
// heads 55.1 -> 57.1-57.6, so it keeps 256.
int32_t row_chunk_tokens(int32_t lo, int32_t hi, int32_t fixed, int32_t max_chunks,
                         bool short_rows) {
  if (fixed > 0) return fixed;
  if (short_rows && chunks_spanned(lo, hi, kDecodeShortChunkTokens) <= kDecodeShortRowChunks)
    return kDecodeShortChunkTokens;
  int64_t c = kDecodeChunkTokens;
  while (chunks_spanned(lo, hi, c) > max_chunks && c < (1 << 20)) c *= 2;
  return int32_t(c);
}

// The decode rows of every single-query sequence (and of every sequence without the prefill
// kernels), and the prefill tiles of the rest (heaviest first).
void list_work(const BatchLayout& batch, const AttentionOptions& opt, int32_t group,
               bool use_prefill, int32_t fixed_chunk, int32_t max_chunks, bool short_rows,
               std::vector<DecodeQueryRow>& rows, std::vector<cuda::PrefillItem>& prefill) {
  for (int32_t b = 0; b < batch.num_seqs; ++b) {
    const int32_t q0 = batch.q_indptr[b], qlen = batch.q_indptr[b + 1] - q0, L = batch.kv_len[b];
    if (qlen == 0) continue;
    if (qlen > 1 && use_prefill) {
      for (int32_t r = 0; r < qlen * group; r += cuda::kPrefillRows) prefill.push_back({b, r});
      continue;
    }
    for (int32_t j = 0; j < qlen; ++j) {
      const int32_t pos = L - qlen + j;
      const int32_t hi = opt.causal ? pos + 1 : L;
      const int32_t lo = opt.window > 0 ? std::max(0, pos - opt.window + 1) : 0;
      const int32_t c = row_chunk_tokens(lo, hi, fixed_chunk, max_chunks, short_rows);
      // The kernels compute a chunk's end, (chunk + 1) * c, in 32 bits.
      PA_CHECK(int64_t(hi) + c <= INT32_MAX, "paged_attention_cuda: kv_len[", b, "] = ", L,
               " is too long for the decode kernels' 32-bit positions");
      DecodeQueryRow row{b, q0 + j, lo, hi, 0, 0, c};
      if (lo < hi) {
        row.chunk_lo = lo / c;
        row.chunk_hi = int32_t((int64_t(hi) + c - 1) / c);
      }
      rows.push_back(row);
    }
  }
  // Heaviest prefill tiles first (the last rows of causal prompts see the most keys), so that the
  // short ones fill the tail of the grid; weighed in whole 128-key tiles, so that the tiles of a
  // sequence that see the same number of key tiles stay together (the sort is stable) and run at
  // once, reading that sequence's K/V while it is in L2.
  // NOTE: weighed in keys, the four tiles of 128 queries at the end of 512-1024 positions went
  // out a whole batch apart, and a batch of 132-264 such chunks read its K/V from memory four
  // times over (3.4-3.7 us a tile of 128 keys against 2.0 at 4096 positions, H100).
  auto tile_keys = [&](const cuda::PrefillItem& t) {
    const int32_t qlen = batch.q_indptr[t.seq + 1] - batch.q_indptr[t.seq];
    const int32_t last = std::min(t.row_begin + cuda::kPrefillRows, qlen * group) - 1;
    const int32_t keys =
        opt.causal ? batch.kv_len[t.seq] - qlen + last / group + 1 : batch.kv_len[t.seq];
    return (keys + 127) / 128;
  };
  std::stable_sort(prefill.begin(), prefill.end(),
                   [&](const cuda::PrefillItem& a, const cuda::PrefillItem& b) {
                     return tile_keys(a) > tile_keys(b);
                   });
}

// KV heads per section of the Hopper kernel's work order: as many as keep the K and V of the
// prefill sequences within about 60% of the L2 (forced > 0: that many), at least 1.
// NOTE: concurrent CTAs of a section read the same heads' K/V from position 0 up (every tile of
// causal rows sees the keys before it), so the section's K/V is the L2's working set.
int32_t hopper_head_section(const BatchLayout& batch, const std::vector<cuda::PrefillItem>& prefill,
                            int32_t num_kv_heads, int32_t head_dim, size_t elt, int l2_bytes,
                            int32_t forced) {
  if (forced > 0) return std::min(forced, std::max(num_kv_heads, 1));
  int64_t keys = 0;
  std::vector<bool> seen(size_t(batch.num_seqs), false);
  for (const cuda::PrefillItem& t : prefill) {
    if (seen[size_t(t.seq)]) continue;
    seen[size_t(t.seq)] = true;
    keys += batch.kv_len[t.seq];
  }
  const int64_t per_head = std::max<int64_t>(keys * head_dim * 2 * int64_t(elt), 1);
  const int64_t fit = int64_t(l2_bytes) * 6 / 10 / per_head;
  return int32_t(std::clamp<int64_t>(fit, 1, std::max(num_kv_heads, 1)));
}

// The longest rows a grid of at least 7/8 of the SMs still splits (choose_chunks_per_cta).
constexpr int32_t kSplitNearFullPositions = 2048;

// Positions of one unit of the split-KV choice (a CTA's slice is a whole number of its row's
// chunks, at least one, and about k of these units).
constexpr int64_t kSliceUnit = 64;

// A row's own chunks per CTA under a split of k kSliceUnit units per CTA (at least one).
int64_t row_slice(const DecodeQueryRow& r, int64_t k) {
  return k == INT_MAX ? INT_MAX : std::max<int64_t>(1, k * kSliceUnit / r.chunk_tokens);
}

// The split-KV choice: how many kSliceUnit units of positions one CTA takes (INT_MAX: no row is
// split). A grid that already covers every SM is not split; a smaller one is split into the
// smallest slices whose grid has at most `target` CTAs (each row's slice is a whole number of its
// own chunks, so the count is not simply the units over the slice).
//   base_ctas: CTAs without splitting; ctas_per_row: KV heads x head tiles; forced: the slice in
//   kDecodeChunkTokens positions (CudaPlanOptions::chunks_per_cta), 0 for the choice.
int64_t choose_chunks_per_cta(const std::vector<DecodeQueryRow>& rows, int64_t ctas_per_row,
                              int64_t base_ctas, int32_t sm_count, int64_t target,
                              int32_t forced, bool whole_near_full) {
  if (forced > 0) return int64_t(forced) * (kDecodeChunkTokens / kSliceUnit);
  // NOTE: measured on an H100: splitting a grid that already covers every SM once lost 5-15%
  // (the merge pass and the tail), while a grid smaller than the SM count gains up to 12x. Where
  // `whole_near_full` (the tensor-core kernel on 16-bit pools: one CTA keeps enough copies in
  // flight), a grid of at least 7/8 of the SMs is not split either: 16 rows of 8 KV heads (128
  // CTAs on 132 SMs, head dim 128) ran 2.6-2.7% faster whole than in 256 halves at 8192 and 32768
  // positions, 15 rows 3.4-4.0% (level at 2048 and 512 within the runs' spread), while 12 rows
  // (96 CTAs) still gain 1.6% from the split. fp8 pools, bound by their conversions, ran 1.4-1.6x
  // (head dim 128) and 1.05-1.26x (256) slower whole.
  // NOTE: rows of at most kSplitNearFullPositions are split all the same: a tensor-parallel
  // rank's batch 32 (4 KV heads: 128 CTAs) at 528 positions, one CTA an SM, ran its step 0.5%
  // shorter split, 3.894-3.897 against 3.915-3.917 ms on two H100s (docs/BENCHMARKS.md, "Tensor
  // parallelism: the step's tail"); 16 rows of 8 KV heads ran level at 512 and 2048.
  // PAGEDATTN_DECODE_SPLIT_NEAR_FULL=0: whole at any length (a comparison).
  static const bool split_short = [] {
    const char* e = std::getenv("PAGEDATTN_DECODE_SPLIT_NEAR_FULL");
    return !(e && std::string(e) == "0");
  }();
  int32_t longest = 0;
  for (const DecodeQueryRow& r : rows) longest = std::max(longest, r.hi - r.lo);
  const bool whole = whole_near_full && base_ctas * 8 >= int64_t(sm_count) * 7 &&
                     !(split_short && longest <= kSplitNearFullPositions);
  if (target <= 0 || base_ctas >= sm_count || whole) return INT_MAX;
  auto ctas = [&](int64_t k) {
    int64_t n = 0;
    for (const DecodeQueryRow& r : rows)
      n += std::max<int64_t>(1, (r.chunk_hi - r.chunk_lo + row_slice(r, k) - 1) / row_slice(r, k));
    return n * ctas_per_row;
  };
  int64_t lo = 1, hi = 1;  // hi: a slice that takes every row whole (base_ctas < target CTAs)
  for (const DecodeQueryRow& r : rows)
    hi = std::max<int64_t>(hi, int64_t(r.chunk_hi - r.chunk_lo) * r.chunk_tokens / kSliceUnit);
  while (lo < hi) {
    const int64_t mid = lo + (hi - lo) / 2;
    if (ctas(mid) <= target)
      hi = mid;
    else
      lo = mid + 1;
  }
  return lo;
}

// Each row as one work item, or (more than chunks_per_cta kSliceUnit units of its
// positions) as one item per slice of its chunks plus a merge item that folds their partials.
// Returns the number of partial slots.
int32_t split_decode_rows(const std::vector<DecodeQueryRow>& rows, int64_t chunks_per_cta,
                          std::vector<cuda::DecodeItem>& items,
                          std::vector<cuda::MergeItem>& merges) {
  items.clear();
  merges.clear();
  int32_t partials = 0;
  for (const DecodeQueryRow& r : rows) {
    const int32_t nc = r.chunk_hi - r.chunk_lo;
    // The slice in the row's own chunks (at least one).
    const int64_t per_cta = row_slice(r, chunks_per_cta);
    if (nc <= per_cta) {
      items.push_back(
          {r.seq, r.q_row, r.lo, r.hi, r.chunk_lo, r.chunk_hi, -1, -1, r.chunk_tokens, {}, 0});
      continue;
    }
    const int32_t merge = int32_t(merges.size());
    int32_t ctas = 0;
    for (int32_t c = r.chunk_lo; c < r.chunk_hi; c += int32_t(per_cta), ++ctas) {
      const int32_t e = int32_t(std::min<int64_t>(r.chunk_hi, c + per_cta));
      items.push_back({r.seq, r.q_row, r.lo, r.hi, c, e, partials + (c - r.chunk_lo), merge,
                       r.chunk_tokens, {}, 0});
    }
    merges.push_back({r.q_row, partials, nc, ctas});
    partials += nc;
  }
  return partials;
}

// Fills each item's copy of its first block-table entries (DecodeItem::pages; -1 where `copy` is
// false or past the row's positions) and, where `early`, its cached positions' end (those before
// its sequence's new tokens: DecodeItem::cached_end).
void fill_item_pages(const BatchLayout& batch, int32_t page_size, bool copy, bool early,
                     std::vector<cuda::DecodeItem>& items) {
  for (cuda::DecodeItem& it : items) {
    const int32_t q_len = batch.q_indptr[it.seq + 1] - batch.q_indptr[it.seq];
    it.cached_end = early ? std::max(0, batch.kv_len[it.seq] - q_len) : 0;
    const int32_t first = std::max(it.chunk_begin * it.chunk_tokens, it.lo) / page_size;
    const int32_t end = (it.hi + page_size - 1) / page_size;  // pages holding positions < hi
    for (int32_t i = 0; i < cuda::kDecodeItemPages; ++i) {
      const int32_t pg = first + i;
      it.pages[i] =
          copy && pg < end ? batch.block_table[int64_t(it.seq) * batch.max_pages_per_seq + pg] : -1;
    }
  }
}

}  // namespace

void CudaAttentionPlan::plan(const QKVTensor& q, const PagedKVView& kv, const BatchLayout& batch,
                             const AttentionOptions& opt, const QKVTensor& out, void* stream) {
  Impl& im = *impl_;
  im.planned = false;
  validate_paged_attention(q, kv, batch, opt, out);
  PA_CHECK(q.dtype == DType::bf16 || q.dtype == DType::f16,
           "paged_attention_cuda: q.dtype must be bf16 or f16, got ", dtype_name(q.dtype));
  PA_CHECK(out.dtype == q.dtype, "paged_attention_cuda: out.dtype (", dtype_name(out.dtype),
           ") must equal q.dtype (", dtype_name(q.dtype), ")");
  PA_CHECK(kv.dtype == q.dtype || kv.dtype == DType::fp8_e4m3, "paged_attention_cuda: kv.dtype ",
           dtype_name(kv.dtype), " is not supported with q.dtype ", dtype_name(q.dtype),
           " (KV must be q's dtype or fp8_e4m3)");
  PA_CHECK(kv.head_dim == 64 || kv.head_dim == 128 || kv.head_dim == 256,
           "paged_attention_cuda: kv.head_dim ", kv.head_dim, " is not supported (64, 128 or 256)");

  const int32_t n = batch.num_seqs, D = kv.head_dim, Hq = q.num_heads, Hk = kv.num_kv_heads;
  const int32_t group = Hq / Hk;
  const bool fp8 = kv.dtype == DType::fp8_e4m3;
  // Prefill rows (q_len > 1) go to the Hopper kernel where it runs and takes the shape (fp8 pools
  // included), else to the mma.sync kernel where it takes the dtypes, else to the decode kernel.
  const bool gather = cuda::prefill_hopper_gathers(im.opts.hopper_gather, kv.page_size);
  const bool use_hopper =
      im.opts.tensor_core_prefill && im.opts.hopper_prefill &&
      cuda::prefill_hopper_supported(q.dtype, kv.dtype, D, group, kv.page_size, gather) &&
      cuda::prefill_hopper_available();
  const bool use_prefill =
      use_hopper || (im.opts.tensor_core_prefill && cuda::prefill_supported(q.dtype, kv.dtype, D));

  // ---- which decode kernel (from the model's shape) ----
  const int32_t tc_rows =
      group >= im.opts.tensor_core_decode_min_group ? cuda::decode_tc_rows(group, D) : 0;

  // ---- rows for the decode kernel, prefill tiles for the rest ----
  std::vector<DecodeQueryRow> rows;
  std::vector<cuda::PrefillItem> prefill;
  list_work(batch, opt, group, use_prefill, im.opts.decode_chunk_tokens,
            fp8 && tc_rows > 0 ? kDecodeMaxChunksFp8Tc : kDecodeMaxChunks,
            tc_rows == 0 && D == 128 && !fp8, rows, prefill);

  // ---- split-KV: chunks per CTA from the shape and the SM count ----
  const int32_t heads_per_cta = tc_rows > 0 ? tc_rows : cuda::decode_group_tile(group, fp8);
  const int64_t tiles = (group + heads_per_cta - 1) / heads_per_cta;
  const int64_t base_ctas = int64_t(rows.size()) * Hk * tiles;
  // NOTE: measured on an H100 with a target of 4 CTAs per SM where the tensor-core kernel fits 2:
  // two waves of short CTAs, batch 1 at context 32768 taking 100 us (44% of the copy).
  const int32_t per_sm = im.opts.target_ctas_per_sm >= 0
                             ? im.opts.target_ctas_per_sm
                             : cuda::decode_ctas_per_sm(q.dtype, kv.dtype, D, tc_rows,
                                                        cuda::decode_group_tile(group, fp8));
  const int64_t target = int64_t(im.sm_count) * per_sm;
  int64_t k = choose_chunks_per_cta(rows, Hk * tiles, base_ctas, im.sm_count, target,
                                    im.opts.chunks_per_cta, tc_rows > 0 && !fp8);

  // Metadata first, then as many partials as the rest of the workspace holds.
  std::vector<cuda::DecodeItem> items;
  std::vector<cuda::MergeItem> merges;
  // Partials: [partials, Hq, 2] (max, sum), then (aligned) [partials, Hq, D] outputs.
  const size_t partial_bytes = size_t(Hq) * (D + 2) * sizeof(float);
  const auto partials_size = [&](int32_t np) { return size_t(np) * partial_bytes + kAlign; };
  std::vector<uint8_t>& host = im.host;
  size_t o_qi, o_len, o_bt, o_items, o_merge, o_counters, o_prefill;
  int32_t partials = 0;
  std::vector<int32_t> counters;  // the fused merge's (zeroed) counts, uploaded with the rest
  const int32_t bt_stride = table_stride(batch.max_pages_per_seq);
  for (;;) {
    partials = split_decode_rows(rows, k, items, merges);
    fill_item_pages(batch, kv.page_size, im.opts.decode_item_pages,
                    im.opts.decode_early_cached_kv, items);
    // ... and the Hopper prefill kernel's two (its persistent grid's work counter).
    counters.assign(merges.size() * size_t(Hk * tiles) + 2, 0);
    host.clear();
    o_qi = stage(host, batch.q_indptr, size_t(n) + 1);
    o_len = stage(host, batch.kv_len, size_t(n));
    o_bt = stage_table(host, batch, bt_stride);
    o_items = stage(host, items.data(), items.size());
    o_merge = stage(host, merges.data(), merges.size());
    o_counters = stage(host, counters.data(), counters.size());
    o_prefill = stage(host, prefill.data(), prefill.size());
    const size_t meta = align_up(host.size());
    PA_CHECK(meta <= im.ws_bytes, "paged_attention_cuda: the batch metadata needs ", meta,
             " bytes but the plan's workspace has ", im.ws_bytes,
             " (construct CudaAttentionPlan with more)");
    if (meta + partials_size(partials) <= im.ws_bytes) break;
    PA_CHECK(k != INT_MAX && im.opts.chunks_per_cta == 0,
             "paged_attention_cuda: the split-KV partials need ", partials_size(partials),
             " bytes beyond the ", meta, " of metadata, but the workspace has ", im.ws_bytes,
             " (construct CudaAttentionPlan with more)");
    k = k * 2 >= 1 << 20 ? INT_MAX : k * 2;  // fewer splits until the partials fit
  }
  const size_t o_partial = align_up(host.size());
  check_cuda(cudaMemcpyAsync(im.ws, host.data(), host.size(), cudaMemcpyHostToDevice,
                             static_cast<cudaStream_t>(stream)),
             "paged_attention_cuda: metadata upload");

  // ---- remember what was planned ----
  cuda::AttentionParams& p = im.params;
  p = cuda::AttentionParams{};
  p.q_indptr = reinterpret_cast<const int32_t*>(im.ws + o_qi);
  p.kv_len = reinterpret_cast<const int32_t*>(im.ws + o_len);
  p.block_table = reinterpret_cast<const int32_t*>(im.ws + o_bt);
  p.max_pages_per_seq = bt_stride;  // the staged table's row stride
  p.num_q_heads = Hq;
  p.num_kv_heads = Hk;
  p.group = group;
  p.page_size = kv.page_size;
  p.page_stride = kv.page_stride();
  p.head_stride = kv.head_stride();
  p.scale = opt.scale != 0.f ? opt.scale : 1.f / std::sqrt(float(D));
  p.softcap = opt.softcap;
  p.window = opt.window;
  p.causal = opt.causal;
  p.decode_items = reinterpret_cast<const cuda::DecodeItem*>(im.ws + o_items);
  p.num_decode_items = int32_t(items.size());
  p.merge_items = reinterpret_cast<const cuda::MergeItem*>(im.ws + o_merge);
  p.num_merge_items = int32_t(merges.size());
  p.merge_counters = reinterpret_cast<int32_t*>(im.ws + o_counters);
  p.hopper_counters = p.merge_counters + merges.size() * size_t(Hk * tiles);
  p.decode_tc_rows = tc_rows;
  p.decode_trace = static_cast<uint64_t*>(im.opts.decode_trace);
  p.prefill_trace = static_cast<uint64_t*>(im.opts.prefill_trace);
  p.prefill_items = reinterpret_cast<const cuda::PrefillItem*>(im.ws + o_prefill);
  p.num_prefill_items = int32_t(prefill.size());
  p.prefill_kernel = !use_hopper                      ? cuda::kPrefillMma
                     : im.opts.hopper_prefill_overlap ? cuda::kPrefillWgmma
                                                      : cuda::kPrefillWgmmaSerial;
  p.hopper_gather = gather;
  p.hopper_head_section =
      hopper_head_section(batch, prefill, Hk, D, dtype_size(kv.dtype), im.l2_bytes,
                          im.opts.hopper_head_section);
  p.hopper_pingpong = use_hopper && im.opts.hopper_pingpong;
  p.hopper_ctas = hopper_ctas(im.opts.hopper_ctas, im.sm_count);
  p.num_tokens = q.num_tokens;
  p.num_pages = kv.num_pages;
  p.partial_md = reinterpret_cast<float*>(im.ws + o_partial);
  p.partial_o = reinterpret_cast<float*>(
      im.ws + align_up(o_partial + size_t(partials) * Hq * 2 * sizeof(float)));

  im.num_tokens = q.num_tokens;
  im.num_q_heads = Hq;
  im.num_kv_heads = Hk;
  im.head_dim = D;
  im.page_size = kv.page_size;
  im.num_pages = kv.num_pages;
  im.q_dtype = q.dtype;
  im.kv_dtype = kv.dtype;
  im.planned = true;

  info_ = CudaPlanInfo{};
  info_.decode_rows = int32_t(rows.size());
  info_.decode_ctas = int32_t(items.size());
  info_.split_rows = int32_t(merges.size());
  info_.prefill_tiles = int32_t(prefill.size());
  info_.prefill_hopper = use_hopper && !prefill.empty();
  info_.chunks_per_cta = k == INT_MAX ? 0 : int32_t(k);
  info_.decode_tc_rows = tc_rows;
  info_.workspace_bytes = o_partial + partials_size(partials);
}

void paged_attention_cuda(const CudaAttentionPlan& plan, const QKVTensor& q, const PagedKVView& kv,
                          QKVTensor& out, void* stream) {
  const CudaAttentionPlan::Impl& im = *plan.impl_;
  PA_CHECK(im.planned, "paged_attention_cuda: plan() has not succeeded on this plan");
  auto same = [](const char* what, int64_t got, int64_t planned) {
    PA_CHECK(got == planned, "paged_attention_cuda: ", what, " (", got,
             ") does not match the plan (", planned, ")");
  };
  same("q.num_tokens", q.num_tokens, im.num_tokens);
  same("q.num_heads", q.num_heads, im.num_q_heads);
  same("q.head_dim", q.head_dim, im.head_dim);
  same("out.num_tokens", out.num_tokens, im.num_tokens);
  same("out.num_heads", out.num_heads, im.num_q_heads);
  same("out.head_dim", out.head_dim, im.head_dim);
  same("kv.num_kv_heads", kv.num_kv_heads, im.num_kv_heads);
  same("kv.head_dim", kv.head_dim, im.head_dim);
  same("kv.page_size", kv.page_size, im.page_size);
  same("kv.num_pages", kv.num_pages, im.num_pages);
  PA_CHECK(q.dtype == im.q_dtype && out.dtype == im.q_dtype,
           "paged_attention_cuda: q.dtype/out.dtype (", dtype_name(q.dtype), "/",
           dtype_name(out.dtype), ") do not match the plan (", dtype_name(im.q_dtype), ")");
  PA_CHECK(kv.dtype == im.kv_dtype, "paged_attention_cuda: kv.dtype (", dtype_name(kv.dtype),
           ") does not match the plan (", dtype_name(im.kv_dtype), ")");
  if (im.num_tokens == 0) return;
  PA_CHECK(q.data && out.data, "paged_attention_cuda: q.data or out.data is null");
  PA_CHECK(kv.k_pages && kv.v_pages, "paged_attention_cuda: kv.k_pages or kv.v_pages is null");
  PA_CHECK(kv.dtype != DType::fp8_e4m3 || (kv.k_scale && kv.v_scale),
           "paged_attention_cuda: kv.k_scale or kv.v_scale is null but the pools are fp8_e4m3");

  cuda::AttentionParams p = im.params;
  p.q = q.data;
  p.out = out.data;
  p.k_pages = kv.k_pages;
  p.v_pages = kv.v_pages;
  p.k_scale = kv.k_scale;
  p.v_scale = kv.v_scale;
  const auto s = static_cast<cudaStream_t>(stream);
  cuda::launch_decode(p, q.dtype, kv.dtype, im.head_dim, s);
  if (p.num_prefill_items == 0) return;
  if (p.prefill_kernel != cuda::kPrefillMma)
    cuda::launch_prefill_hopper(p, q.dtype, kv.dtype, im.head_dim, s);
  else
    cuda::launch_prefill(p, q.dtype, kv.dtype, im.head_dim, s);
}

}  // namespace pagedattn
