// Log-softmax of logits rows and the beam-selection rule.
#include "beam_search.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pagedattn/error.h"
#include "pagedattn/sample_plan.h"

namespace pagedattn::beam {

double token_logprob(std::span<const float> logits, int32_t token) {
  PA_CHECK(token >= 0 && size_t(token) < logits.size(), "token_logprob: token ", token,
           " is outside the vocabulary of ", logits.size());
  return double(logits[size_t(token)]) - log_sum_exp(logits);
}

std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t k) {
  PA_CHECK(k >= 0, "top_logprobs: k must be >= 0, got ", k);
  PA_CHECK(!logits.empty(), "top_logprobs: logits are empty");
  std::vector<TokenLogprob> out;
  for (const auto& [token, lp] : token_logprobs(logits, 0, k).top) out.push_back({token, lp});
  return out;
}

double score(double sum_logprob, int32_t generated_len, double length_penalty) {
  if (generated_len <= 0) return sum_logprob;
  return sum_logprob / std::pow(double(generated_len), length_penalty);
}

std::vector<Candidate> select(std::vector<Candidate> candidates, int32_t width,
                              const std::function<bool(int32_t)> &ends) {
  PA_CHECK(width >= 1, "beam select: width must be >= 1, got ", width);
  std::sort(candidates.begin(), candidates.end(), [](const Candidate &a, const Candidate &b) {
    if (a.cum_logprob != b.cum_logprob) return a.cum_logprob > b.cum_logprob;
    return a.beam != b.beam ? a.beam < b.beam : a.token < b.token;
  });
  std::vector<Candidate> kept;
  int32_t continuing = 0;
  for (size_t rank = 0; rank < candidates.size() && continuing < width; ++rank) {
    const Candidate &c = candidates[rank];
    if (ends(c.token)) {
      if (int64_t(rank) < width) kept.push_back(c);
    } else {
      kept.push_back(c);
      ++continuing;
    }
  }
  return kept;
}

}  // namespace pagedattn::beam
