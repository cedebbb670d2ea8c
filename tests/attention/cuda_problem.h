// The attention test problems (problem.h) on a CUDA device: the same random ragged batch with
// shuffled block tables, plus its device copies, a run of the CUDA backend into an output poisoned
// with NaN, and the comparison against the reference.
//
// Slots past each sequence's kv_len, unused pages and block-table entries past the last needed
// page hold NaN or garbage: a kernel that reads what it must not turns its output into NaN.
#pragma once

#include <gtest/gtest.h>

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "gpu_skip.h"
#include "pagedattn/attention.h"
#include "pagedattn/attention_cuda.h"
#include "pagedattn/tensor.h"
#include "problem.h"

namespace pagedattn::gputest {

using testing::describe;

// The CUDA tests' defaults: bf16 queries, cache and output, GQA 4, head dim 128.
struct Spec : testing::ProblemSpec {
  Spec() {
    num_q_heads = 8;
    num_kv_heads = 2;
    head_dim = 128;
    q_dtype = kv_dtype = out_dtype = DType::bf16;
    fp8_scale_max = 0.03f;
  }
};

inline std::vector<uint8_t> nan_bytes(DType t, int64_t n) { return testing::nan_buffer(t, n); }

// The output dtype is the query's.
struct Problem : testing::Problem {
  // Device copies.
  Tensor d_q, d_k, d_v, d_k_scale, d_v_scale;

  Problem(const Spec& s, uint64_t seed) : testing::Problem(s, seed) { upload(); }

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

  PagedKVView host_view() const { return view(); }
  PagedKVView device_view() {
    PagedKVView v = host_view();
    v.k_pages = d_k.data();
    v.v_pages = d_v.data();
    if (!k_scale.empty())
      v.k_scale = d_k_scale.data_as<float>(), v.v_scale = d_v_scale.data_as<float>();
    return v;
  }
  QKVTensor host_q() const { return q_tensor(); }
  QKVTensor device_q() {
    return QKVTensor{d_q.data(), spec.q_dtype, num_tokens, spec.num_q_heads, spec.head_dim};
  }

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

  // Runs the CUDA backend into an output poisoned with NaN; returns the raw output bytes.
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
