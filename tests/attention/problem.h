// Test problems for the attention operator, for every backend: a ragged batch, its pools with
// shuffled block tables, and helpers to run a backend and compare outputs (the CUDA tests add the
// device copies: cuda_problem.h).
//
// Slots past each sequence's kv_len, and pages no sequence uses, hold NaN: a kernel that reads a
// key it must not see turns its output into NaN, which never passes a comparison.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/dtype.h"

namespace pagedattn::testing {

struct ProblemSpec {
  int32_t num_q_heads = 4;
  int32_t num_kv_heads = 1;
  int32_t head_dim = 64;
  int32_t page_size = 16;
  DType q_dtype = DType::f32;
  DType kv_dtype = DType::f32;
  DType out_dtype = DType::f32;
  std::vector<int32_t> q_len;    // per sequence
  std::vector<int32_t> kv_len;   // per sequence, >= q_len
  int32_t extra_pages = 3;       // unused pages in the pool (NaN-filled)
  int32_t extra_table_cols = 1;  // block-table entries past the last needed page (garbage ids)
  int32_t min_page_id = 0;       // page ids start here (pools past 65,536 pages)
  float fp8_scale_max = 0.02f;   // fp8 pools: per-head scales drawn from [0.01, this)
  AttentionOptions opt;
};

inline std::string describe(const ProblemSpec& s) {
  std::ostringstream d;
  d << "Hq=" << s.num_q_heads << " Hk=" << s.num_kv_heads << " D=" << s.head_dim
    << " P=" << s.page_size << " q=" << dtype_name(s.q_dtype) << " kv=" << dtype_name(s.kv_dtype)
    << " out=" << dtype_name(s.out_dtype) << " causal=" << s.opt.causal
    << " window=" << s.opt.window << " softcap=" << s.opt.softcap << " scale=" << s.opt.scale
    << " seqs(q/kv):";
  for (size_t b = 0; b < s.q_len.size(); ++b) d << " " << s.q_len[b] << "/" << s.kv_len[b];
  return d.str();
}

// Raw bytes of a buffer of n elements of dtype t, filled with NaN.
inline std::vector<uint8_t> nan_buffer(DType t, int64_t n) {
  std::vector<uint8_t> buf(size_t(n) * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) store_from_f32(buf.data(), t, i, NAN);
  return buf;
}

struct Problem {
  ProblemSpec spec;
  int32_t num_tokens = 0;
  int32_t num_pages = 0;
  int32_t max_pages_per_seq = 0;
  std::vector<int32_t> q_indptr, kv_len, block_table;
  std::vector<uint8_t> q, k_pages, v_pages;
  std::vector<float> k_scale, v_scale;

  explicit Problem(const ProblemSpec& s, uint64_t seed) : spec(s) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int32_t n = int32_t(s.q_len.size()), P = s.page_size, Hk = s.num_kv_heads, D = s.head_dim;
    q_indptr.assign(size_t(n) + 1, 0);
    for (int32_t b = 0; b < n; ++b)
      q_indptr[size_t(b) + 1] = q_indptr[size_t(b)] + s.q_len[size_t(b)];
    num_tokens = q_indptr.back();
    kv_len = s.kv_len;
    std::vector<int32_t> pages_of(static_cast<size_t>(n));
    int32_t used = 0;
    for (int32_t b = 0; b < n; ++b) {
      pages_of[size_t(b)] = (s.kv_len[size_t(b)] + P - 1) / P;
      used += pages_of[size_t(b)];
      max_pages_per_seq = std::max(max_pages_per_seq, pages_of[size_t(b)]);
    }
    max_pages_per_seq += s.extra_table_cols;
    num_pages = s.min_page_id + used + s.extra_pages;
    // Shuffled page ids: no sequence's pages are contiguous or in order.
    std::vector<int32_t> ids(static_cast<size_t>(used + s.extra_pages));
    std::iota(ids.begin(), ids.end(), s.min_page_id);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table.assign(size_t(n) * max_pages_per_seq, 0);
    size_t next = 0;
    for (int32_t b = 0; b < n; ++b)
      for (int32_t i = 0; i < max_pages_per_seq; ++i)
        block_table[size_t(b) * max_pages_per_seq + i] =
            i < pages_of[size_t(b)] ? ids[next++] : (i % 2 ? -7 : num_pages + 12345);

    // Queries; values of a scale that makes the softmax neither flat nor one-hot.
    const int64_t q_elems = int64_t(num_tokens) * s.num_q_heads * D;
    q.resize(size_t(q_elems) * dtype_size(s.q_dtype));
    for (int64_t i = 0; i < q_elems; ++i) store_from_f32(q.data(), s.q_dtype, i, normal(rng));

    // Pools: NaN everywhere, then every valid slot of every sequence filled.
    const bool fp8 = s.kv_dtype == DType::fp8_e4m3;
    if (fp8) {
      std::uniform_real_distribution<float> sc(0.01f, s.fp8_scale_max);
      for (int32_t h = 0; h < Hk; ++h) k_scale.push_back(sc(rng)), v_scale.push_back(sc(rng));
    }
    const int64_t pool_elems = int64_t(num_pages) * Hk * P * D;
    k_pages = nan_buffer(s.kv_dtype, pool_elems);
    v_pages = nan_buffer(s.kv_dtype, pool_elems);
    const PagedKVView v = view();
    for (int32_t b = 0; b < n; ++b) {
      for (int32_t p = 0; p < s.kv_len[size_t(b)]; ++p) {
        const int32_t page = block_table[size_t(b) * max_pages_per_seq + p / P];
        for (int32_t h = 0; h < Hk; ++h) {
          const int64_t off = v.offset(page, h, p % P);
          for (int32_t d = 0; d < D; ++d) {
            const float kx = normal(rng), vx = normal(rng);
            store_from_f32(k_pages.data(), s.kv_dtype, off + d, fp8 ? kx / k_scale[size_t(h)] : kx);
            store_from_f32(v_pages.data(), s.kv_dtype, off + d, fp8 ? vx / v_scale[size_t(h)] : vx);
          }
        }
      }
    }
  }

  PagedKVView view() const {
    PagedKVView v;
    v.k_pages = const_cast<uint8_t*>(k_pages.data());
    v.v_pages = const_cast<uint8_t*>(v_pages.data());
    v.dtype = spec.kv_dtype;
    v.num_pages = num_pages;
    v.num_kv_heads = spec.num_kv_heads;
    v.page_size = spec.page_size;
    v.head_dim = spec.head_dim;
    if (spec.kv_dtype == DType::fp8_e4m3) v.k_scale = k_scale.data(), v.v_scale = v_scale.data();
    return v;
  }
  BatchLayout batch() const {
    return BatchLayout{int32_t(kv_len.size()), q_indptr.data(), kv_len.data(), block_table.data(),
                       max_pages_per_seq};
  }
  QKVTensor q_tensor() const {
    return QKVTensor{const_cast<uint8_t*>(q.data()), spec.q_dtype, num_tokens, spec.num_q_heads,
                     spec.head_dim};
  }
  int64_t out_elems() const { return int64_t(num_tokens) * spec.num_q_heads * spec.head_dim; }
};

// An output buffer poisoned with NaN and its view.
struct OutBuffer {
  std::vector<uint8_t> bytes;
  QKVTensor t;
  OutBuffer(const Problem& pr, DType dtype) {
    bytes = nan_buffer(dtype, pr.out_elems());
    t = QKVTensor{bytes.data(), dtype, pr.num_tokens, pr.spec.num_q_heads, pr.spec.head_dim};
  }
  std::vector<double> values() const {
    std::vector<double> v(size_t(int64_t(t.num_tokens) * t.num_heads * t.head_dim));
    for (size_t i = 0; i < v.size(); ++i) v[i] = load_as_f32(bytes.data(), t.dtype, int64_t(i));
    return v;
  }
};

// ||got - want|| / max(||want||, 1e-6): NaN anywhere gives NaN (and fails every `<=` check).
inline double rel_error(const std::vector<double>& got, const std::vector<double>& want) {
  double num = 0.0, den = 0.0;
  for (size_t i = 0; i < got.size(); ++i) {
    if (std::isnan(got[i]) || std::isnan(want[i])) return NAN;
    num += (got[i] - want[i]) * (got[i] - want[i]);
    den += want[i] * want[i];
  }
  return std::sqrt(num) / std::max(std::sqrt(den), 1e-6);
}

// Tolerance of a fused output against the f32 reference output, by the output's dtype (its
// rounding dominates; f32 allows for fp32 accumulation over long contexts).
inline double tolerance(DType out) {
  switch (out) {
    case DType::f32:
      return 2e-5;
    case DType::f16:
      return 1.5e-3;
    case DType::bf16:
      return 1e-2;
    default:
      return 0.0;
  }
}

}  // namespace pagedattn::testing
