// Decode steps padded to a few row counts. A CUDA graph of a step replays only for steps with the
// same launches, and the launches take the step's row count by value; continuous batching changes
// the count at every arrival and finish, so a step keyed by its own count rarely repeats long
// enough to be captured and replayed. Padding every decode step to one of a few counts, with
// dummy rows that write nothing, makes most steps of a serving run replays.
#pragma once

#include <cstdint>

#include "pagedattn/model.h"

namespace pagedattn {

// The row count a decode step of n rows runs as: n up to 2, then 4, multiples of 8 up to 64,
// of 32 up to 256, of 64 beyond (at most 7, 31 or 63 dummy rows, never across 32: the CUDA
// products' kernels change there).
int32_t padded_decode_rows(int32_t n);

// Whether every sequence of b has exactly one new token (and there is one at least).
bool is_decode_batch(const ForwardBatch& b);

// b (a decode batch, its attention layout set) with rows - num_seqs dummy sequences after its own:
// token 0 at position 0, slot -1 (nothing is written), kv_len 1 over the first page of b's first
// sequence (a page of the pool whose position 0 is written before the step's attention reads it:
// finite values, read and never written), and a logit row each after b's where b has logit rows.
// The real rows keep their indices, so the first rows of every output are b's.
ForwardBatch pad_decode_batch(const ForwardBatch& b, int32_t rows);

}  // namespace pagedattn
