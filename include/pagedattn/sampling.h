// Picking the next token from a row of logits, and stopping on token ids or strings.
//
// The order follows Hugging Face and vLLM: repetition penalty, logit bias, presence and frequency
// penalties on the raw logits, then (temperature 0: argmax) temperature, softmax, top-k, top-p on
// what top-k left (renormalised), min-p, and a draw from the renormalised survivors with a seeded
// RNG (the same seed gives the same tokens). A constraint (json_object) removes its forbidden
// tokens before all of it.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace pagedattn {

struct SamplingParams {
  float temperature = 1.f;         // >= 0; 0: greedy (argmax, lowest id on ties)
  int32_t top_k = 0;               // <= 0: off; else keep the k most likely
  float top_p = 1.f;               // (0, 1]; keep the smallest most-likely set with mass >= top_p
  float min_p = 0.f;               // [0, 1]; drop tokens with p < min_p * max p
  float repetition_penalty = 1.f;  // > 0; 1: off (CTRL: logit > 0 ? logit / r : logit * r)
  // OpenAI's penalties, in [-2, 2], over the generated tokens only (c[t]: times t was generated):
  // logit[t] -= c[t] * frequency_penalty + (c[t] > 0) * presence_penalty.
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  // OpenAI's logit_bias: (token, bias in [-100, 100]) added to the logit; +-100 bans or forces.
  std::vector<std::pair<int32_t, float>> logit_bias;
  // The output is one JSON object: tokens that would leave no valid JSON prefix are never drawn,
  // and the sequence ends once the object is complete (JsonPrefix, json_grammar.h).
  bool json_object = false;
  uint64_t seed = 0;
  // -1: no log-probabilities; 0..20: each generated token's log-probability under the model's raw
  // distribution and that many most likely alternatives' (sample_plan.h).
  int32_t logprobs = -1;
  std::vector<int32_t> stop_token_ids;  // generation ends after emitting one (not shown)
  std::vector<std::string> stop;        // stop strings, matched on the decoded text and trimmed
};

// Throws Error ("sampling: <field> ...") for a value out of range.
void validate_sampling_params(const SamplingParams& params);

// Adds logit_bias and applies the presence and frequency penalties in place; output: the generated
// tokens. Throws Error for a token outside the vocabulary.
void apply_openai_penalties(std::span<float> logits, const SamplingParams& params,
                            std::span<const int32_t> output);

// Applies the CTRL repetition penalty in place to every distinct token of history.
// logits: [vocab]. Throws Error for a token outside the vocabulary or a penalty <= 0.
void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> history,
                              float penalty);

// The index of the largest value, the lowest one on ties; NaNs never win (0 when x[0] is NaN or x
// is empty). Vectorised: a greedy step over a 128K vocabulary takes tens of microseconds, not
// the half millisecond of a loop that reloads the best value at every element.
int32_t argmax(std::span<const float> x);

struct TokenProb {
  int32_t token;
  double prob;
};

// The distribution sample() draws from: the surviving tokens, most likely first (ties: lower id
// first), probabilities summing to 1. Greedy (temperature 0) gives the argmax with probability 1.
// history: prompt and output; its tokens from prompt_len on are the output that the presence and
// frequency penalties count.
std::vector<TokenProb> sampling_distribution(std::span<const float> logits,
                                             const SamplingParams& params,
                                             std::span<const int32_t> history,
                                             size_t prompt_len = 0);

// Draws tokens for one sequence from the stream of params.seed: generated token n uses draw n
// (sample_plan.h's rule, so the same seed gives the same tokens here, batched, or on a GPU).
class Sampler {
 public:
  explicit Sampler(const SamplingParams& params);
  // logits: [vocab]; history: the ids the repetition penalty looks at (prompt and output so far);
  // history[prompt_len:] is the output (presence and frequency penalties).
  int32_t sample(std::span<const float> logits, std::span<const int32_t> history,
                 size_t prompt_len = 0) const;
  bool is_stop_token(int32_t token) const;
  const SamplingParams& params() const { return params_; }

 private:
  SamplingParams params_;
};

// Stop strings on streamed text. feed() takes each newly decoded piece and returns what is safe to
// show now: text that can no longer become part of a stop string. A suffix that might still grow
// into one is held back. Once a stop string appears, stopped() turns true and the text from the
// stop string on is dropped.
class StopStringMatcher {
 public:
  explicit StopStringMatcher(std::vector<std::string> stops);
  std::string feed(std::string_view text);
  // The held-back text, at the end of generation (empty once stopped).
  std::string flush();
  bool stopped() const { return stopped_; }

 private:
  std::vector<std::string> stops_;
  std::string pending_;
  bool stopped_ = false;
};

}  // namespace pagedattn
