// The x16 layout of the Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, Q4_K, Q5_K and Q6_K matrices the CPU runner
// multiplies: the file's own
// blocks (same scales, same quants, same bytes in all), with the rows interleaved sixteen at a time
// so that one vector instruction works on 16 (AVX-512) or 8 (AVX2) output rows at once and their
// scales load together.
//
// Rows go in groups of 16 (the last group padded with zero blocks). Group g holds, for every block
// column b in order, one group-block of 16 * (the format's block bytes):
//
//   header  the file block's f16 fields, field by field, 16 rows each:
//             Q4_0, Q5_0, Q8_0, IQ4_NL: d[16]  Q4_1, Q5_1: d[16] m[16]
//             Q4_K, Q5_K: d[16] dmin[16] (one block: 256 values)   Q6_K: d[16] (last in the file)
//   quants  4-byte chunks, chunk c of row j at 64 * c + 4 * j:
//             Q4_0, Q4_1, IQ4_NL: chunks 0..3, bytes 4c..4c+3 of the row's 16 nibble bytes (low nibbles
//                         = values 4c..4c+3, high nibbles = values 16+4c..16+4c+3)
//             Q8_0:       chunks 0..7, values 4c..4c+3
//             Q5_0, Q5_1: chunk 0 the row's 32 fifth bits (bit i: value i), chunks 1..4 the
//                         nibbles as Q4_0's chunks 0..3
//             Q4_K:       chunks 0..2 the 12 scale bytes, 3..34 the 128 nibble bytes
//             Q5_K:       chunks 0..2 the scales, 3..10 the 32 qh bytes, 11..42 the nibbles
//             Q6_K:       chunks 0..31 ql, 32..47 qh, 48..51 the 16 int8 scales
//
// So lane j of a 64-byte chunk is row j, and a broadcast of 4 activation bytes meets 4 values of all
// 16 rows (quant_kernels.h). Group g starts at data + g * 16 * row_bytes.
#pragma once

#include <cstdint>
#include <memory>

#include "pagedattn/weight_view.h"

namespace pagedattn::cpu {

constexpr int kGroupRows = 16;

// Whether matrices of type t are kept in the x16 layout (every block format but F16/BF16/F32).
bool x16_packable(GGMLType t);

// A matrix in the layout matmul reads, and the memory that holds it.
struct PackedWeight {
  WeightView view;                        // view.x16 set when packed
  std::shared_ptr<const uint8_t> storage;  // null when view reads the source in place
};

// w packed into the x16 layout when its type is packable, else w itself (read in place). With
// release_source, w's data lies in a private read-only file mapping: the pages of it already
// packed are handed back to the kernel as packing goes (they stay in the file), so packing never
// holds a second copy of the whole matrix.
PackedWeight pack_x16(const WeightView& w, bool release_source = false);

// Row r of an x16 matrix in its file layout (row_bytes bytes, block after block).
void x16_file_row(const WeightView& w, int64_t r, uint8_t* dst);

}  // namespace pagedattn::cpu
