// Log-probabilities of the model's logits and the beam-selection rule (private to the engine).
//
// Log-softmax is computed in double from the raw logits (before temperature or penalties), as
// the OpenAI API reports logprobs.
#pragma once

#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace pagedattn::beam {

struct TokenLogprob {
  int32_t token = 0;
  double logprob = 0;
};

// log_softmax(logits)[token]. logits: [vocab].
double token_logprob(std::span<const float> logits, int32_t token);
// The k most likely tokens (k capped at the vocabulary), most likely first, ties by lower id.
// logits: [vocab].
std::vector<TokenLogprob> top_logprobs(std::span<const float> logits, int32_t k);

// score = sum_logprob / generated_len^length_penalty (generated_len >= 1; 0 tokens: the sum).
double score(double sum_logprob, int32_t generated_len, double length_penalty);

struct Candidate {
  int32_t beam = 0;        // index of the live beam it extends
  int32_t token = 0;       // the token appended
  double cum_logprob = 0;  // the beam's cumulative logprob plus the token's
};

// One beam step: candidates ranked by cumulative logprob (ties: lower beam, then lower token).
// Going down the ranking, a candidate whose token ends a sequence (ends(token)) is kept when its
// rank is below width (it finishes); any other is kept while fewer than width continuing beams
// are kept. Returns the kept candidates in rank order.
std::vector<Candidate> select(std::vector<Candidate> candidates, int32_t width,
                              const std::function<bool(int32_t)> &ends);

}  // namespace pagedattn::beam
