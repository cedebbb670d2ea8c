// Packing Q4_0 / Q4_1 / Q5_0 / Q5_1 / Q8_0 / Q4_K / Q5_K / Q6_K matrices into the x16 layout
// (quant_pack.h), and reading rows back.
#include "quant_pack.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <cstring>

#include "pagedattn/error.h"

namespace pagedattn::cpu {

namespace {

// A file block: `header` bytes of f16 fields, then `quants` bytes (Q6_K: the quants first, its f16
// field last; the group-block puts the f16 fields first either way).
struct BlockShape {
  int64_t bytes, header, quants;
  bool header_last = false;
};

BlockShape block_shape(GGMLType t) {
  switch (t) {
    case GGMLType::q4_0:
      return {18, 2, 16};
    case GGMLType::q4_1:
      return {20, 4, 16};
    case GGMLType::q8_0:
      return {34, 2, 32};
    case GGMLType::iq4_nl:
      return {18, 2, 16};
    case GGMLType::q5_0:  // qh (4 bytes) and the nibbles: chunk 0 is the row's fifth bits
      return {22, 2, 20};
    case GGMLType::q5_1:
      return {24, 4, 20};
    case GGMLType::q4_k:  // d, dmin; then the scales and nibbles (Q5_K: and qh) in chunks
      return {144, 4, 140};
    case GGMLType::q5_k:
      return {176, 4, 172};
    case GGMLType::q6_k:  // ql, qh, scales in chunks; d last in the file
      return {210, 2, 208, true};
    default:
      fail("x16 layout: type ", ggml_type_name(uint32_t(t)), " is not packed");
  }
}

// One group-block from the 8 file blocks rows[j] (null: a padding row, all zero).
void pack_block(const BlockShape& s, const uint8_t* const* rows, uint8_t* out) {
  std::memset(out, 0, size_t(kGroupRows * s.bytes));
  const int64_t h0 = s.header_last ? s.quants : 0, q0 = s.header_last ? 0 : s.header;
  for (int j = 0; j < kGroupRows; ++j) {
    const uint8_t* blk = rows[j];
    if (!blk) continue;
    for (int64_t f = 0; f < s.header / 2; ++f)
      std::memcpy(out + f * 2 * kGroupRows + 2 * j, blk + h0 + 2 * f, 2);
    uint8_t* quants = out + kGroupRows * s.header;
    for (int64_t c = 0; c < s.quants / 4; ++c)
      std::memcpy(quants + 4 * kGroupRows * c + 4 * j, blk + q0 + 4 * c, 4);
  }
}

// The file block of row j of a group-block.
void unpack_block(const BlockShape& s, const uint8_t* in, int j, uint8_t* blk) {
  const int64_t h0 = s.header_last ? s.quants : 0, q0 = s.header_last ? 0 : s.header;
  for (int64_t f = 0; f < s.header / 2; ++f)
    std::memcpy(blk + h0 + 2 * f, in + f * 2 * kGroupRows + 2 * j, 2);
  const uint8_t* quants = in + kGroupRows * s.header;
  for (int64_t c = 0; c < s.quants / 4; ++c)
    std::memcpy(blk + q0 + 4 * c, quants + 4 * kGroupRows * c + 4 * j, 4);
}

// Hands the whole pages of [from, to) back (clean pages of a private file mapping: a later read
// faults them in again from the file).
void release_pages(const uint8_t* from, const uint8_t* to) {
  const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const uintptr_t a = (uintptr_t(from) + page - 1) / page * page, b = uintptr_t(to) / page * page;
  if (b > a) madvise(reinterpret_cast<void*>(a), b - a, MADV_DONTNEED);
}

}  // namespace

bool x16_packable(GGMLType t) {
  return t == GGMLType::q4_0 || t == GGMLType::q4_1 || t == GGMLType::q8_0 ||
         t == GGMLType::q5_0 || t == GGMLType::q5_1 || t == GGMLType::q4_k || t == GGMLType::q5_k ||
         t == GGMLType::q6_k || t == GGMLType::iq4_nl;
}

PackedWeight pack_x16(const WeightView& w, bool release_source) {
  if (!x16_packable(w.type) || w.x16) return {w, nullptr};
  const BlockShape s = block_shape(w.type);
  const int64_t per_block = ggml_block_size(w.type);
  const int64_t nb = w.cols / per_block, groups = (w.rows + kGroupRows - 1) / kGroupRows;
  PA_CHECK(w.cols % per_block == 0 && w.row_bytes == nb * s.bytes, "x16 layout: ",
           ggml_type_name(uint32_t(w.type)), " matrix of ", w.cols, " columns has rows of ",
           w.row_bytes, " bytes");
  const size_t total = size_t(groups * kGroupRows * w.row_bytes);
  std::shared_ptr<uint8_t[]> buf(new uint8_t[total]);
  const uint8_t* released = w.data;
  constexpr int64_t kReleaseBytes = int64_t(1) << 20;
  for (int64_t g = 0; g < groups; ++g) {
    const uint8_t* rows[kGroupRows];
    uint8_t* out = buf.get() + g * kGroupRows * w.row_bytes;
    for (int64_t b = 0; b < nb; ++b) {
      for (int j = 0; j < kGroupRows; ++j) {
        const int64_t r = g * kGroupRows + j;
        rows[j] = r < w.rows ? w.data + r * w.row_bytes + b * s.bytes : nullptr;
      }
      pack_block(s, rows, out + b * kGroupRows * s.bytes);
    }
    const uint8_t* done = w.data + std::min(w.rows, (g + 1) * kGroupRows) * w.row_bytes;
    if (release_source && (done - released >= kReleaseBytes || g + 1 == groups)) {
      release_pages(released, done);
      released = done;
    }
  }
  PackedWeight p;
  p.view = w;
  p.view.data = buf.get();
  p.view.x16 = true;
  p.storage = std::shared_ptr<const uint8_t>(buf, buf.get());
  return p;
}

void x16_file_row(const WeightView& w, int64_t r, uint8_t* dst) {
  const BlockShape s = block_shape(w.type);
  const int64_t nb = w.cols / ggml_block_size(w.type), g = r / kGroupRows;
  const uint8_t* group = w.data + g * kGroupRows * w.row_bytes;
  for (int64_t b = 0; b < nb; ++b)
    unpack_block(s, group + b * kGroupRows * s.bytes, int(r % kGroupRows), dst + b * s.bytes);
}

}  // namespace pagedattn::cpu
