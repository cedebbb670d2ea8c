// Random paged-attention problems for the CUDA tests: a ragged batch with shuffled block tables,
// host pools and their device copies, and the comparison against the reference.
//
// Slots past each sequence's kv_len, unused pages and block-table entries past the last needed
// page hold NaN or garbage: a kernel that reads what it must not turns its output into NaN.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/attention.h"
#include "pagedattn/attention_cuda.h"
#include "pagedattn/tensor.h"
#include "gpu_skip.h"

namespace pagedattn::gputest {

struct Spec {
  int32_t num_q_heads = 8, num_kv_heads = 2, head_dim = 128, page_size = 16;
  DType q_dtype = DType::bf16, kv_dtype = DType::bf16;
  std::vector<int32_t> q_len, kv_len;
  int32_t extra_pages = 3;
  int32_t min_page_id = 0;  // page ids start here (pools past 65,536 pages)
  AttentionOptions opt;
};

inline std::string describe(const Spec& s) {
  std::string d =
      "Hq=" + std::to_string(s.num_q_heads) + " Hk=" + std::to_string(s.num_kv_heads) +
      " D=" + std::to_string(s.head_dim) + " P=" + std::to_string(s.page_size) +
      " q=" + std::string(dtype_name(s.q_dtype)) + " kv=" + std::string(dtype_name(s.kv_dtype)) +
      " causal=" + std::to_string(s.opt.causal) + " window=" + std::to_string(s.opt.window) +
      " softcap=" + std::to_string(s.opt.softcap) + " scale=" + std::to_string(s.opt.scale) +
      " seqs(q/kv):";
  for (size_t b = 0; b < s.q_len.size(); ++b)
    d += " " + std::to_string(s.q_len[b]) + "/" + std::to_string(s.kv_len[b]);
  return d;
}

inline std::vector<uint8_t> nan_bytes(DType t, int64_t n) {
  std::vector<uint8_t> buf(size_t(n) * dtype_size(t));
  for (int64_t i = 0; i < n; ++i) store_from_f32(buf.data(), t, i, NAN);
  return buf;
}

struct Problem {
  Spec spec;
  int32_t num_tokens = 0, num_pages = 0, max_pages_per_seq = 0;
  std::vector<int32_t> q_indptr, kv_len, block_table;
  std::vector<uint8_t> q, k_pages, v_pages;
  std::vector<float> k_scale, v_scale;
  // Device copies.
  Tensor d_q, d_k, d_v, d_k_scale, d_v_scale;

  Problem(const Spec& s, uint64_t seed) : spec(s) {
    std::mt19937_64 rng(seed);
    std::normal_distribution<float> normal(0.f, 1.f);
    const int32_t n = int32_t(s.q_len.size()), P = s.page_size, Hk = s.num_kv_heads, D = s.head_dim;
    q_indptr.assign(size_t(n) + 1, 0);
    for (int32_t b = 0; b < n; ++b)
      q_indptr[size_t(b) + 1] = q_indptr[size_t(b)] + s.q_len[size_t(b)];
    num_tokens = q_indptr.back();
    kv_len = s.kv_len;
    std::vector<int32_t> pages_of(size_t(n), 0);
    int32_t used = 0;
    for (int32_t b = 0; b < n; ++b) {
      pages_of[size_t(b)] = (s.kv_len[size_t(b)] + P - 1) / P;
      used += pages_of[size_t(b)];
      max_pages_per_seq = std::max(max_pages_per_seq, pages_of[size_t(b)]);
    }
    max_pages_per_seq += 1;
    num_pages = s.min_page_id + used + s.extra_pages;
    std::vector<int32_t> ids(size_t(used + s.extra_pages));
    std::iota(ids.begin(), ids.end(), s.min_page_id);
    std::shuffle(ids.begin(), ids.end(), rng);
    block_table.assign(size_t(n) * max_pages_per_seq, 0);
    size_t next = 0;
    for (int32_t b = 0; b < n; ++b)
      for (int32_t i = 0; i < max_pages_per_seq; ++i)
        block_table[size_t(b) * max_pages_per_seq + i] =
            i < pages_of[size_t(b)] ? ids[next++] : (i % 2 ? -7 : num_pages + 12345);

    const int64_t q_elems = int64_t(num_tokens) * s.num_q_heads * D;
    q.resize(size_t(q_elems) * dtype_size(s.q_dtype));
    for (int64_t i = 0; i < q_elems; ++i) store_from_f32(q.data(), s.q_dtype, i, normal(rng));

    const bool fp8 = s.kv_dtype == DType::fp8_e4m3;
    if (fp8) {
      std::uniform_real_distribution<float> sc(0.01f, 0.03f);
      for (int32_t h = 0; h < Hk; ++h) k_scale.push_back(sc(rng)), v_scale.push_back(sc(rng));
    }
    const int64_t pool_elems = int64_t(num_pages) * Hk * P * D;
    k_pages = nan_bytes(s.kv_dtype, pool_elems);
    v_pages = nan_bytes(s.kv_dtype, pool_elems);
    const PagedKVView v = host_view();
    for (int32_t b = 0; b < n; ++b)
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
    upload();
  }

  void upload() {
    d_q = to_device(q.data(), q.size());
    d_k = to_device(k_pages.data(), k_pages.size());
    d_v = to_device(v_pages.data(), v_pages.size());
    if (!k_scale.empty()) {
      d_k_scale = to_device(k_scale.data(), k_scale.size() * 4);
      d_v_scale = to_device(v_scale.data(), v_scale.size() * 4);
    }
  }
  static Tensor to_device(const void* src, size_t bytes) {
    Tensor t = Tensor::empty({int64_t(bytes)}, DType::fp8_e4m3, Device::cuda);
    copy_bytes(t.data(), Device::cuda, src, Device::cpu, bytes);
    return t;
  }

  PagedKVView host_view() const {
    PagedKVView v;
    v.k_pages = const_cast<uint8_t*>(k_pages.data());
    v.v_pages = const_cast<uint8_t*>(v_pages.data());
    v.dtype = spec.kv_dtype;
    v.num_pages = num_pages;
    v.num_kv_heads = spec.num_kv_heads;
    v.page_size = spec.page_size;
    v.head_dim = spec.head_dim;
    if (!k_scale.empty()) v.k_scale = k_scale.data(), v.v_scale = v_scale.data();
    return v;
  }
  PagedKVView device_view() {
    PagedKVView v = host_view();
    v.k_pages = d_k.data();
    v.v_pages = d_v.data();
    if (!k_scale.empty())
      v.k_scale = d_k_scale.data_as<float>(), v.v_scale = d_v_scale.data_as<float>();
    return v;
  }
  BatchLayout batch() const {
    return BatchLayout{int32_t(kv_len.size()), q_indptr.data(), kv_len.data(), block_table.data(),
                       max_pages_per_seq};
  }
  QKVTensor host_q() const {
    return QKVTensor{const_cast<uint8_t*>(q.data()), spec.q_dtype, num_tokens, spec.num_q_heads,
                     spec.head_dim};
  }
  QKVTensor device_q() {
    return QKVTensor{d_q.data(), spec.q_dtype, num_tokens, spec.num_q_heads, spec.head_dim};
  }
  int64_t out_elems() const { return int64_t(num_tokens) * spec.num_q_heads * spec.head_dim; }

  // The reference output (host, as floats of the output dtype).
  std::vector<float> reference() const {
    std::vector<uint8_t> out(size_t(out_elems()) * dtype_size(spec.q_dtype));
    QKVTensor o{out.data(), spec.q_dtype, num_tokens, spec.num_q_heads, spec.head_dim};
    paged_attention_reference(host_q(), host_view(), batch(), spec.opt, o);
    std::vector<float> r(static_cast<size_t>(out_elems()));
    for (int64_t i = 0; i < out_elems(); ++i)
      r[size_t(i)] = load_as_f32(out.data(), spec.q_dtype, i);
    return r;
  }

  // Runs the CUDA backend into an output poisoned with NaN; returns the raw output bytes.
  // Plans once, then runs the plan `times` times (as the layers of a step do), each into a freshly
  // poisoned output; returns every run's output.
  std::vector<std::vector<uint8_t>> run_cuda_repeated(CudaAttentionPlan& plan, int times) {
    const size_t bytes = size_t(out_elems()) * dtype_size(spec.q_dtype);
    const std::vector<uint8_t> poison = nan_bytes(spec.q_dtype, out_elems());
    Tensor d_out = to_device(poison.data(), bytes);
    QKVTensor o{d_out.data(), spec.q_dtype, num_tokens, spec.num_q_heads, spec.head_dim};
    QKVTensor dq = device_q();
    plan.plan(dq, device_view(), batch(), spec.opt, o);
    std::vector<std::vector<uint8_t>> outs;
    for (int i = 0; i < times; ++i) {
      copy_bytes(d_out.data(), Device::cuda, poison.data(), Device::cpu, bytes);
      paged_attention_cuda(plan, dq, device_view(), o);
      outs.emplace_back(bytes);
      copy_bytes(outs.back().data(), Device::cpu, d_out.data(), Device::cuda, bytes);
    }
    return outs;
  }

  std::vector<uint8_t> run_cuda(CudaAttentionPlan& plan) {
    Tensor d_out = to_device(nan_bytes(spec.q_dtype, out_elems()).data(),
                             size_t(out_elems()) * dtype_size(spec.q_dtype));
    QKVTensor o{d_out.data(), spec.q_dtype, num_tokens, spec.num_q_heads, spec.head_dim};
    QKVTensor dq = device_q();
    plan.plan(dq, device_view(), batch(), spec.opt, o);
    paged_attention_cuda(plan, dq, device_view(), o);
    std::vector<uint8_t> out(size_t(out_elems()) * dtype_size(spec.q_dtype));
    copy_bytes(out.data(), Device::cpu, d_out.data(), Device::cuda, out.size());
    return out;
  }
};

// Every element within atol + rtol * |ref| (NaN never passes), and a relative L2 error bound.
inline void expect_close(const std::vector<uint8_t>& got_bytes, DType t,
                         const std::vector<float>& ref, const std::string& what) {
  const bool bf16 = t == DType::bf16;
  const double atol = bf16 ? 2e-2 : 4e-3, rtol = bf16 ? 2e-2 : 5e-3, l2_tol = bf16 ? 1e-2 : 3e-3;
  double num = 0, den = 0;
  int64_t bad = 0, first_bad = -1;
  for (size_t i = 0; i < ref.size(); ++i) {
    const double g = load_as_f32(got_bytes.data(), t, int64_t(i)), r = ref[i];
    num += (g - r) * (g - r);
    den += r * r;
    if (!(std::fabs(g - r) <= atol + rtol * std::fabs(r))) {
      if (first_bad < 0) first_bad = int64_t(i);
      ++bad;
    }
  }
  const double rel = den > 0 ? std::sqrt(num / den) : std::sqrt(num);
  EXPECT_EQ(bad, 0) << what << ": " << bad << " elements off, first at " << first_bad << " got "
                    << (first_bad >= 0 ? load_as_f32(got_bytes.data(), t, first_bad) : 0.f)
                    << " want " << (first_bad >= 0 ? ref[size_t(first_bad)] : 0.f);
  EXPECT_LE(rel, l2_tol) << what << ": relative L2 error " << rel;
}

}  // namespace pagedattn::gputest
