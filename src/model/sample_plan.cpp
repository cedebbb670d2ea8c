// The sampling plan's host side: Philox draws, the per-sequence edit lists, the plan's checks and
// the host twin of the device sampler (sample_plan.h).
#include "pagedattn/sample_plan.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "pagedattn/error.h"
#include "philox.h"

namespace pagedattn {

double philox_uniform(uint64_t seed, uint64_t counter) { return philox::uniform(seed, counter); }

int32_t SamplePlan::max_logprobs() const {
  int32_t m = -1;
  for (const RowSampling& r : rows) m = std::max(m, r.logprobs);
  return m;
}

LogitEditor::LogitEditor(const SamplingParams& p, std::span<const int32_t> prompt)
    : history_(p.repetition_penalty != 1.f || p.presence_penalty != 0.f ||
               p.frequency_penalty != 0.f) {
  for (const auto& [t, b] : p.logit_bias) entry(t).bias += b;
  if (p.repetition_penalty != 1.f)
    for (int32_t t : prompt) entry(t).repeat = 1;
}

LogitEdit& LogitEditor::entry(int32_t token) {
  auto [it, fresh] = where_.try_emplace(token, int32_t(edits_.size()));
  if (fresh) edits_.push_back(LogitEdit{token, 0, 0.f, 0});
  return edits_[size_t(it->second)];
}

void LogitEditor::add_output(int32_t token) {
  if (!history_) return;
  LogitEdit& e = entry(token);
  ++e.count;
  e.repeat = 1;
}

RowSampling row_sampling(const SamplingParams& p, uint64_t counter, int32_t logprobs) {
  RowSampling r;
  r.temperature = p.temperature;
  r.top_k = p.top_k;
  r.top_p = p.top_p;
  r.min_p = p.min_p;
  r.repetition_penalty = p.repetition_penalty;
  r.presence_penalty = p.presence_penalty;
  r.frequency_penalty = p.frequency_penalty;
  r.seed = p.seed;
  r.counter = counter;
  r.logprobs = logprobs;
  return r;
}

void check_sample_plan(const SamplePlan& plan, int64_t rows, int64_t vocab, const char* op) {
  PA_CHECK(int64_t(plan.rows.size()) == rows, op, ": the sample plan has ", plan.rows.size(),
           " rows for ", rows, " logit rows");
  for (size_t i = 0; i < plan.rows.size(); ++i) {
    const RowSampling& r = plan.rows[i];
    PA_CHECK(std::isfinite(r.temperature) && r.temperature >= 0.f && r.top_p > 0.f &&
                 r.top_p <= 1.f && r.min_p >= 0.f && r.min_p <= 1.f &&
                 std::isfinite(r.repetition_penalty) && r.repetition_penalty > 0.f &&
                 std::isfinite(r.presence_penalty) && std::isfinite(r.frequency_penalty),
             op, ": sample plan row ", i, " has a parameter out of range");
    PA_CHECK(r.logprobs >= -1 && r.logprobs <= kMaxLogprobs, op, ": sample plan row ", i,
             " asks for ", r.logprobs, " logprobs (at most ", kMaxLogprobs, ")");
    PA_CHECK(r.edit_begin >= 0 && r.edit_begin <= r.edit_end &&
                 size_t(r.edit_end) <= plan.edits.size(),
             op, ": sample plan row ", i, " has edits [", r.edit_begin, ", ", r.edit_end,
             ") outside the ", plan.edits.size(), " edits");
  }
  // One pass without branches over every edit (tens of thousands a step with repetition
  // penalties), then the first bad one named.
  bool bad = false;
  for (const LogitEdit& e : plan.edits)
    bad |= (e.token < 0) | (int64_t(e.token) >= vocab) | (e.count < 0);
  for (size_t i = 0; bad && i < plan.edits.size(); ++i) {
    const LogitEdit& e = plan.edits[i];
    PA_CHECK(e.token >= 0 && e.token < vocab, op, ": sample plan edit ", i, " names token ",
             e.token, " outside the vocabulary of ", vocab);
    PA_CHECK(e.count >= 0, op, ": sample plan edit ", i, " has a negative count ", e.count);
  }
}

void apply_logit_edits(std::span<float> logits, const RowSampling& r,
                       std::span<const LogitEdit> edits) {
  for (const LogitEdit& e : edits) {
    float& l = logits[size_t(e.token)];
    if (e.repeat) l = l > 0.f ? l / r.repetition_penalty : l * r.repetition_penalty;
    l += e.bias;
    if (e.count > 0) l -= float(e.count) * r.frequency_penalty + r.presence_penalty;
  }
}

double log_sum_exp(std::span<const float> logits) {
  double mx = -std::numeric_limits<double>::infinity();
  for (float x : logits) mx = std::max(mx, double(x));
  if (!std::isfinite(mx)) return mx;
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - mx);
  return mx + std::log(sum);
}

TokenLogprobs sample_row(std::span<const float> raw, const RowSampling& r,
                         std::span<const LogitEdit> edits) {
  std::vector<float> l(raw.begin(), raw.end());
  apply_logit_edits(l, r, edits);
  TokenLogprobs out;
  const float mx = *std::max_element(l.begin(), l.end());
  if (r.temperature == 0.f || !std::isfinite(mx)) {  // no finite maximum: the argmax, as on a GPU
    out.token = argmax(l);
  } else {
    out.token = draw_in_id_order(filtered_distribution(l, r.temperature, r.top_k, r.top_p, r.min_p),
                                 philox_uniform(r.seed, r.counter));
  }
  if (r.logprobs < 0) return out;
  return token_logprobs(raw, out.token, r.logprobs);
}

TokenLogprobs token_logprobs(std::span<const float> raw, int32_t token, int32_t n_top) {
  PA_CHECK(token >= 0 && size_t(token) < raw.size(), "logprobs: token ", token,
           " is outside the vocabulary of ", raw.size());
  TokenLogprobs out;
  out.token = token;
  const double lse = log_sum_exp(raw);
  out.logprob = double(raw[size_t(token)]) - lse;
  const size_t n = std::min(size_t(std::max(n_top, 0)), raw.size());
  std::vector<int32_t> ids(raw.size());
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t(i);
  std::partial_sort(ids.begin(), ids.begin() + ptrdiff_t(n), ids.end(), [&](int32_t a, int32_t b) {
    const float la = raw[size_t(a)], lb = raw[size_t(b)];
    return la != lb ? la > lb : a < b;
  });
  for (size_t i = 0; i < n; ++i)
    out.top.emplace_back(ids[i], double(raw[size_t(ids[i])]) - lse);
  return out;
}

std::vector<TokenLogprobs> sample_rows(const float* logits, int64_t rows, int64_t vocab,
                                       const SamplePlan& plan) {
  check_sample_plan(plan, rows, vocab, "sample_rows");
  std::vector<TokenLogprobs> out;
  out.reserve(size_t(rows));
  for (int64_t i = 0; i < rows; ++i) {
    const RowSampling& r = plan.rows[size_t(i)];
    out.push_back(sample_row(
        std::span<const float>(logits + i * vocab, size_t(vocab)), r,
        std::span<const LogitEdit>(plan.edits.data() + r.edit_begin,
                                   size_t(r.edit_end - r.edit_begin))));
  }
  return out;
}

}  // namespace pagedattn
