// Which slice of each weight a tensor-parallel rank holds (tensor_parallel.h).
#include <cstring>

#include "pagedattn/error.h"
#include "pagedattn/tensor_parallel.h"

namespace pagedattn {

TpSlices tp_slices(const ModelConfig& c, TpShard s) {
  constexpr const char* op = "tensor parallel";
  PA_CHECK(s.world >= 1 && s.rank >= 0 && s.rank < s.world, op, ": rank ", s.rank,
           " is not in a world of ", s.world);
  PA_CHECK(c.num_q_heads % s.world == 0, op, ": ", c.num_q_heads,
           " attention heads do not divide among ", s.world, " GPUs");
  PA_CHECK(c.num_kv_heads % s.world == 0 || s.world % c.num_kv_heads == 0, op, ": ",
           c.num_kv_heads, " KV heads do not divide among ", s.world,
           " GPUs (nor ", s.world, " GPUs among them)");
  PA_CHECK(c.intermediate_size % s.world == 0, op, ": intermediate_size ", c.intermediate_size,
           " does not divide among ", s.world, " GPUs");
  TpSlices t;
  t.q_heads = c.num_q_heads / s.world;
  t.q_head0 = s.rank * t.q_heads;
  if (c.num_kv_heads >= s.world) {
    t.kv_heads = c.num_kv_heads / s.world;
    t.kv_head0 = s.rank * t.kv_heads;
  } else {
    // NOTE: each KV head is replicated on world / num_kv_heads consecutive ranks; rank r's q heads
    // [r * Hq / world, (r + 1) * Hq / world) all belong to KV head r * Hkv / world's group.
    t.kv_heads = 1;
    t.kv_head0 = s.rank * c.num_kv_heads / s.world;
  }
  t.inter = c.intermediate_size / s.world;
  t.inter0 = s.rank * t.inter;
  t.vocab_stride = (c.vocab_size + s.world - 1) / s.world;
  t.vocab0 = std::min(c.vocab_size, s.rank * t.vocab_stride);
  t.vocab = std::min(c.vocab_size, t.vocab0 + t.vocab_stride) - t.vocab0;
  return t;
}

TpBlock tp_block(const std::string& name, const std::vector<int64_t>& shape, const ModelConfig& c,
                 TpShard s) {
  PA_CHECK(shape.size() == 1 || shape.size() == 2, "tp_block: ", name, " has ", shape.size(),
           " dimensions");
  const TpSlices t = tp_slices(c, s);
  const int64_t R = shape.size() == 2 ? shape[0] : 1, C = shape.back();
  const int64_t D = c.head_dim > 0 ? c.head_dim : c.hidden_size / c.num_q_heads;
  TpBlock b{0, R, 0, C, C};
  auto ends_with = [&](const char* suffix) {
    const size_t n = std::strlen(suffix);
    return name.size() >= n && name.compare(name.size() - n, n, suffix) == 0;
  };
  // A range of the output features: rows of a matrix, or elements of a bias vector.
  auto out_range = [&](int64_t first, int64_t count) {
    if (shape.size() == 2) {
      b.row0 = first;
      b.rows = count;
    } else {
      b.col0 = first;
      b.cols = count;
    }
  };
  if (ends_with("q_proj.weight") || ends_with("q_proj.bias")) {
    out_range(t.q_head0 * D, t.q_heads * D);
  } else if (ends_with("k_proj.weight") || ends_with("k_proj.bias") ||
             ends_with("v_proj.weight") || ends_with("v_proj.bias")) {
    out_range(t.kv_head0 * D, t.kv_heads * D);
  } else if (ends_with("gate_proj.weight") || ends_with("up_proj.weight")) {
    out_range(t.inter0, t.inter);
  } else if (ends_with("o_proj.weight")) {
    b.col0 = t.q_head0 * D;
    b.cols = t.q_heads * D;
  } else if (ends_with("down_proj.weight")) {
    b.col0 = t.inter0;
    b.cols = t.inter;
  } else if (name == "model.embed_tokens.weight" || name == "lm_head.weight") {
    out_range(t.vocab0, t.vocab);
  }  // else replicated: norms, q/k norms
  return b;
}

Tensor tp_weight_slice(const Tensor& whole, const std::string& name, const ModelConfig& c,
                       TpShard s) {
  PA_CHECK(whole.dtype() == DType::f32 && whole.device() == Device::cpu, "tp_weight_slice: ", name,
           " must be a host f32 tensor");
  const TpBlock b = tp_block(name, whole.shape(), c, s);
  std::vector<int64_t> shape = whole.shape();
  if (shape.size() == 2) {
    shape = {b.rows, b.cols};
  } else {
    shape = {b.cols};
  }
  Tensor out = Tensor::empty(shape, DType::f32);
  const float* src = whole.data_as<float>();
  float* dst = out.data_as<float>();
  for (int64_t r = 0; r < b.rows; ++r) {
    std::memcpy(dst + r * b.cols, src + (b.row0 + r) * b.whole_cols + b.col0,
                size_t(b.cols) * sizeof(float));
  }
  return out;
}

}  // namespace pagedattn
