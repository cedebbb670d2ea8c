// The attention operator and the KV write path on Python arrays (numpy, torch, DLPack), and the
// plan object that plans a step once and runs it on every layer.
//
//   q, out          : [num_tokens, num_q_heads, head_dim]         f32 | f16 | bf16 (CUDA: f16 |
//   bf16) k_pool, v_pool  : [num_pages, num_kv_heads, page_size, head_dim] q's dtype, or fp8 e4m3
//   bytes block_table     : [num_seqs, max_pages_per_seq] int32 (host) kv_len          : [num_seqs]
//   int32 (host), q_indptr: [num_seqs + 1] int32 (host) k_scale, v_scale: [num_kv_heads] float32 on
//   the pools' device (fp8 pools only)
// CPU arrays run the fused CPU kernel; CUDA arrays the CUDA backend on the given stream (a
// cudaStream_t as an integer, 0: the default stream). The Python layer (pagedattn/_ops.py) passes
// torch's current stream and host copies of device metadata.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <utility>
#include <vector>

#include "arrays.h"
#include "cuda_device.h"
#include "pagedattn/attention.h"
#include "pagedattn/attention_cuda.h"

namespace pagedattn::python {

namespace {

// A q or out argument checked against its description.
QKVTensor qo_view(const Array& a, const char* op, const char* arg) {
  check_ndim(a, 3, op, arg, "[num_tokens, num_heads, head_dim]");
  check_contiguous(a, op, arg);
  QKVTensor t;
  t.data = a.data();
  t.dtype = float_dtype(a, op, arg);
  t.num_tokens = int32_t(a.shape(0));
  t.num_heads = int32_t(a.shape(1));
  t.head_dim = int32_t(a.shape(2));
  return t;
}

// One layer's pools: k_pool and v_pool alike, on one device; fp8 pools with their scales.
PagedKVView kv_view(const Array& k_pool, const Array& v_pool, const std::optional<Array>& k_scale,
                    const std::optional<Array>& v_scale, const char* op) {
  check_ndim(k_pool, 4, op, "k_pool", "[num_pages, num_kv_heads, page_size, head_dim]");
  check_ndim(v_pool, 4, op, "v_pool", "[num_pages, num_kv_heads, page_size, head_dim]");
  check_contiguous(k_pool, op, "k_pool");
  check_contiguous(v_pool, op, "v_pool");
  const DType kd = float_dtype(k_pool, op, "k_pool", true);
  const DType vd = float_dtype(v_pool, op, "v_pool", true);
  if (kd != vd) {
    type_error(op, "v_pool's dtype (" + std::string(dtype_name(vd)) + ") differs from k_pool's (" +
                       std::string(dtype_name(kd)) + ")");
  }
  if (shape_of(k_pool) != shape_of(v_pool)) {
    value_error(
        op, "v_pool's shape " + shape_str(v_pool) + " differs from k_pool's " + shape_str(k_pool));
  }
  const Place where = place_of(k_pool, op, "k_pool");
  if (!(place_of(v_pool, op, "v_pool") == where)) {
    value_error(op, "v_pool is on " + place_name(place_of(v_pool, op, "v_pool")) +
                        " but k_pool on " + place_name(where));
  }
  for (size_t i = 0; i < 4; ++i) {
    if (k_pool.shape(i) > size_t(INT32_MAX)) {
      value_error(op, "k_pool's shape " + shape_str(k_pool) + " has an extent beyond int32");
    }
  }
  PagedKVView kv;
  kv.k_pages = k_pool.data();
  kv.v_pages = v_pool.data();
  kv.dtype = kd;
  kv.num_pages = int32_t(k_pool.shape(0));
  kv.num_kv_heads = int32_t(k_pool.shape(1));
  kv.page_size = int32_t(k_pool.shape(2));
  kv.head_dim = int32_t(k_pool.shape(3));
  if (kd == DType::fp8_e4m3) {
    if (!k_scale || !v_scale) {
      value_error(op,
                  "k_scale and v_scale are required for fp8 e4m3 pools (one float32 scale "
                  "per KV head)");
    }
    kv.k_scale = float32_vector(*k_scale, kv.num_kv_heads, where, op, "k_scale");
    kv.v_scale = float32_vector(*v_scale, kv.num_kv_heads, where, op, "v_scale");
  } else if (k_scale || v_scale) {
    value_error(op, "k_scale and v_scale apply to fp8 e4m3 pools only, but the pools are " +
                        std::string(dtype_name(kd)));
  }
  return kv;
}

// The host batch metadata, its three arrays checked against each other.
BatchLayout batch_view(const Array& block_table, const Array& kv_len, const Array& q_indptr,
                       const char* op) {
  BatchLayout b;
  b.block_table = host_int32(block_table, 2, op, "block_table", "[num_seqs, max_pages_per_seq]");
  b.kv_len = host_int32(kv_len, 1, op, "kv_len", "[num_seqs]");
  b.q_indptr = host_int32(q_indptr, 1, op, "q_indptr", "[num_seqs + 1]");
  b.num_seqs = int32_t(block_table.shape(0));
  b.max_pages_per_seq = int32_t(block_table.shape(1));
  if (int64_t(kv_len.shape(0)) != b.num_seqs) {
    value_error(op, "kv_len has " + std::to_string(kv_len.shape(0)) + " entries but block_table " +
                        std::to_string(b.num_seqs) + " rows (one per sequence)");
  }
  if (int64_t(q_indptr.shape(0)) != int64_t(b.num_seqs) + 1) {
    value_error(op, "q_indptr has " + std::to_string(q_indptr.shape(0)) +
                        " entries but must have " + std::to_string(b.num_seqs + 1) +
                        " (num_seqs + 1)");
  }
  return b;
}

AttentionOptions options(bool causal, std::optional<double> scale, int32_t window, double softcap) {
  AttentionOptions o;
  o.causal = causal;
  o.scale = scale ? float(*scale) : 0.f;
  o.window = window;
  o.softcap = float(softcap);
  return o;
}

void check_same_place(const Array& a, const char* arg, const Place& where, const char* op) {
  const Place p = place_of(a, op, arg);
  if (!(p == where)) {
    value_error(
        op, std::string(arg) + " is on " + place_name(p) + " but k_pool on " + place_name(where));
  }
}

// q and out: q's shape and dtype for both, on the pools' device.
void check_q_out(const Array& q, const Array& out, const QKVTensor& qv, const QKVTensor& ov,
                 const Place& where, const char* op) {
  check_same_place(q, "q", where, op);
  check_same_place(out, "out", where, op);
  if (shape_of(out) != shape_of(q)) {
    value_error(op, "out's shape " + shape_str(out) + " differs from q's " + shape_str(q));
  }
  if (ov.dtype != qv.dtype) {
    type_error(op, "out's dtype (" + std::string(dtype_name(ov.dtype)) + ") differs from q's (" +
                       std::string(dtype_name(qv.dtype)) + ")");
  }
}

// One plan per (device, stream) for the one-shot CUDA calls: the workspace is reused in stream
// order. NOTE: never freed (a plan per stream a process uses; the CUDA context outlives it).
CudaAttentionPlan& shared_cuda_plan(int32_t device_id, uintptr_t stream) {
  static std::mutex mu;
  static std::map<std::pair<int32_t, uintptr_t>, std::unique_ptr<CudaAttentionPlan>>* plans =
      new std::map<std::pair<int32_t, uintptr_t>, std::unique_ptr<CudaAttentionPlan>>();
  std::lock_guard<std::mutex> lock(mu);
  auto& p = (*plans)[{device_id, stream}];
  if (!p) p = std::make_unique<CudaAttentionPlan>();
  return *p;
}

void paged_attention(const Array& q, const Array& k_pool, const Array& v_pool,
                     const Array& block_table, const Array& kv_len, const Array& q_indptr,
                     const Array& out, bool causal, std::optional<double> scale, int32_t window,
                     double softcap, const std::optional<Array>& k_scale,
                     const std::optional<Array>& v_scale, uintptr_t stream) {
  constexpr const char* kOp = "paged_attention";
  const QKVTensor qv = qo_view(q, kOp, "q");
  QKVTensor ov = qo_view(out, kOp, "out");
  const PagedKVView kv = kv_view(k_pool, v_pool, k_scale, v_scale, kOp);
  const Place where = place_of(k_pool, kOp, "k_pool");
  check_q_out(q, out, qv, ov, where, kOp);
  const BatchLayout batch = batch_view(block_table, kv_len, q_indptr, kOp);
  const AttentionOptions opt = options(causal, scale, window, softcap);
  nb::gil_scoped_release release;
  if (where.device == Device::cpu) {
    paged_attention_cpu(qv, kv, batch, opt, ov);
    return;
  }
  CudaDeviceGuard guard(where.device_id);
  CudaAttentionPlan& plan = shared_cuda_plan(where.device_id, stream);
  plan.plan(qv, kv, batch, opt, ov, reinterpret_cast<void*>(stream));
  paged_attention_cuda(plan, qv, kv, ov, reinterpret_cast<void*>(stream));
}

// paged_attention iters times from C++ (arguments checked once, then plan and run per call, as
// each Python call does): the baseline of python/bench/overhead.py.
void paged_attention_repeated(const Array& q, const Array& k_pool, const Array& v_pool,
                              const Array& block_table, const Array& kv_len, const Array& q_indptr,
                              const Array& out, int32_t iters, uintptr_t stream) {
  constexpr const char* kOp = "paged_attention";
  const QKVTensor qv = qo_view(q, kOp, "q");
  QKVTensor ov = qo_view(out, kOp, "out");
  const PagedKVView kv = kv_view(k_pool, v_pool, std::nullopt, std::nullopt, kOp);
  const Place where = place_of(k_pool, kOp, "k_pool");
  check_q_out(q, out, qv, ov, where, kOp);
  const BatchLayout batch = batch_view(block_table, kv_len, q_indptr, kOp);
  const AttentionOptions opt;
  nb::gil_scoped_release release;
  if (where.device == Device::cpu) {
    for (int32_t i = 0; i < iters; ++i) paged_attention_cpu(qv, kv, batch, opt, ov);
    return;
  }
  CudaDeviceGuard guard(where.device_id);
  CudaAttentionPlan& plan = shared_cuda_plan(where.device_id, stream);
  for (int32_t i = 0; i < iters; ++i) {
    plan.plan(qv, kv, batch, opt, ov, reinterpret_cast<void*>(stream));
    paged_attention_cuda(plan, qv, kv, ov, reinterpret_cast<void*>(stream));
  }
}

void write_kv(const Array& k_pool, const Array& v_pool, const Array& slots, const Array& k,
              const Array& v, const std::optional<Array>& k_scale,
              const std::optional<Array>& v_scale, const std::optional<Array>& host_slots,
              uintptr_t stream) {
  constexpr const char* kOp = "write_kv";
  const PagedKVView kv = kv_view(k_pool, v_pool, k_scale, v_scale, kOp);
  const Place where = place_of(k_pool, kOp, "k_pool");
  check_ndim(k, 3, kOp, "k", "[num_tokens, num_kv_heads, head_dim]");
  check_ndim(v, 3, kOp, "v", "[num_tokens, num_kv_heads, head_dim]");
  check_contiguous(k, kOp, "k");
  check_contiguous(v, kOp, "v");
  check_same_place(k, "k", where, kOp);
  check_same_place(v, "v", where, kOp);
  const DType src = float_dtype(k, kOp, "k");
  if (float_dtype(v, kOp, "v") != src) type_error(kOp, "v's dtype differs from k's");
  if (shape_of(v) != shape_of(k)) {
    value_error(kOp, "v's shape " + shape_str(v) + " differs from k's " + shape_str(k));
  }
  if (int64_t(k.shape(1)) != kv.num_kv_heads || int64_t(k.shape(2)) != kv.head_dim) {
    value_error(kOp, "k's shape " + shape_str(k) + " must be [num_tokens, " +
                         std::to_string(kv.num_kv_heads) + ", " + std::to_string(kv.head_dim) +
                         "] (the pools' KV heads and head_dim)");
  }
  const int32_t n = int32_t(k.shape(0));
  const nb::dlpack::dtype st = slots.dtype();
  if (!(st.code == uint8_t(nb::dlpack::dtype_code::Int) && st.bits == 32 && st.lanes == 1)) {
    type_error(kOp, "slots must be int32");
  }
  check_ndim(slots, 1, kOp, "slots", "[num_tokens]");
  check_contiguous(slots, kOp, "slots");
  if (int64_t(slots.shape(0)) != n) {
    value_error(kOp, "slots has " + std::to_string(slots.shape(0)) + " entries but k has " +
                         std::to_string(n) + " tokens");
  }
  const int32_t* hs = nullptr;
  if (host_slots) {
    hs = host_int32(*host_slots, 1, kOp, "host_slots", "[num_tokens]");
    if (int64_t(host_slots->shape(0)) != n) value_error(kOp, "host_slots has the wrong length");
  }
  check_same_place(slots, "slots", where, kOp);
  nb::gil_scoped_release release;
  if (where.device == Device::cpu) {
    write_kv_cpu(kv, static_cast<const int32_t*>(slots.data()), n, k.data(), v.data(), src);
    return;
  }
  CudaDeviceGuard guard(where.device_id);
  write_kv_cuda(kv, static_cast<const int32_t*>(slots.data()), n, k.data(), v.data(), src,
                reinterpret_cast<void*>(stream), hs);
}

// plan = AttentionPlan(q, k_pool, block_table, kv_len, q_indptr, ...): the step planned once;
// plan.run(q, k_pool, v_pool, out) per layer; plan.plan(...) again for the next step (same
// workspace, so a captured CUDA graph stays valid while the launch signature is unchanged).
class AttentionPlan {
 public:
  AttentionPlan(const Array& q, const Array& k_pool, const Array& block_table, const Array& kv_len,
                const Array& q_indptr, bool causal, std::optional<double> scale, int32_t window,
                double softcap, size_t workspace_bytes, uintptr_t stream)
      : opt_(options(causal, scale, window, softcap)) {
    place_ = place_of(k_pool, kOp, "k_pool");
    if (place_.device == Device::cuda) {
      CudaDeviceGuard guard(place_.device_id);
      cuda_ = std::make_unique<CudaAttentionPlan>(workspace_bytes);
    }
    plan(q, k_pool, block_table, kv_len, q_indptr, stream);
  }

  void plan(const Array& q, const Array& k_pool, const Array& block_table, const Array& kv_len,
            const Array& q_indptr, uintptr_t stream) {
    const QKVTensor qv = qo_view(q, kOp, "q");
    check_ndim(k_pool, 4, kOp, "k_pool", "[num_pages, num_kv_heads, page_size, head_dim]");
    check_contiguous(k_pool, kOp, "k_pool");
    if (!(place_of(k_pool, kOp, "k_pool") == place_)) {
      value_error(kOp, "k_pool is on " + place_name(place_of(k_pool, kOp, "k_pool")) +
                           " but the plan was made for " + place_name(place_));
    }
    check_same_place(q, "q", place_, kOp);
    const BatchLayout b = batch_view(block_table, kv_len, q_indptr, kOp);
    // The plan keeps its own copy of the metadata: the caller may reuse its buffers.
    q_indptr_.assign(b.q_indptr, b.q_indptr + b.num_seqs + 1);
    kv_len_.assign(b.kv_len, b.kv_len + b.num_seqs);
    block_table_.assign(b.block_table, b.block_table + int64_t(b.num_seqs) * b.max_pages_per_seq);
    batch_ = b;
    batch_.q_indptr = q_indptr_.data();
    batch_.kv_len = kv_len_.data();
    batch_.block_table = block_table_.data();
    const PagedKVView kv = planned_pools(k_pool);
    q_ = qv;
    kv_ = kv;
    planned_ = false;
    nb::gil_scoped_release release;
    if (cuda_) {
      CudaDeviceGuard guard(place_.device_id);
      cuda_->plan(qv, kv, batch_, opt_, qv, reinterpret_cast<void*>(stream));
    } else {
      validate_paged_attention(qv, kv, batch_, opt_, qv);
    }
    planned_ = true;
  }

  void run(const Array& q, const Array& k_pool, const Array& v_pool, const Array& out,
           const std::optional<Array>& k_scale, const std::optional<Array>& v_scale,
           uintptr_t stream) const {
    constexpr const char* kRun = "AttentionPlan.run";
    if (!planned_) value_error(kRun, "the last plan() failed; plan the step again first");
    const QKVTensor qv = qo_view(q, kRun, "q");
    QKVTensor ov = qo_view(out, kRun, "out");
    const PagedKVView kv = kv_view(k_pool, v_pool, k_scale, v_scale, kRun);
    check_q_out(q, out, qv, ov, place_, kRun);
    check_same_place(k_pool, "k_pool", place_, kRun);
    if (qv.num_tokens != q_.num_tokens || qv.num_heads != q_.num_heads ||
        qv.head_dim != q_.head_dim || qv.dtype != q_.dtype) {
      value_error(kRun, "q " + shape_str(q) + " " + std::string(dtype_name(qv.dtype)) +
                            " differs from the planned q (" + std::to_string(q_.num_tokens) + ", " +
                            std::to_string(q_.num_heads) + ", " + std::to_string(q_.head_dim) +
                            ") " + std::string(dtype_name(q_.dtype)));
    }
    if (kv.num_pages != kv_.num_pages || kv.num_kv_heads != kv_.num_kv_heads ||
        kv.page_size != kv_.page_size || kv.head_dim != kv_.head_dim || kv.dtype != kv_.dtype) {
      value_error(kRun, "k_pool " + shape_str(k_pool) + " differs from the planned pools");
    }
    nb::gil_scoped_release release;
    if (cuda_) {
      CudaDeviceGuard guard(place_.device_id);
      paged_attention_cuda(*cuda_, qv, kv, ov, reinterpret_cast<void*>(stream));
    } else {
      paged_attention_cpu(qv, kv, batch_, opt_, ov);
    }
  }

  // run()'s launches iters times from C++ (arguments checked once): the baseline of
  // python/bench/overhead.py.
  void run_repeated(const Array& q, const Array& k_pool, const Array& v_pool, const Array& out,
                    int32_t iters, uintptr_t stream) const {
    run(q, k_pool, v_pool, out, std::nullopt, std::nullopt, stream);  // checks the arguments
    const QKVTensor qv = qo_view(q, "AttentionPlan.run", "q");
    QKVTensor ov = qo_view(out, "AttentionPlan.run", "out");
    const PagedKVView kv = kv_view(k_pool, v_pool, std::nullopt, std::nullopt, "AttentionPlan.run");
    nb::gil_scoped_release release;
    CudaDeviceGuard guard(place_.device_id);
    for (int32_t i = 1; i < iters; ++i) {
      if (cuda_) {
        paged_attention_cuda(*cuda_, qv, kv, ov, reinterpret_cast<void*>(stream));
      } else {
        paged_attention_cpu(qv, kv, batch_, opt_, ov);
      }
    }
  }

  std::string device() const { return place_name(place_); }
  int32_t num_seqs() const { return batch_.num_seqs; }
  int32_t num_tokens() const { return q_.num_tokens; }
  std::string launch_signature() const { return cuda_ ? cuda_->launch_signature() : ""; }

 private:
  static constexpr const char* kOp = "AttentionPlan";
  // The pools for planning: shapes and dtype (fp8 scales are given to run()).
  static PagedKVView planned_pools(const Array& k_pool) {
    PagedKVView kv;
    kv.k_pages = kv.v_pages = k_pool.data();
    kv.dtype = float_dtype(k_pool, kOp, "k_pool", true);
    kv.num_pages = int32_t(k_pool.shape(0));
    kv.num_kv_heads = int32_t(k_pool.shape(1));
    kv.page_size = int32_t(k_pool.shape(2));
    kv.head_dim = int32_t(k_pool.shape(3));
    // NOTE: planning reads no scale values; validation only asks that fp8 pools have some.
    static const float kUnusedScale = 1.f;
    if (kv.dtype == DType::fp8_e4m3) kv.k_scale = kv.v_scale = &kUnusedScale;
    return kv;
  }

  AttentionOptions opt_;
  Place place_;
  std::unique_ptr<CudaAttentionPlan> cuda_;
  std::vector<int32_t> q_indptr_, kv_len_, block_table_;
  BatchLayout batch_;
  QKVTensor q_;
  PagedKVView kv_;
  bool planned_ = false;
};

}  // namespace

void bind_attention(nb::module_& m) {
  m.def("paged_attention", &paged_attention, nb::arg("q"), nb::arg("k_pool"), nb::arg("v_pool"),
        nb::arg("block_table"), nb::arg("kv_len"), nb::arg("q_indptr"), nb::arg("out"),
        nb::arg("causal"), nb::arg("scale").none(), nb::arg("window"), nb::arg("softcap"),
        nb::arg("k_scale").none(), nb::arg("v_scale").none(), nb::arg("stream"),
        "Paged attention into out (all arrays checked; see pagedattn.paged_attention).");
  m.def("_paged_attention_repeated", &paged_attention_repeated, nb::arg("q"), nb::arg("k_pool"),
        nb::arg("v_pool"), nb::arg("block_table"), nb::arg("kv_len"), nb::arg("q_indptr"),
        nb::arg("out"), nb::arg("iters"), nb::arg("stream"));
  m.def("write_kv", &write_kv, nb::arg("k_pool"), nb::arg("v_pool"), nb::arg("slots"), nb::arg("k"),
        nb::arg("v"), nb::arg("k_scale").none(), nb::arg("v_scale").none(),
        nb::arg("host_slots").none(), nb::arg("stream"),
        "Stores k and v [num_tokens, num_kv_heads, head_dim] at slots (page * page_size + slot).");
  nb::class_<AttentionPlan>(m, "AttentionPlan")
      .def(nb::init<const Array&, const Array&, const Array&, const Array&, const Array&, bool,
                    std::optional<double>, int32_t, double, size_t, uintptr_t>(),
           nb::arg("q"), nb::arg("k_pool"), nb::arg("block_table"), nb::arg("kv_len"),
           nb::arg("q_indptr"), nb::arg("causal"), nb::arg("scale").none(), nb::arg("window"),
           nb::arg("softcap"), nb::arg("workspace_bytes"), nb::arg("stream"))
      .def("plan", &AttentionPlan::plan, nb::arg("q"), nb::arg("k_pool"), nb::arg("block_table"),
           nb::arg("kv_len"), nb::arg("q_indptr"), nb::arg("stream"))
      .def("run", &AttentionPlan::run, nb::arg("q"), nb::arg("k_pool"), nb::arg("v_pool"),
           nb::arg("out"), nb::arg("k_scale").none(), nb::arg("v_scale").none(), nb::arg("stream"))
      .def("_run_repeated", &AttentionPlan::run_repeated, nb::arg("q"), nb::arg("k_pool"),
           nb::arg("v_pool"), nb::arg("out"), nb::arg("iters"), nb::arg("stream"))
      .def_prop_ro("device", &AttentionPlan::device)
      .def_prop_ro("num_seqs", &AttentionPlan::num_seqs)
      .def_prop_ro("num_tokens", &AttentionPlan::num_tokens)
      .def_prop_ro("launch_signature", &AttentionPlan::launch_signature);
  m.def("cuda_device_count", &cuda_device_count, "Usable CUDA devices (0 in builds without CUDA).");
}

}  // namespace pagedattn::python
