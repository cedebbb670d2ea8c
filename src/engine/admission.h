// Admission that foresees growth: how many KV pages the running batch will need
// over the rest of its life, so that the scheduler admits a request only while
// that peak still fits.
//
// Each sequence is forecast as a straight line: from now on it reserves one
// more token per step (decode) until it finishes, then frees the pages only it
// holds. At step j (0: the coming step) sequence i holds
//     pages(min(num_tokens_i + j, final_kv_i))   while j < steps_left_i,
// and nothing of its own afterwards. The pool's demand at step j is what is in
// use now, plus the growth of every sequence still alive at j, minus the pages
// of those already finished. The peak over j is reached just before some
// sequence finishes (growth only rises until then), so it is enough to look at
// j = 0 and j = steps_left_k - 1 for every k: O(n^2) for n sequences (n is at
// most max_num_seqs; a few thousand additions per admission, nothing beside a
// forward pass).
//
// A sequence's final length is its max_length when nothing else can stop it
// (EOS ignored, no stop ids or strings: what the benchmark's requests and many
// batch jobs are); otherwise it is estimated from the output lengths of the
// sequences that finished before it (OutputLengthStats): the 90th percentile of
// those longer than what it has already generated, capped at its max_length.
// Until enough have finished the estimate is max_length (the static
// reservation).
#pragma once

#include <cstdint>
#include <deque>
#include <span>

namespace pagedattn {

// The forecast of one sequence (all counts in tokens or pages of the shared
// pool).
struct GrowthForecast {
  int32_t num_tokens = 0;   // tokens that exist now (all in the cache after the coming step)
  int32_t final_kv = 0;     // tokens in the cache at its last step (>= num_tokens)
  int32_t steps_left = 0;   // steps until it finishes (>= 1)
  int32_t held_pages = 0;   // pages in its block table now
  int32_t freed_pages = 0;  // of those, pages only it references (returned when it finishes)
};

// The most pages in use at any future step if `seqs` run to their forecast ends
// and nothing else is admitted. used_now: pages referenced now (allocator:
// num_pages - num_available).
int64_t forecast_peak_pages(std::span<const GrowthForecast> seqs, int32_t page_size,
                            int64_t used_now);

// Output lengths of recently finished sequences, for the growth of the ones
// whose end is unknown.
class OutputLengthStats {
 public:
  static constexpr size_t kWindow = 256;     // the latest finished sequences kept
  static constexpr size_t kMinSamples = 8;   // fewer: every estimate is the worst case
  static constexpr double kPercentile = 90;  // of the lengths longer than the generated ones

  void observe(int32_t output_len);
  // The estimated final output length of a sequence that has generated
  // `generated` tokens and may generate at most `max_output`: in [min(generated
  // + 1, max_output), max_output].
  int32_t estimate(int32_t generated, int32_t max_output) const;
  size_t size() const { return window_.size(); }

 private:
  std::deque<int32_t> window_;
};

}  // namespace pagedattn
