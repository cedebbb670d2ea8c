// Requests and their sequences: what a caller submits, what the engine tracks,
// what comes back.
//
// A request holds one prompt and its sampling parameters. It becomes one
// sequence while its prompt is prefilled; with n > 1 the sequence is forked
// after the prompt (KvCache::fork: the prompt's pages are shared, not copied)
// into n sequences that sample independently.
//
// best_of > n samples best_of sequences the same way and returns the n with the highest cumulative
// log-probability. use_beam_search keeps the beam_width best partial sequences by cumulative
// log-probability each step (a beam kept twice forks, one not kept is freed at once) and returns
// the n best finished ones by sum_logprob / generated_len^length_penalty. Both hold their output
// back until the request finishes (they cannot stream).
//
// Each sequence knows how many of its tokens exist (prompt + generated) and how
// many are computed (their K/V are in the cache). Every step the scheduler lets
// the second catch up with the first; chunked prefill, prefix hits (computed
// starts above 0) and preemption (computed drops to 0) all follow from that one
// rule.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "pagedattn/json_grammar.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/sample_plan.h"
#include "pagedattn/sampling.h"

namespace pagedattn {

using RequestId = int64_t;

enum class FinishReason : uint8_t { none, stop, length, cancelled };
const char *finish_reason_name(FinishReason r);  // "", "stop", "length", "cancelled"

struct Request {
  std::vector<int32_t> prompt;
  SamplingParams sampling;       // temperature, top-k/p, stop ids and strings (its
                                 // seed is ignored)
  std::optional<uint64_t> seed;  // repeatable sampling; sequence i draws from a stream of (seed, i)
  int32_t n = 1;                 // sequences (parallel sampling), 1 .. kMaxSequences
  int32_t max_tokens = 16;       // generated tokens per sequence, >= 1
  bool ignore_eos = false;
  std::string cache_salt;  // requests with different salts never share cached pages
  // Candidates sampled, best n returned (0: n). n <= best_of <= kMaxSequences.
  int32_t best_of = 0;
  // Beam search (temperature, top-k/p, min-p, repetition penalty and seed are ignored; stop
  // tokens, stop strings, eos and max_tokens end a beam). Width: beam_width, else best_of, else n;
  // n <= width <= kMaxBeamWidth.
  bool use_beam_search = false;
  int32_t beam_width = 0;
  float length_penalty = 1.f;  // beam score = sum_logprob / generated_len^length_penalty
  // The logits of every position the request computes come back with its outputs
  // (SequenceOutput::logits): each prompt token's row, then one row per generated token that is
  // fed back (parity checks against another implementation). One sequence only (n = 1, no beam
  // search or best_of); the steps download logits (never Model::forward_greedy).
  bool return_logits = false;
  // Teacher forcing: generated token i is forced_tokens[i] while there are any (the sampler's
  // choice is dropped), so logits can be compared along another implementation's tokens. Needs
  // return_logits.
  std::vector<int32_t> forced_tokens;

  static constexpr int32_t kMaxSequences = 16;
  static constexpr int32_t kMaxBeamWidth = 8;

  int32_t width() const {
    return beam_width > 0 ? beam_width : (best_of > 0 ? std::max(best_of, n) : n);
  }
  // Sequences the request generates at once after its prompt.
  int32_t num_sequences() const { return use_beam_search ? width() : std::max(best_of, n); }
  // Output held back until the request finishes (best_of > n, or beam search).
  bool holds_output() const { return use_beam_search || best_of > n; }
};

// What changed in one sequence since the last output.
struct SequenceOutput {
  int32_t index = 0;
  std::vector<int32_t> new_tokens;
  std::string new_text;
  FinishReason finish = FinishReason::none;
  double cumulative_logprob = 0;  // of the sequence so far (see Sequence::cumulative_logprob)
  std::vector<float> logits;  // Request::return_logits: new rows [rows, vocab], in position order
  // SamplingParams::logprobs >= 0: one per new token (the model's raw log-probabilities of the
  // token and of its `logprobs` most likely alternatives).
  std::vector<TokenLogprobs> logprobs;
};

struct RequestOutput {
  RequestId id = 0;
  std::vector<SequenceOutput> seqs;  // only sequences with news
  int32_t prompt_tokens = 0;
  int32_t cached_tokens = 0;      // prompt tokens reused from the prefix cache
  int32_t completion_tokens = 0;  // generated so far, all sequences
  bool finished = false;          // every sequence finished: the last output of the request
  std::string error;              // set when the engine failed the request
};

using OutputCallback = std::function<void(const RequestOutput &)>;

}  // namespace pagedattn
