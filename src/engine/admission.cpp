// Growth forecasts for admission (see admission.h).
#include "admission.h"

#include <algorithm>
#include <vector>

#include "pagedattn/error.h"

namespace pagedattn {

int64_t forecast_peak_pages(std::span<const GrowthForecast> seqs, int32_t page_size,
                            int64_t used_now) {
  PA_CHECK(page_size > 0, "forecast_peak_pages: page_size must be > 0, got ", page_size);
  std::vector<int64_t> points = {0};  // steps at which the demand may peak
  for (const GrowthForecast &f : seqs) {
    PA_CHECK(f.steps_left >= 1 && f.final_kv >= f.num_tokens && f.num_tokens >= 0 &&
                 f.freed_pages >= 0 && f.freed_pages <= f.held_pages,
             "forecast_peak_pages: inconsistent forecast (num_tokens ", f.num_tokens, ", final_kv ",
             f.final_kv, ", steps_left ", f.steps_left, ", held ", f.held_pages, ", freed ",
             f.freed_pages, ")");
    points.push_back(int64_t(f.steps_left) - 1);
  }
  std::sort(points.begin(), points.end());
  points.erase(std::unique(points.begin(), points.end()), points.end());
  int64_t peak = used_now;
  for (int64_t j : points) {
    int64_t demand = used_now;
    for (const GrowthForecast &f : seqs) {
      if (j >= f.steps_left) {  // finished by then: its own pages are back in
                                // the pool
        demand -= f.freed_pages;
        continue;
      }
      const int64_t kv = std::min<int64_t>(int64_t(f.num_tokens) + j, f.final_kv);
      demand += std::max<int64_t>(0, (kv + page_size - 1) / page_size - f.held_pages);
    }
    peak = std::max(peak, demand);
  }
  return peak;
}

void OutputLengthStats::observe(int32_t output_len) {
  if (output_len < 1) return;
  window_.push_back(output_len);
  if (window_.size() > kWindow) window_.pop_front();
}

int32_t OutputLengthStats::estimate(int32_t generated, int32_t max_output) const {
  const int32_t floor_len = std::min(generated + 1, max_output);
  if (window_.size() < kMinSamples) return max_output;
  std::vector<int32_t> longer;
  for (int32_t v : window_)
    if (v > generated) longer.push_back(v);
  // NOTE: a sequence already longer than every one seen is an outlier: assume
  // the worst.
  if (longer.empty()) return max_output;
  std::sort(longer.begin(), longer.end());
  const size_t k =
      std::min(longer.size() - 1, size_t(double(longer.size() - 1) * kPercentile / 100.0 + 0.5));
  return std::clamp(longer[k], floor_len, max_output);
}

}  // namespace pagedattn
