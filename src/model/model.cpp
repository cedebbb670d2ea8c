// The Model interface's defaults: a greedy step through forward() (also in two calls), sampling on
// the host, and no calibration pass.
#include "pagedattn/model.h"

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

void Model::begin_sample(const ForwardBatch& batch, KvCache& cache) {
  sample_batch_ = &batch;
  sample_cache_ = &cache;
}

std::vector<TokenLogprobs> Model::finish_sample(const SamplePlan& plan) {
  PA_CHECK(sample_batch_ != nullptr, "finish_sample: no begin_sample before it");
  const ForwardBatch* batch = std::exchange(sample_batch_, nullptr);
  KvCache* cache = std::exchange(sample_cache_, nullptr);
  return forward_sample(*batch, *cache, plan);
}

void Model::begin_greedy(const ForwardBatch& batch, KvCache& cache) {
  PA_CHECK(greedy_passes_.size() < 2, "begin_greedy: two passes are outstanding already");
  const int32_t chained =
      greedy_passes_.empty() ? 0 : int32_t(greedy_passes_.back().batch.logit_rows.size());
  const KvCacheConfig& cc = cache.config();
  check_forward_batch(batch, config().vocab_size, cc.page_size, cc.num_pages, "begin_greedy",
                      chained);
  greedy_passes_.push_back(GreedyPass{batch, &cache});
}

std::vector<int32_t> Model::finish_greedy() {
  PA_CHECK(!greedy_passes_.empty(), "finish_greedy: no begin_greedy before it");
  GreedyPass pass = std::move(greedy_passes_.front());
  greedy_passes_.pop_front();
  try {
    // NOTE: a stand-in names a row of the pass begun just before this one, finished just now.
    for (int32_t& t : pass.batch.tokens)
      if (t < 0) t = last_greedy_ids_.at(size_t(-t - 1));
    last_greedy_ids_ = forward_greedy(pass.batch, *pass.cache);
  } catch (...) {
    greedy_passes_.clear();
    throw;
  }
  return last_greedy_ids_;
}

Model::KvAbsMax Model::kv_absmax(const std::vector<int32_t>&) {
  fail("kv_absmax: this model runner has no calibration pass");
}

}  // namespace pagedattn
