#include "pagedattn/sampling.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <unordered_map>
#include <unordered_set>

#include "pagedattn/error.h"
#include "pagedattn/sample_plan.h"

namespace pagedattn {

void validate_sampling_params(const SamplingParams& p) {
  PA_CHECK(std::isfinite(p.temperature) && p.temperature >= 0.f,
           "sampling: temperature must be >= 0, got ", p.temperature);
  PA_CHECK(p.top_p > 0.f && p.top_p <= 1.f, "sampling: top_p must be in (0, 1], got ", p.top_p);
  PA_CHECK(p.min_p >= 0.f && p.min_p <= 1.f, "sampling: min_p must be in [0, 1], got ", p.min_p);
  PA_CHECK(std::isfinite(p.repetition_penalty) && p.repetition_penalty > 0.f,
           "sampling: repetition_penalty must be > 0, got ", p.repetition_penalty);
  for (size_t i = 0; i < p.stop.size(); ++i) {
    PA_CHECK(!p.stop[i].empty(), "sampling: stop[", i, "] is an empty string");
  }
  PA_CHECK(std::isfinite(p.presence_penalty) && std::abs(p.presence_penalty) <= 2.f,
           "sampling: presence_penalty must be in [-2, 2], got ", p.presence_penalty);
  PA_CHECK(std::isfinite(p.frequency_penalty) && std::abs(p.frequency_penalty) <= 2.f,
           "sampling: frequency_penalty must be in [-2, 2], got ", p.frequency_penalty);
  PA_CHECK(p.logprobs >= -1 && p.logprobs <= 20, "sampling: logprobs must be in [-1, 20], got ",
           p.logprobs);
  for (const auto& [t, b] : p.logit_bias)
    PA_CHECK(t >= 0 && std::isfinite(b) && std::abs(b) <= 100.f, "sampling: logit_bias entry (", t,
             ", ", b, ") needs a token id >= 0 and a bias in [-100, 100]");
}

void apply_openai_penalties(std::span<float> logits, const SamplingParams& p,
                            std::span<const int32_t> output) {
  const int64_t vocab = int64_t(logits.size());
  PA_CHECK(p.logprobs >= -1 && p.logprobs <= 20, "sampling: logprobs must be in [-1, 20], got ",
           p.logprobs);
  for (const auto& [t, b] : p.logit_bias) {
    PA_CHECK(t >= 0 && t < vocab, "logit_bias: token ", t, " is outside the vocabulary of ", vocab);
    logits[size_t(t)] += b;
  }
  if (p.presence_penalty == 0.f && p.frequency_penalty == 0.f) return;
  std::unordered_map<int32_t, int32_t> counts;
  for (size_t i = 0; i < output.size(); ++i) {
    PA_CHECK(output[i] >= 0 && output[i] < vocab, "penalties: output[", i, "] = ", output[i],
             " is outside the vocabulary of ", vocab);
    ++counts[output[i]];
  }
  for (const auto& [t, c] : counts)
    logits[size_t(t)] -= float(c) * p.frequency_penalty + p.presence_penalty;
}

void apply_repetition_penalty(std::span<float> logits, std::span<const int32_t> history,
                              float penalty) {
  PA_CHECK(penalty > 0.f, "repetition_penalty: penalty must be > 0, got ", penalty);
  const int64_t vocab = int64_t(logits.size());
  for (size_t i = 0; i < history.size(); ++i) {
    PA_CHECK(history[i] >= 0 && history[i] < vocab, "repetition_penalty: history[", i,
             "] = ", history[i], " is outside the vocabulary of ", vocab);
  }
  if (penalty == 1.f) return;
  std::unordered_set<int32_t> done;
  for (int32_t t : history) {
    if (!done.insert(t).second) continue;
    float& l = logits[size_t(t)];
    l = l > 0.f ? l / penalty : l * penalty;
  }
}

int32_t argmax(std::span<const float> x) {
  const size_t n = x.size();
  if (n == 0) return 0;
  // The maximum, in kLanes independent lanes (x > m ? x : m, as the scalar rule: a NaN never
  // replaces a number, and a NaN x[0] stays).
  constexpr size_t kLanes = 16;
  const float* p = x.data();
  float lane[kLanes];
  for (size_t k = 0; k < kLanes; ++k) lane[k] = p[0];
  size_t i = 0;
  for (; i + kLanes <= n; i += kLanes) {
    for (size_t k = 0; k < kLanes; ++k) lane[k] = p[i + k] > lane[k] ? p[i + k] : lane[k];
  }
  float m = lane[0];
  for (size_t k = 1; k < kLanes; ++k) m = lane[k] > m ? lane[k] : m;
  for (; i < n; ++i) m = p[i] > m ? p[i] : m;
  // The first index holding it: blocks with a branch-free any-equal test, then a scan.
  size_t b = 0;
  for (; b + kLanes <= n; b += kLanes) {
    bool hit = false;
    for (size_t k = 0; k < kLanes; ++k) hit |= p[b + k] == m;
    if (hit) break;
  }
  for (size_t j = b; j < n; ++j) {
    if (p[j] == m) return int32_t(j);
  }
  return 0;  // m is NaN: x[0] was
}

namespace {

bool more_likely(const TokenProb& a, const TokenProb& b) {
  return a.prob > b.prob || (a.prob == b.prob && a.token < b.token);
}

}  // namespace

std::vector<TokenProb> sampling_distribution(std::span<const float> logits, const SamplingParams& p,
                                             std::span<const int32_t> history, size_t prompt_len) {
  validate_sampling_params(p);
  PA_CHECK(!logits.empty(), "sampling: logits are empty");
  PA_CHECK(prompt_len <= history.size(), "sampling: prompt_len ", prompt_len,
           " is past the history of ", history.size());
  std::vector<float> l(logits.begin(), logits.end());
  apply_repetition_penalty(l, history, p.repetition_penalty);
  apply_openai_penalties(l, p, history.subspan(prompt_len));
  if (p.temperature == 0.f) return {TokenProb{argmax(l), 1.0}};

  return filtered_distribution(l, p.temperature, p.top_k, p.top_p, p.min_p);
}

std::vector<TokenProb> filtered_distribution(std::span<const float> l, float temperature,
                                             int32_t top_k, float top_p, float min_p) {
  PA_CHECK(!l.empty(), "sampling: logits are empty");
  // Softmax at the temperature, in double.
  const float mx = *std::max_element(l.begin(), l.end());
  PA_CHECK(std::isfinite(mx), "sampling: logits have no finite maximum");
  std::vector<TokenProb> c(l.size());
  double sum = 0.0;
  for (size_t i = 0; i < l.size(); ++i) {
    const double e = std::exp((double(l[i]) - double(mx)) / double(temperature));
    c[i] = TokenProb{int32_t(i), e};
    sum += e;
  }
  for (TokenProb& t : c) t.prob /= sum;

  // Order only as much as the filters need: the k best for top-k, everything for top-p.
  size_t keep = c.size();
  if (top_k > 0 && size_t(top_k) < keep) {
    keep = size_t(top_k);
    std::partial_sort(c.begin(), c.begin() + ptrdiff_t(keep), c.end(), more_likely);
  } else {
    std::sort(c.begin(), c.end(), more_likely);
  }
  c.resize(keep);
  double mass = 0.0;
  for (const TokenProb& t : c) mass += t.prob;
  if (top_p < 1.f) {
    // Smallest prefix whose renormalised mass reaches top_p (the token crossing it included).
    double cum = 0.0;
    size_t n = 0;
    while (n < c.size()) {
      cum += c[n].prob / mass;
      ++n;
      if (cum >= double(top_p)) break;
    }
    c.resize(n);
  }
  if (min_p > 0.f) {
    const double floor = double(min_p) * c.front().prob;
    size_t n = 1;
    while (n < c.size() && c[n].prob >= floor) ++n;
    c.resize(n);
  }
  // Tokens a constraint removed (logit -inf) have probability 0: never a candidate.
  while (c.size() > 1 && c.back().prob == 0.0) c.pop_back();
  mass = 0.0;
  for (const TokenProb& t : c) mass += t.prob;
  for (TokenProb& t : c) t.prob /= mass;
  return c;
}

int32_t draw_in_id_order(std::vector<TokenProb> dist, double u) {
  PA_CHECK(!dist.empty(), "sampling: nothing to draw from");
  std::sort(dist.begin(), dist.end(),
            [](const TokenProb& a, const TokenProb& b) { return a.token < b.token; });
  double total = 0.0;
  for (const TokenProb& t : dist) total += t.prob;
  const double target = u * total;
  double cum = 0.0;
  for (const TokenProb& t : dist) {
    cum += t.prob;
    if (t.prob > 0.0 && target < cum) return t.token;
  }
  for (size_t i = dist.size(); i-- > 0;)  // u within rounding of 1
    if (dist[i].prob > 0.0) return dist[i].token;
  return dist.back().token;
}

Sampler::Sampler(const SamplingParams& params) : params_(params) {
  validate_sampling_params(params_);
}

int32_t Sampler::sample(std::span<const float> logits, std::span<const int32_t> history,
                        size_t prompt_len) const {
  PA_CHECK(!logits.empty(), "sampling: logits are empty");
  PA_CHECK(prompt_len <= history.size(), "sampling: prompt_len ", prompt_len,
           " is past the history of ", history.size());
  for (size_t i = 0; i < history.size(); ++i)
    PA_CHECK(history[i] >= 0 && size_t(history[i]) < logits.size(), "sampling: history[", i,
             "] = ", history[i], " is outside the vocabulary of ", logits.size());
  for (const auto& [t, b] : params_.logit_bias)
    PA_CHECK(t >= 0 && size_t(t) < logits.size(), "logit_bias: token ", t,
             " is outside the vocabulary of ", logits.size());
  // The engine's rule: the history's edits, then sample_plan.h's pick.
  LogitEditor editor(params_, history.first(prompt_len));
  for (int32_t t : history.subspan(prompt_len)) editor.add_output(t);
  const RowSampling row = row_sampling(params_, uint64_t(history.size() - prompt_len), -1);
  return sample_row(logits, row, editor.edits()).token;
}

bool Sampler::is_stop_token(int32_t token) const {
  return std::find(params_.stop_token_ids.begin(), params_.stop_token_ids.end(), token) !=
         params_.stop_token_ids.end();
}

StopStringMatcher::StopStringMatcher(std::vector<std::string> stops) : stops_(std::move(stops)) {
  for (size_t i = 0; i < stops_.size(); ++i) {
    PA_CHECK(!stops_[i].empty(), "StopStringMatcher: stops[", i, "] is an empty string");
  }
}

std::string StopStringMatcher::feed(std::string_view text) {
  if (stopped_) return {};
  pending_.append(text);
  // The earliest stop string wins.
  size_t cut = std::string::npos;
  for (const std::string& s : stops_) cut = std::min(cut, pending_.find(s));
  if (cut != std::string::npos) {
    stopped_ = true;
    std::string out = pending_.substr(0, cut);
    pending_.clear();
    return out;
  }
  // Hold back the longest suffix that is a proper prefix of some stop string.
  size_t hold = 0;
  for (const std::string& s : stops_) {
    for (size_t n = std::min(s.size() - 1, pending_.size()); n > hold; --n) {
      if (pending_.compare(pending_.size() - n, n, s, 0, n) == 0) {
        hold = n;
        break;
      }
    }
  }
  std::string out = pending_.substr(0, pending_.size() - hold);
  pending_.erase(0, pending_.size() - hold);
  return out;
}

std::string StopStringMatcher::flush() {
  std::string out;
  out.swap(pending_);
  return out;
}

}  // namespace pagedattn
