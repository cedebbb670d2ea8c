// The step batch's attention layout and the one check of a batch that every runner makes.
#include <algorithm>
#include <unordered_set>

#include "pagedattn/error.h"
#include "pagedattn/model.h"

namespace pagedattn {

void set_attention_layout(ForwardBatch& b, const KvCache& cache) {
  size_t max_pages = 1;
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    PA_CHECK(cache.has_sequence(b.seqs[s]), "set_attention_layout: batch.seqs[", s, "] = ",
             b.seqs[s], " is not in the cache");
    max_pages = std::max(max_pages, cache.block_table(b.seqs[s]).size());
  }
  b.max_pages = int32_t(max_pages);
  b.kv_len.resize(b.seqs.size());
  b.block_table.assign(b.seqs.size() * max_pages, 0);
  for (size_t s = 0; s < b.seqs.size(); ++s) {
    b.kv_len[s] = cache.kv_len(b.seqs[s]);
    const auto table = cache.block_table(b.seqs[s]);
    std::copy(table.begin(), table.end(), b.block_table.begin() + ptrdiff_t(s * max_pages));
  }
}

BatchLayout attention_layout(const ForwardBatch& b) {
  BatchLayout layout;
  layout.num_seqs = int32_t(b.seqs.size());
  layout.q_indptr = b.q_indptr.data();
  layout.kv_len = b.kv_len.data();
  layout.block_table = b.block_table.data();
  layout.max_pages_per_seq = b.max_pages;
  return layout;
}

void check_forward_batch(const ForwardBatch& b, int32_t vocab_size, int32_t ps, int32_t num_pages,
                         const char* op, int32_t chained_rows) {
  const size_t num_seqs = b.seqs.size(), num_tokens = b.tokens.size();
  PA_CHECK(b.q_indptr.size() == num_seqs + 1, op, ": batch.q_indptr has ", b.q_indptr.size(),
           " entries, expected num_seqs + 1 = ", num_seqs + 1);
  PA_CHECK(b.q_indptr[0] == 0, op, ": batch.q_indptr[0] must be 0, got ", b.q_indptr[0]);
  for (size_t s = 0; s < num_seqs; ++s) {
    PA_CHECK(b.q_indptr[s + 1] >= b.q_indptr[s], op, ": batch.q_indptr decreases at ", s + 1);
  }
  PA_CHECK(size_t(b.q_indptr[num_seqs]) == num_tokens, op, ": batch.q_indptr ends at ",
           b.q_indptr[num_seqs], " but batch.tokens has ", num_tokens);
  PA_CHECK(b.positions.size() == num_tokens, op, ": batch.positions has ", b.positions.size(),
           " entries, batch.tokens ", num_tokens);
  PA_CHECK(b.slots.size() == num_tokens, op, ": batch.slots has ", b.slots.size(),
           " entries, batch.tokens ", num_tokens);
  for (size_t t = 0; t < num_tokens; ++t) {
    PA_CHECK(b.tokens[t] >= chained_token(chained_rows - 1) && b.tokens[t] < vocab_size, op,
             ": batch.tokens[", t, "] = ", b.tokens[t], " is outside the vocabulary of ",
             vocab_size,
             chained_rows > 0 ? " (and names no logit row of the pass begun before it)" : "");
  }
  for (size_t r = 0; r < b.logit_rows.size(); ++r) {
    PA_CHECK(b.logit_rows[r] >= 0 && size_t(b.logit_rows[r]) < num_tokens, op,
             ": batch.logit_rows[", r, "] = ", b.logit_rows[r], " is not a token row (", num_tokens,
             " tokens)");
  }
  PA_CHECK(b.kv_len.size() == num_seqs &&
               (num_seqs == 0 || (b.max_pages >= 1 &&
                                  b.block_table.size() == num_seqs * size_t(b.max_pages))),
           op, ": the batch's attention layout (kv_len ", b.kv_len.size(), ", block_table ",
           b.block_table.size(), ", max_pages ", b.max_pages, ") does not fit its ", num_seqs,
           " sequences (set_attention_layout builds it)");
  std::unordered_set<SeqId> seen;
  for (size_t s = 0; s < num_seqs; ++s) {
    const SeqId seq = b.seqs[s];
    PA_CHECK(seen.insert(seq).second, op, ": batch.seqs[", s, "] = ", seq, " appears twice");
    const int32_t kv = b.kv_len[s], q_len = b.q_indptr[s + 1] - b.q_indptr[s];
    PA_CHECK(q_len <= kv, op, ": sequence ", seq, " has ", q_len, " new tokens but kv_len ", kv,
             " (reserve their slots with append_slots first)");
    PA_CHECK(int64_t(b.max_pages) * ps >= kv, op, ": sequence ", seq, " has kv_len ", kv,
             " beyond its block table of ", b.max_pages, " pages");
    const int32_t* table = b.block_table.data() + s * size_t(b.max_pages);
    for (int32_t p = 0; p < (kv + ps - 1) / ps; ++p) {
      PA_CHECK(table[p] >= 0 && table[p] < num_pages, op, ": sequence ", seq, " has page ",
               table[p], " at block ", p, ", outside the pool of ", num_pages, " pages");
    }
    for (int32_t j = 0; j < q_len; ++j) {
      const size_t t = size_t(b.q_indptr[s] + j);
      const int32_t pos = kv - q_len + j;
      PA_CHECK(b.positions[t] == pos, op, ": batch.positions[", t, "] = ", b.positions[t],
               ", expected ", pos, " (kv_len - q_len + j of sequence ", seq, ")");
      const int32_t slot = table[pos / ps] * ps + pos % ps;
      PA_CHECK(b.slots[t] == slot, op, ": batch.slots[", t, "] = ", b.slots[t], ", expected ", slot,
               " (position ", pos, " of sequence ", seq, " in its block table)");
    }
  }
}

}  // namespace pagedattn
