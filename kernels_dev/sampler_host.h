// The sampler lab's host side (sampler_host.cpp, C++20): its batches of sampled rows and the host
// twin's picks (sample_plan.h), in types nvcc's C++17 reads.
#pragma once

#include <cstdint>
#include <vector>

#include "sampling_kernels.h"

namespace lab {

struct SamplerBatch {
  int32_t rows = 0, vocab = 0;
  std::vector<float> logits;                      // [rows, vocab]
  std::vector<pagedattn::cuda::SampleRowDesc> desc;  // [rows]
  std::vector<pagedattn::cuda::SampleEdit> edits;
};

// `rows` rows of the sampled mix (temperature 0.8, top-k 50, top-p 0.95, repetition penalty 1.1,
// 5 log-probabilities), 550 edits each; logits normal with a few large ones a row. top_p_only:
// rows as OpenAI's API sends them instead (temperature 0.8, top-p 0.9, presence penalty 0.5 on
// 50 generated tokens, no top-k, no log-probabilities). flat: no large logits (a top-p set of
// thousands of tokens, past any candidate list).
SamplerBatch make_sampler_batch(int32_t rows, int32_t vocab, uint64_t seed,
                                bool top_p_only = false, bool flat = false);

// The host twin's picks: ids [rows], logprob [rows], top ids and log-probabilities [rows, n_top].
struct SamplerPicks {
  std::vector<int32_t> ids, top;
  std::vector<float> logprob, top_logprob;
};
SamplerPicks host_picks(const SamplerBatch& b, int32_t n_top);

}  // namespace lab
