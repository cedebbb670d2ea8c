// A step's sampling as one plan for all of its logit rows: what a runner needs to pick each row's
// token where the logits are (Model::forward_sample), and the host twin that picks them from logits
// on the CPU with the same rules.
//
// Per row, in this order (sampling.h's order):
//   1. the row's edits, one per distinct token of the sequence's history or logit_bias:
//        l = repeat ? (l > 0 ? l / repetition_penalty : l * repetition_penalty) : l;
//        l += bias;  l -= count * frequency_penalty + (count > 0) * presence_penalty;
//   2. temperature 0 (or no finite maximum): the argmax of the edited row (lowest id on ties);
//      else e_i = exp((l_i - max l) / temperature), the survivors the k most likely (top-k, ties to
//      the lower id), of those the smallest most-likely set whose mass reaches top_p of theirs,
//      of those the ones with e_i >= min_p (the most likely always survives), and the token drawn
//      from the survivors in proportion to e_i: u = philox_uniform(seed, counter) in [0, 1), the
//      first survivor in ascending id order whose cumulative weight passes u * total;
//   3. log-probabilities (when asked) of the row as the model gave it, before any edit or filter
//      (log_softmax of the raw logits, as vLLM and OpenAI report them): the chosen token's, and
//      the `logprobs` most likely tokens' (ties to the lower id), most likely first.
// The draw depends only on (seed, counter) and the row: a seeded sequence gets the same tokens
// alone or batched, on the CPU or a GPU, up to rounding at a boundary between two tokens.
#pragma once

#include <cstdint>
#include <span>
#include <unordered_map>
#include <utility>
#include <vector>

#include "pagedattn/sampling.h"

namespace pagedattn {

// A uniform double in [0, 1) with 53 random bits: Philox4x32-10 (Salmon et al., 2011) keyed by
// `seed` at block `counter`. Counter-based: any draw of a stream is computed on its own, on the
// host or a device, so a sequence's n-th token uses draw n whatever else the step holds.
double philox_uniform(uint64_t seed, uint64_t counter);

// One distinct token of a sequence's history or logit_bias and what it does to that token's logit.
struct LogitEdit {
  int32_t token = 0;
  int32_t count = 0;   // times generated (presence and frequency penalties)
  float bias = 0.f;    // logit_bias
  int32_t repeat = 0;  // 1: in the prompt or the output (the repetition penalty applies)
};

// The logprobs of one generated token: the chosen token's and the most likely alternatives'.
struct TokenLogprobs {
  int32_t token = 0;
  double logprob = 0.0;
  std::vector<std::pair<int32_t, double>> top;  // (token, logprob), most likely first
};

constexpr int32_t kMaxLogprobs = 20;  // OpenAI's top_logprobs bound

struct RowSampling {
  float temperature = 0.f;
  int32_t top_k = 0;  // <= 0 or >= vocab: off
  float top_p = 1.f;
  float min_p = 0.f;
  float repetition_penalty = 1.f;
  float presence_penalty = 0.f;
  float frequency_penalty = 0.f;
  uint64_t seed = 0;
  uint64_t counter = 0;  // the draw: the index of the token among the sequence's generated ones
  int32_t logprobs = -1;  // -1: none; 0..kMaxLogprobs: the chosen token's and that many top ones
  int32_t edit_begin = 0, edit_end = 0;  // its edits in SamplePlan::edits
};

struct SamplePlan {
  std::vector<RowSampling> rows;  // one per logit row of the step
  std::vector<LogitEdit> edits;   // each row's name distinct tokens (LogitEditor keeps them so)

  int32_t max_logprobs() const;  // the largest rows[i].logprobs (-1: none asks)
};

// The edits a sequence's history and logit_bias make, kept as tokens are generated (one entry per
// distinct token; the prompt's tokens only when the repetition penalty is on).
class LogitEditor {
 public:
  LogitEditor() = default;
  LogitEditor(const SamplingParams& params, std::span<const int32_t> prompt);
  void add_output(int32_t token);
  const std::vector<LogitEdit>& edits() const { return edits_; }

 private:
  LogitEdit& entry(int32_t token);
  std::vector<LogitEdit> edits_;
  std::unordered_map<int32_t, int32_t> where_;  // token -> index in edits_
  bool history_ = false;                        // penalties that look at the history are on
};

// The row description of a sequence whose next token is generated token `counter`.
RowSampling row_sampling(const SamplingParams& params, uint64_t counter, int32_t logprobs);

// Checks a plan against `rows` logit rows of a `vocab`-wide model (edit ranges, tokens inside the
// vocabulary, parameters in range). Error messages start with `op`.
void check_sample_plan(const SamplePlan& plan, int64_t rows, int64_t vocab, const char* op);

// Step 1 on one row in place.
void apply_logit_edits(std::span<float> logits, const RowSampling& row,
                       std::span<const LogitEdit> edits);

// The host twin of Model::forward_sample's picking: logits [rows, vocab] f32, one result per row
// (logprob and top only filled for rows that ask).
std::vector<TokenLogprobs> sample_rows(const float* logits, int64_t rows, int64_t vocab,
                                       const SamplePlan& plan);
// One row of it (edits applied to a copy of the row).
TokenLogprobs sample_row(std::span<const float> logits, const RowSampling& row,
                         std::span<const LogitEdit> edits);

// Step 3: the logprobs of `token` and of the n most likely tokens of a raw row.
TokenLogprobs token_logprobs(std::span<const float> raw, int32_t token, int32_t n);

// The survivors of step 2 for an edited row (temperature > 0), most likely first (ties: lower id
// first), probabilities summing to 1 (sampling_distribution's filters, without its edits).
std::vector<TokenProb> filtered_distribution(std::span<const float> edited, float temperature,
                                             int32_t top_k, float top_p, float min_p);
// The draw of step 2 from a distribution: the first token in ascending id order whose cumulative
// probability passes u (the last one when rounding leaves u past the total).
int32_t draw_in_id_order(std::vector<TokenProb> dist, double u);

// log(sum(exp(logits))) in double.
double log_sum_exp(std::span<const float> logits);

}  // namespace pagedattn
