// The non-greedy requests the benchmarks compare with greedy ones (`--sampling mixed`): every
// filter, a penalty and logprobs at once, as an OpenAI client would ask for them.
#pragma once

#include "pagedattn/sampling.h"

namespace pagedattn::bench {

inline SamplingParams mixed_sampling() {
  SamplingParams p;
  p.temperature = 0.8f;
  p.top_p = 0.95f;
  p.top_k = 50;
  p.repetition_penalty = 1.1f;
  p.logprobs = 5;
  return p;
}

}  // namespace pagedattn::bench
