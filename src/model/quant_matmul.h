// Matrix products y = x w^T over weights kept in their file's format (F32, F16, BF16, Q8_0, Q4_0,
// Q4_1, Q5_0, Q5_1, IQ4_NL, Q2_K-Q6_K): the block formats but Q2_K/Q3_K in the x16 layout
// (quant_pack.h, pack_x16 first), the others read in place.
//
// Two modes:
//   fast  (default): for the x16 formats, x is quantised per block of 32 values to int8 with one
//                    f32 scale (the scheme of these formats' own Q8_0), and each block (K-quants:
//                    each sub-block) pair is an integer dot product, then scaled; the others
//                    (F32/F16/BF16, Q2_K/Q3_K dequantised a tile at a time) use f32 x.
//   exact: f32 x against the weights dequantised to f32 (no activation rounding).
//
// Batch invariance by construction: every y[r][c] is one dot product of x row r and w row c whose
// order of operations is fixed by k alone (quant_kernels.h: block by block for the block formats,
// 8 f32 lanes then a fixed tree for F32), so a row's result is bit-identical whatever m is and
// wherever the row sits. Every ISA's kernels compute exactly the same function (the portable code
// replays it with std::fma), so the ISA changes speed, never results.
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include "pagedattn/weight_view.h"

namespace pagedattn::cpu {

enum class MatmulMode { fast, exact };

// y [m, n] = x [m, k] w^T, w [n, k]. Throws Error when the shapes disagree.
void matmul(MatmulInput& x, const WeightView& w, float* y, MatmulMode mode = MatmulMode::fast);
// Several products of the same x (q/k/v, gate/up) as one parallel job: y_i = x w_i^T.
struct MatmulOutput {
  const WeightView* w;
  float* y;  // [m, w->rows]
};
void matmul(MatmulInput& x, std::initializer_list<MatmulOutput> outs,
            MatmulMode mode = MatmulMode::fast);

// Row r of w dequantised into dst [cols] (embedding lookups).
void weight_row(const WeightView& w, int64_t r, float* dst);

// Which kernels matmul uses: "avxvnni", "avx512vnni", "avx2" or "generic" (the widest the CPU
// has; PAGEDATTN_CPU_ISA=generic forces the portable ones, =avx2 the AVX2 ones without VNNI).
const char* matmul_isa();
// Every table this CPU can run, widest first ("generic" last).
std::vector<std::string> matmul_isas();
// Tests: force one of matmul_isas() ("" goes back to the default). Throws Error for another name.
void set_matmul_isa(const std::string& name);

}  // namespace pagedattn::cpu
