// The dot-product kernels behind quant_matmul.h, one table per ISA. Internal to src/model.
//
// Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 (x16 layout, quant_pack.h): a kernel takes one group of 16
// weight rows and R (1..kMaxGroupRows) activation rows and gives the 16 x R dot products. Every ISA
// computes the same function, for weight row j and activation row r:
//
//   acc = 0, mn = 0
//   for each block b of 32 values, in order:
//     isum = the exact integer dot of the block's quants with the activation's int8 block
//            (Q4_0: nibbles times x minus 8 * sum of x; Q4_1: nibbles times x; Q5_0 / Q5_1: the
//            same with 5-bit quants, Q5_0 minus 16 * sum of x; Q8_0: q times x)
//     acc  = fma(float(isum), d_w[j] * d_x[r][b], acc)
//     mn   = fma(m_w[j], s_x[r][b], mn)            (Q4_1, Q5_1: the blocks' minimums)
//   out  = acc + mn
//
// The integer sums are exact whichever instructions form them, and the float operations are the
// same sequence everywhere, so the ISA changes speed, never results; nor does R, or where a row
// sits in the batch.
//
// F32 (and F16/BF16 dequantised a tile at a time): out = dot of w and x row r over 8 f32 lanes
// (lane j holds values i with i % 8 == j, one fused multiply-add each), then hsum8.
#pragma once

#include <cstdint>

namespace pagedattn::cpu::qk {

constexpr int kMaxRows = 4;       // activation rows per call of an f32 or K-quant kernel
constexpr int kMaxGroupRows = 8;  // activation rows per call of an x16 group kernel
constexpr int64_t kBlock = 32;  // activation block (values per int8 scale)
constexpr int kGroup = 16;      // weight rows per group (quant_pack.h)
constexpr int kRowTile = 8;     // weight rows per call of a K-quant kernel

// R activation rows in int8 blocks: row r's values at q + r * k, its scales at d + r * nb, its
// block sums d * sum(q) at s + r * nb and the integer sums at sum + r * nb.
struct ActRows {
  const int8_t* q;
  const float* d;
  const float* s;
  const int32_t* sum;
  int64_t k, nb;
};

// out[r * 16 + j] = dot(row j of the x16 group at `group`, activation row r), r < R.
using GroupDotFn = void (*)(const uint8_t* group, const ActRows& a, int R, float* out);
// K-quants (file layout): out[r * kRowTile + i] = dot(weight row i at w + i * row_bytes,
// activation row r), i < nrows (1..kRowTile), r < R. Per sub-block an exact integer sum, then the
// same float operations in the same order for each row on every ISA (quant_dot_generic.cpp writes
// them out for one row; the x86 kernels run kRowTile rows' chains side by side in vector lanes).
using RowsDotFn = void (*)(const uint8_t* w, int64_t row_bytes, int nrows, const ActRows& a, int R,
                           float* out);
// out[r] = dot(w [k], x + r * ldx [k]), r < R.
using FDotFn = void (*)(const float* w, const float* x, int64_t ldx, int64_t k, int R, float* out);
// One row x [nb * 32] into int8 blocks, the same bits on every ISA: per block d = max|x| / 127,
// q = round-to-nearest-even(x * (1 / d)) (0 where d = 0), sum = the sum of q, s = d * sum.
using QuantizeFn = void (*)(const float* x, int64_t nb, int8_t* q, float* d, float* s,
                            int32_t* sum);

struct Kernels {
  const char* name;
  GroupDotFn q4_0, q4_1, q8_0, q5_0, q5_1, q4_k, q5_k;
  RowsDotFn q6_k;
  FDotFn f32;
  QuantizeFn quantize;
};

const Kernels& generic_kernels();
// Null when the build or the CPU lacks them: AVX2 + FMA + F16C, and the same with the 256-bit
// VNNI byte dot products (AVX-VNNI, or AVX-512 VNNI with VL).
const Kernels* avx2_kernels();
const Kernels* avxvnni_kernels();
const Kernels* avx512vnni_kernels();

// Q4_K sub-block j's 6-bit scale and min from the block's 12 scale bytes s.
inline void q4_k_scale_min(const uint8_t* s, int j, int& sc, int& mn) {
  if (j < 4) {
    sc = s[j] & 63;
    mn = s[j + 4] & 63;
  } else {
    sc = (s[j + 4] & 0xf) | ((s[j - 4] >> 6) << 4);
    mn = (s[j + 4] >> 4) | ((s[j] >> 6) << 4);
  }
}

// The fixed final reduction of the 8 lanes.
inline float hsum8(const float* l) {
  return ((l[0] + l[1]) + (l[2] + l[3])) + ((l[4] + l[5]) + (l[6] + l[7]));
}

}  // namespace pagedattn::cpu::qk
