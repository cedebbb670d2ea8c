// The device sampler: every rule of sample_plan.h on logit rows that stay on the GPU, one thread
// block per row (a cluster of them for the two-pass path); only the ids (and the asked
// log-probabilities) leave it. Host launcher; checks its launch and throws Error on failure;
// asynchronous on `stream`. Compiled as C++17 (nvcc).
//
// No sort of the vocabulary. A top-k row (k <= 1024, at most 1024 edits) reads its logits twice:
// the per-thread maxima bound its top k, the logits above the bound are gathered into shared
// memory, and top-k, top-p, min-p and the draw run on that list by ranks and scans (the top-N
// log-probabilities likewise). Its two passes are split over a cluster of CTAs (one per 65536
// logits, at most 8), which gather into the first one's shared memory: one CTA a row reads a
// 128K-vocabulary row at a fraction of the copy rate, and 32 rows would leave three quarters of
// an H100's SMs idle. A top-p row without top-k takes the same path with the 128 most likely (or
// a few more) as its list, which holds its top-p set when their weight reaches top_p of the whole
// row's (summed in pass 2). Other rows, and those whose list does not hold, take radix selects on
// the logits' order-preserving 32-bit keys (8 bits a pass), over a candidate list where the
// maxima bound one, else over the whole row. Masses are sums of fixed-point weights
// round(e * 2^40) in 64-bit integers, so every sum, cut and draw is the same whatever the order
// of the additions: a row gives the same token in any batch and any run.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

namespace pagedattn::cuda {

// Layout twins of sample_plan.h's RowSampling and LogitEdit (static_asserts where converted).
struct SampleRowDesc {
  float temperature, top_p, min_p, repetition_penalty, presence_penalty, frequency_penalty;
  int32_t top_k, logprobs, edit_begin, edit_end;
  uint64_t seed, counter;
};
struct SampleEdit {
  int32_t token, count;
  float bias;
  int32_t repeat;
};

// logits [rows, vocab] f32: edited in place for the draw and restored before the log-probabilities
// (each row's edits must name distinct tokens; saved [num_edits] is scratch for the originals).
// ids [rows]; logprob [rows] (the chosen token's, rows with logprobs >= 0);
// top_ids, top_logprob [rows, max_top] (the first rows[r].logprobs of row r, most likely first).
void sample_rows(float* logits, int32_t rows, int32_t vocab, const SampleRowDesc* row_desc,
                 const SampleEdit* edits, float* saved, int32_t* ids, float* logprob,
                 int32_t* top_ids, float* top_logprob, int32_t max_top, cudaStream_t stream,
                 int32_t cluster = 0);

// The CTAs a top-k row's passes are split over by default (cluster 0 above): fixed by the
// vocabulary alone, so that a row's log-probabilities, whose sums run per CTA, do not depend on
// the batch. The tokens never depend on it.
int32_t sample_cluster_size(int32_t vocab);

}  // namespace pagedattn::cuda
