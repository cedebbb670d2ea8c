// The scheduler's part in tests that drive a model runner directly: reserves slots for each
// sequence's new tokens (KvCache::append_slots) and builds the step's ForwardBatch, positions
// continuing from each kv_len; logit rows are each sequence's last new token, or every row with
// all_logits. Checks first that all the pages fit (Error, nothing reserved). The library's steps
// come from the Scheduler alone.
#pragma once

#include <cstdint>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"

namespace pagedattn {

inline ForwardBatch make_step_batch(KvCache& cache, const std::vector<SeqId>& seqs,
                                    const std::vector<std::vector<int32_t>>& new_tokens,
                                    bool all_logits = false) {
  PA_CHECK(seqs.size() == new_tokens.size(), "make_step_batch: ", seqs.size(),
           " seqs but new_tokens for ", new_tokens.size());
  int64_t pages = 0;
  for (size_t s = 0; s < seqs.size(); ++s) {
    PA_CHECK(cache.has_sequence(seqs[s]), "make_step_batch: seqs[", s, "] = ", seqs[s],
             " is not in the cache");
    pages += cache.pages_needed(seqs[s], int32_t(new_tokens[s].size()));
  }
  const KvCacheStats st = cache.stats();
  PA_CHECK(pages <= int64_t(st.pages_free) + st.pages_cached, "make_step_batch: new_tokens need ",
           pages, " pages but only ", st.pages_free + st.pages_cached, " are available");
  ForwardBatch b;
  b.seqs = seqs;
  b.q_indptr.push_back(0);
  for (size_t s = 0; s < seqs.size(); ++s) {
    const int32_t start = cache.kv_len(seqs[s]);
    const std::vector<int32_t> slots = cache.append_slots(seqs[s], new_tokens[s]);
    for (size_t j = 0; j < new_tokens[s].size(); ++j) {
      if (all_logits || j + 1 == new_tokens[s].size())
        b.logit_rows.push_back(int32_t(b.tokens.size()));
      b.tokens.push_back(new_tokens[s][j]);
      b.positions.push_back(start + int32_t(j));
      b.slots.push_back(slots[j]);
    }
    b.q_indptr.push_back(int32_t(b.tokens.size()));
  }
  set_attention_layout(b, cache);
  return b;
}

}  // namespace pagedattn
