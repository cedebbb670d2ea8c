// The sampler lab's batches and the host twin's picks (sampler_host.h).
#include "sampler_host.h"

#include <algorithm>
#include <random>

#include "pagedattn/sample_plan.h"

namespace lab {

using namespace pagedattn;

SamplerBatch make_sampler_batch(int32_t rows, int32_t vocab, uint64_t seed, bool top_p_only,
                                bool flat) {
  SamplerBatch b;
  b.rows = rows, b.vocab = vocab;
  std::mt19937 rng{uint32_t(seed)};
  std::normal_distribution<float> nd(0.f, 2.f);
  b.logits.resize(size_t(rows) * size_t(vocab));
  for (float& v : b.logits) v = nd(rng);
  for (int32_t i = 0; i < rows && !flat; ++i)  // a few likely tokens a row
    for (int j = 0; j < 20; ++j)
      b.logits[size_t(i) * size_t(vocab) + rng() % uint32_t(vocab)] += 10.f + float(j);
  for (int32_t i = 0; i < rows; ++i) {
    cuda::SampleRowDesc r{};
    r.temperature = 0.8f, r.top_p = 0.95f, r.min_p = 0.f, r.repetition_penalty = 1.1f;
    r.presence_penalty = 0.f, r.frequency_penalty = 0.f, r.top_k = 50, r.logprobs = 5;
    if (top_p_only) {
      r.top_p = 0.9f, r.repetition_penalty = 1.f, r.presence_penalty = 0.5f, r.top_k = 0;
      r.logprobs = -1;
    }
    r.seed = rng(), r.counter = rng() % 1000;
    r.edit_begin = int32_t(b.edits.size());
    std::vector<int32_t> ids;
    while (ids.size() < (top_p_only ? 50u : 550u)) {
      const int32_t t = int32_t(rng() % uint32_t(vocab));
      if (std::find(ids.begin(), ids.end(), t) == ids.end()) ids.push_back(t);
    }
    for (int32_t t : ids)
      b.edits.push_back(cuda::SampleEdit{t, int32_t(rng() % 8 == 0), 0.f, 1});
    r.edit_end = int32_t(b.edits.size());
    b.desc.push_back(r);
  }
  return b;
}

SamplerPicks host_picks(const SamplerBatch& b, int32_t n_top) {
  SamplePlan plan;
  for (const cuda::SampleRowDesc& d : b.desc) {
    RowSampling r;
    r.temperature = d.temperature, r.top_k = d.top_k, r.top_p = d.top_p, r.min_p = d.min_p;
    r.repetition_penalty = d.repetition_penalty, r.presence_penalty = d.presence_penalty;
    r.frequency_penalty = d.frequency_penalty, r.seed = d.seed, r.counter = d.counter;
    r.logprobs = d.logprobs, r.edit_begin = d.edit_begin, r.edit_end = d.edit_end;
    plan.rows.push_back(r);
  }
  for (const cuda::SampleEdit& e : b.edits)
    plan.edits.push_back(LogitEdit{e.token, e.count, e.bias, e.repeat});
  const std::vector<TokenLogprobs> got = sample_rows(b.logits.data(), b.rows, b.vocab, plan);
  SamplerPicks p;
  p.top.assign(size_t(b.rows) * size_t(n_top), -1);
  p.top_logprob.assign(p.top.size(), 0.f);
  for (size_t i = 0; i < got.size(); ++i) {
    p.ids.push_back(got[i].token);
    p.logprob.push_back(float(got[i].logprob));
    for (size_t j = 0; j < got[i].top.size() && j < size_t(n_top); ++j) {
      p.top[i * size_t(n_top) + j] = got[i].top[j].first;
      p.top_logprob[i * size_t(n_top) + j] = float(got[i].top[j].second);
    }
  }
  return p;
}

}  // namespace lab
