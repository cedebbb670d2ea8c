// What the CPU runner's matrix products read: a weight matrix in its file's format, in place, and
// the activations (src/model/quant_matmul.h has the products).
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/gguf.h"

namespace pagedattn::cpu {

// Row r of the matrix is at data + r * row_bytes: cols values in blocks of `type`; or, with x16,
// the rows interleaved sixteen at a time (src/model/quant_pack.h), group g at
// data + g * 16 * row_bytes.
struct WeightView {
  GGMLType type = GGMLType::f32;
  int64_t rows = 0, cols = 0;  // [rows (out features), cols (in features)]
  int64_t row_bytes = 0;       // bytes of one row of blocks in the file layout
  const uint8_t* data = nullptr;
  bool x16 = false;
};

// Activations x [m, k] and, made on first need and reused by every weight that reads the same x,
// their int8 blocks: q [m, k], d [m, k / 32] (scale), s [m, k / 32] (d * sum of the block's q),
// sum [m, k / 32] (the integer sum of the block's q).
class MatmulInput {
 public:
  void set(const float* x, int64_t m, int64_t k);
  const float* x() const { return x_; }
  int64_t m() const { return m_; }
  int64_t k() const { return k_; }
  // The int8 blocks (computed on the first call after set).
  const int8_t* q();
  const float* d() const { return d_.data(); }
  const float* s() const { return s_.data(); }
  const int32_t* sum() const { return sum_.data(); }

 private:
  const float* x_ = nullptr;
  int64_t m_ = 0, k_ = 0;
  bool quantized_ = false;
  std::vector<int8_t> q_;
  std::vector<float> d_, s_;
  std::vector<int32_t> sum_;
};

}  // namespace pagedattn::cpu
