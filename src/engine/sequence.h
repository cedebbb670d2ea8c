// The engine's state of one sequence of a request (internal to the engine: the scheduler, the
// step loop and beam search share it).
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "pagedattn/json_grammar.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/request.h"
#include "pagedattn/sample_plan.h"
#include "pagedattn/sampling.h"

namespace pagedattn {

// The engine's state of one sequence of a request.
struct Sequence {
  RequestId request_id = 0;
  int32_t index = 0;            // within its request, 0 .. n-1 (beams: a running count)
  uint64_t order = 0;           // age: smaller is older (arrival, then index); preemption
                                // takes the largest
  std::vector<int32_t> tokens;  // prompt + generated
  int32_t prompt_len = 0;
  std::string cache_salt;
  int32_t num_computed = 0;  // tokens whose K/V are in the cache
  // Length (prompt + generated) at which the sequence stops for sure: prompt + max_tokens, or
  // max_model_len if that comes first (0: unknown). exact_length: nothing else can stop it (EOS
  // ignored, no stop ids or strings), so it reaches max_length exactly. The scheduler's admission
  // forecasts growth from both.
  int32_t max_length = 0;
  bool exact_length = false;
  // Tokens that were computed before the last preemption: computing them again is recompute.
  int32_t recompute_until = 0;
  SeqId cache_seq = -1;  // -1 while it holds no cache state (waiting)
  // A preempted sequence swapped out: its computed tokens' K/V in host memory, put back at its
  // re-admission instead of computing them again.
  std::optional<SwappedKv> swapped;
  FinishReason finish = FinishReason::none;
  bool forked = false;  // n > 1: children were made from this sequence
  // Sum of log-softmax(logits)[token] over the generated tokens (tracked when the request has
  // more than one sequence or holds its output; 0 otherwise).
  double cumulative_logprob = 0;
  Sampler sampler;
  LogitEditor editor;  // its penalties' and logit_bias's edits (sample_plan.h)
  // SamplingParams::logprobs >= 0: the generated tokens' log-probabilities not yet handed out.
  std::vector<TokenLogprobs> new_logprobs;
  StopStringMatcher stop_matcher;
  std::optional<JsonPrefix> json;  // the output so far, with sampling.json_object
  std::string pending_bytes;       // decoded bytes of an incomplete UTF-8 character
  std::string new_text;            // text not yet handed out
  size_t tokens_sent = 0;          // generated tokens already handed out
  // Request::return_logits: every computed position has a logit row; rows not yet handed out
  // [rows, vocab] and the positions that already have one (a recompute after a preemption does
  // not repeat them).
  bool all_logit_rows = false;
  std::vector<float> new_logits;
  int32_t logit_positions_done = 0;

  explicit Sequence(const SamplingParams &params) : sampler(params), stop_matcher(params.stop) {}

  int32_t num_tokens() const { return int32_t(tokens.size()); }
  int32_t num_generated() const { return num_tokens() - prompt_len; }
  int32_t num_uncomputed() const { return num_tokens() - num_computed; }
  bool finished() const { return finish != FinishReason::none; }
};

}  // namespace pagedattn
