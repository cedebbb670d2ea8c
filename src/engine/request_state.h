// The engine's state of one request (private to the engine).
#pragma once

#include <chrono>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "beam_search.h"
#include "pagedattn/engine.h"
#include "scheduler.h"
#include "sequence.h"

namespace pagedattn {

struct Engine::RequestState {
  using Clock = std::chrono::steady_clock;
  RequestId id = 0;
  Request req;
  uint64_t base_seed = 0;
  uint64_t base_order = 0;  // the prompt sequence's order; beams count up from it
  int32_t next_index = 1;   // beams: the index (and order offset) of the next fork
  Clock::time_point arrival;
  bool first_token_seen = false;
  bool cancelled = false;
  bool track_logprobs = false;  // more than one sequence or held output
  std::string error;
  int32_t cached_tokens = -1;  // known once the first chunk is scheduled
  std::vector<std::unique_ptr<Sequence>> seqs;
  std::vector<Clock::time_point> last_token;  // by sequence index
  std::vector<bool> finish_sent;              // by sequence index
  // Beam search: the top continuations of each live beam whose last token is computed; the
  // step runs once every live beam has them.
  std::map<const Sequence*, std::vector<beam::TokenLogprob>> beam_pending;

  // Each token is the argmax of its logits and nothing else reads them (no penalty, bias or
  // constraint, logprobs, forks or beams; Sampler::sample's greedy path keeps no state): a step may
  // take the ids from Model::forward_greedy instead of the logits.
  // Every token of each of its sequences is picked on the device, greedy or by a sample plan
  // (Model::forward_sample): no JSON constraint, beam, forced token, kept logits, or forks.
  bool device_picks() const {
    return !req.use_beam_search && !req.sampling.json_object && req.forced_tokens.empty() &&
           !req.return_logits && req.num_sequences() == 1;
  }
  bool plain_greedy() const {
    const SamplingParams& p = req.sampling;
    return p.temperature == 0.f && p.repetition_penalty == 1.f && p.presence_penalty == 0.f &&
           p.frequency_penalty == 0.f && p.logit_bias.empty() && !p.json_object && p.logprobs < 0 &&
           !req.use_beam_search && req.num_sequences() == 1 && !track_logprobs &&
           !req.return_logits;
  }
};

}  // namespace pagedattn
