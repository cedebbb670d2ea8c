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
//            same with 5-bit quants, Q5_0 minus 16 * sum of x; IQ4_NL: kIq4nl[nibble] times x;
//            Q8_0: q times x)
//     acc  = fma(float(isum), d_w[j] * d_x[r][b], acc)
//     mn   = fma(m_w[j], s_x[r][b], mn)            (Q4_1, Q5_1: the blocks' minimums)
//   out  = acc + mn
//
// Q4_K / Q5_K / Q6_K (x16 layout too, one block = 256 values), per 32 values b of a block
// (quant_dot_generic.cpp writes it out for one row):
//     Q4_K, Q5_K: sub-block b of 6-bit scale sc and minimum mn, isum its exact integer sum
//       acc = acc + (d * sc) * (d_x[b] * isum);  acc = acc - (dmin * mn) * s_x[b]
//     Q6_K: two 16-value sub-blocks of int8 scales sc0, sc1, exact sums isum0, isum1 of (q - 32) x
//       acc = acc + (d * sc0) * (d_x[b] * isum0);  acc = acc + (d * sc1) * (d_x[b] * isum1)
//   separate multiplies and adds, out = acc.
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

constexpr int kMaxRows = 4;       // activation rows per call of an f32 kernel
constexpr int kMaxGroupRows = 8;  // activation rows per call of an x16 group kernel
constexpr int64_t kBlock = 32;  // activation block (values per int8 scale)
constexpr int kGroup = 16;      // weight rows per group (quant_pack.h)

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
// out[r] = dot(w [k], x + r * ldx [k]), r < R.
using FDotFn = void (*)(const float* w, const float* x, int64_t ldx, int64_t k, int R, float* out);
// One row x [nb * 32] into int8 blocks, the same bits on every ISA: per block d = max|x| / 127,
// q = round-to-nearest-even(x * (1 / d)) (0 where d = 0), sum = the sum of q, s = d * sum.
using QuantizeFn = void (*)(const float* x, int64_t nb, int8_t* q, float* d, float* s,
                            int32_t* sum);

struct Kernels {
  const char* name;
  GroupDotFn q4_0, q4_1, q8_0, q5_0, q5_1, q4_k, q5_k, q6_k, iq4_nl;
  FDotFn f32;
  QuantizeFn quantize;
};

const Kernels& generic_kernels();
// Null when the build or the CPU lacks them: AVX2 + FMA + F16C, and the same with the 256-bit
// VNNI byte dot products (AVX-VNNI, or AVX-512 VNNI with VL).
const Kernels* avx2_kernels();
const Kernels* avxvnni_kernels();
const Kernels* avx512vnni_kernels();

// Q4_K (and Q5_K) sub-block j's (0..7) 6-bit scale and min from the block's 12 scale bytes s:
// sub-blocks 0-3 keep theirs in the low 6 bits of bytes j (scale) and j+4 (min); sub-blocks 4-7 put
// their low 4 bits in the nibbles of byte j+4 and their top 2 bits in the spare top bits of bytes
// j-4 and j. (Also dequant.cpp's.)
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
