// Decode steps padded to a few row counts (decode_padding.h).
#include "decode_padding.h"

#include "pagedattn/error.h"

namespace pagedattn {

int32_t padded_decode_rows(int32_t n) {
  PA_CHECK(n >= 0, "padded_decode_rows: n = ", n, " is negative");
  auto up = [n](int32_t m) { return int32_t((int64_t(n) + m - 1) / m * m); };
  if (n <= 2) return n;
  if (n <= 4) return 4;
  if (n <= 64) return up(8);
  if (n <= 256) return up(32);
  return up(64);
}

bool is_decode_batch(const ForwardBatch& b) {
  if (b.seqs.empty() || b.q_indptr.size() != b.seqs.size() + 1) return false;
  for (size_t s = 0; s < b.seqs.size(); ++s)
    if (b.q_indptr[s + 1] - b.q_indptr[s] != 1) return false;
  return true;
}

ForwardBatch pad_decode_batch(const ForwardBatch& b, int32_t rows) {
  const int32_t n = int32_t(b.seqs.size());
  PA_CHECK(is_decode_batch(b), "pad_decode_batch: not a decode batch (one new token a sequence)");
  PA_CHECK(rows >= n, "pad_decode_batch: ", rows, " rows are fewer than the batch's ", n);
  PA_CHECK(b.max_pages >= 1 && b.block_table.size() == size_t(n) * size_t(b.max_pages) &&
               b.kv_len.size() == size_t(n) && b.tokens.size() == size_t(n) &&
               b.positions.size() == size_t(n) && b.slots.size() == size_t(n),
           "pad_decode_batch: the batch's layout is not set");
  ForwardBatch p = b;
  const int32_t page = b.block_table[0];  // b's first sequence's first page
  const int32_t extra = rows - n;
  p.seqs.resize(size_t(rows), b.seqs[0]);
  p.kv_len.resize(size_t(rows), 1);
  p.block_table.resize(size_t(rows) * size_t(b.max_pages), 0);
  for (int32_t i = 0; i < extra; ++i) {
    p.q_indptr.push_back(n + i + 1);
    p.tokens.push_back(0);
    p.positions.push_back(0);
    p.slots.push_back(-1);
    if (!b.logit_rows.empty()) p.logit_rows.push_back(n + i);
    p.block_table[size_t(n + i) * size_t(b.max_pages)] = page;
  }
  return p;
}

}  // namespace pagedattn
