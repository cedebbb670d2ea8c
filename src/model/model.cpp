// The Model interface's defaults: a greedy step through forward() (also in two calls), sampling on
// the host, and no calibration pass.
#include "pagedattn/model.h"

#include <algorithm>
#include <span>
#include <utility>

#include "pagedattn/error.h"
#include "pagedattn/sampling.h"

namespace pagedattn {

std::vector<int32_t> Model::forward_greedy(const ForwardBatch& batch, KvCache& cache) {
  const Tensor logits = forward(batch, cache);  // [R, vocab]
  const int64_t rows = logits.dim(0), vocab = logits.dim(1);
  std::vector<int32_t> ids(static_cast<size_t>(rows));
  for (int64_t r = 0; r < rows; ++r) {
    ids[size_t(r)] =
        argmax(std::span<const float>(logits.data_as<float>() + r * vocab, size_t(vocab)));
  }
  return ids;
}

std::vector<TokenLogprobs> Model::forward_sample(const ForwardBatch& batch, KvCache& cache,
                                                const SamplePlan& plan) {
  check_sample_plan(plan, int64_t(batch.logit_rows.size()), config().vocab_size, "forward_sample");
  const Tensor logits = forward(batch, cache);  // [R, vocab]
  return sample_rows(logits.data_as<float>(), logits.dim(0), logits.dim(1), plan);
}

void Model::begin_pass(const ForwardBatch& batch, KvCache& cache, bool sampled, const char* op) {
  PA_CHECK(open_passes_.size() < 2, op, ": two passes are open already");
  int32_t chained = 0;
  if (!open_passes_.empty()) {
    const OpenPass& before = open_passes_.back();
    // NOTE: a sampled pass's picks exist once its plan is given; before that nothing may name them.
    if (!before.sampled || before.picked) chained = int32_t(before.batch.logit_rows.size());
  }
  const KvCacheConfig& cc = cache.config();
  check_forward_batch(batch, config().vocab_size, cc.page_size, cc.num_pages, op, chained);
  OpenPass p;
  p.batch = batch;
  p.cache = &cache;
  p.sampled = sampled;
  open_passes_.push_back(std::move(p));
}

Model::OpenPass Model::take_oldest(bool sampled, const char* op) {
  PA_CHECK(!open_passes_.empty() && open_passes_.front().sampled == sampled, op, ": no ",
           sampled ? "begin_sample" : "begin_greedy", " before it");
  OpenPass pass = std::move(open_passes_.front());
  open_passes_.pop_front();
  // NOTE: a stand-in names a row of the pass begun just before this one, finished just now.
  for (int32_t& t : pass.batch.tokens)
    if (t < 0) t = last_picks_.at(size_t(-t - 1));
  return pass;
}

void Model::begin_greedy(const ForwardBatch& batch, KvCache& cache) {
  begin_pass(batch, cache, false, "begin_greedy");
}

std::vector<int32_t> Model::finish_greedy() {
  try {
    OpenPass pass = take_oldest(false, "finish_greedy");
    last_picks_ = forward_greedy(pass.batch, *pass.cache);
  } catch (...) {
    open_passes_.clear();
    throw;
  }
  return last_picks_;
}

void Model::begin_sample(const ForwardBatch& batch, KvCache& cache) {
  begin_pass(batch, cache, true, "begin_sample");
}

void Model::pick_sampled(const SamplePlan& plan) {
  auto it = std::find_if(open_passes_.begin(), open_passes_.end(),
                         [](const OpenPass& p) { return p.sampled && !p.picked; });
  try {
    PA_CHECK(it != open_passes_.end(), "pick_sampled: no begin_sample before it");
    check_sample_plan(plan, int64_t(it->batch.logit_rows.size()), config().vocab_size,
                      "forward_sample");
  } catch (...) {
    open_passes_.clear();
    throw;
  }
  it->plan = plan;
  it->picked = true;
}

std::vector<TokenLogprobs> Model::take_sampled() {
  std::vector<TokenLogprobs> out;
  try {
    PA_CHECK(!open_passes_.empty() && open_passes_.front().picked, "take_sampled: no ",
             "pick_sampled before it");
    OpenPass pass = take_oldest(true, "take_sampled");
    out = forward_sample(pass.batch, *pass.cache, pass.plan);
  } catch (...) {
    open_passes_.clear();
    throw;
  }
  last_picks_.clear();
  for (const TokenLogprobs& t : out) last_picks_.push_back(t.token);
  return out;
}

Model::KvAbsMax Model::kv_absmax(const std::vector<int32_t>&) {
  fail("kv_absmax: this model runner has no calibration pass");
}

}  // namespace pagedattn
