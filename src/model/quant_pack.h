// The x8 layout of the Q4_0, Q4_1 and Q8_0 matrices the CPU runner multiplies: the file's own blocks
// (same scales, same quants, same bytes in all), with the rows interleaved eight at a time so that
// one vector instruction works on eight output rows at once and their eight scales load together.
//
// Rows go in groups of 8 (the last group padded with zero blocks). Group g holds, for every block
// column b in order, one group-block of 8 * (the format's block bytes):
//
//   header  the file block's f16 fields, field by field, 8 rows each:
//             Q4_0, Q8_0: d[8]          Q4_1: d[8] m[8]
//   quants  4-byte chunks, chunk c of row j at 32 * c + 4 * j:
//             Q4_0, Q4_1: chunks 0..3, bytes 4c..4c+3 of the row's 16 nibble bytes (low nibbles
//                         = values 4c..4c+3, high nibbles = values 16+4c..16+4c+3)
//             Q8_0:       chunks 0..7, values 4c..4c+3
//
// So lane j of a 32-byte chunk is row j, and a broadcast of 4 activation bytes meets 4 values of all
// 8 rows (quant_kernels.h). Group g starts at data + g * 8 * row_bytes.
#pragma once

#include <cstdint>
#include <memory>

#include "pagedattn/weight_view.h"

namespace pagedattn::cpu {

constexpr int kGroupRows = 8;

// Whether matrices of type t are kept in the x8 layout (Q4_0, Q4_1, Q8_0).
bool x8_packable(GGMLType t);

// A matrix in the layout matmul reads, and the memory that holds it.
struct PackedWeight {
  WeightView view;                        // view.x8 set when packed
  std::shared_ptr<const uint8_t> storage;  // null when view reads the source in place
};

// w packed into the x8 layout when its type is packable, else w itself (read in place). With
// release_source, w's data lies in a private read-only file mapping: the pages of it already
// packed are handed back to the kernel as packing goes (they stay in the file), so packing never
// holds a second copy of the whole matrix.
PackedWeight pack_x8(const WeightView& w, bool release_source = false);

// Row r of an x8 matrix in its file layout (row_bytes bytes, block after block).
void x8_file_row(const WeightView& w, int64_t r, uint8_t* dst);

}  // namespace pagedattn::cpu
