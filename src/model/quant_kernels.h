// The dot-product kernels behind quant_matmul.h, one table per ISA. Internal to src/model.
//
// Every kernel computes, for R (1..kMaxRows) activation rows at once against one weight row, the
// same function: per block of 32 values an integer (or f32) partial sum in 8 lanes (lane j holds
// values 4j..4j+3 of the block; f32: lane j holds values i with i % 8 == j), folded into 8 f32
// accumulators with one fused multiply-add each, then hsum8 (and, for Q4_1, the block minimums).
// Taking R rows together only reuses the weight block; each row's arithmetic is unchanged.
#pragma once

#include <cstdint>

namespace pagedattn::cpu::qk {

constexpr int kMaxRows = 4;
constexpr int64_t kBlock = 32;  // activation block (values per int8 scale)

// R activation rows in int8 blocks: row r's values at q + r * k, its scales at d + r * nb and its
// block sums (d * sum of q) at s + r * nb.
struct ActRows {
  const int8_t* q;
  const float* d;
  const float* s;
  int64_t k, nb;
};

// out[r] = dot(weight row w, activation row r), r < R.
using QDotFn = void (*)(const uint8_t* w, const ActRows& a, int R, float* out);
// out[r] = dot(w [k], x + r * ldx [k]), r < R.
using FDotFn = void (*)(const float* w, const float* x, int64_t ldx, int64_t k, int R, float* out);

struct Kernels {
  const char* name;
  QDotFn q4_0, q4_1, q8_0;
  FDotFn f32;
};

const Kernels& generic_kernels();
// Null when the build has no AVX2 version (not x86-64 GCC/Clang).
const Kernels* avx2_kernels();

// The fixed final reduction of the 8 lanes.
inline float hsum8(const float* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

}  // namespace pagedattn::cpu::qk
