// A small deterministic Model for engine and server tests.
//
// forward() writes a token-derived K and V into every new token's slot (K =
// [token, position, ...], V = [position, token, ...]) and computes each logit
// row from the tokens read back through the sequence's block table, checking
// every position it reads. So the logits are a pure function of the sequence's
// tokens (batching cannot change them), and a paging bug (a wrong page, a page
// handed to two sequences, a copy-on-write that did not copy) changes the
// output or throws.
#pragma once

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <span>
#include <string>
#include <thread>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"

namespace pagedattn::fakes {

class FakeModel : public Model {
 public:
  // vocab: token ids are [0, vocab); eos: ids that end generation (the logits
  // never favour them unless eos_every > 0: then every eos_every-th generated
  // position prefers eos[0]).
  explicit FakeModel(int32_t vocab = 64, std::vector<int32_t> eos = {}, int32_t max_len = 4096,
                     int32_t num_layers = 2) {
    cfg_.architecture = "fake";
    cfg_.vocab_size = vocab;
    cfg_.hidden_size = 8;
    cfg_.num_layers = num_layers;
    cfg_.num_q_heads = 2;
    cfg_.num_kv_heads = 2;
    cfg_.head_dim = 4;
    cfg_.max_position_embeddings = max_len;
    cfg_.eos_token_ids = std::move(eos);
  }

  const ModelConfig& config() const override { return cfg_; }
  Device device() const override { return Device::cpu; }

  Tensor forward(const ForwardBatch& b, KvCache& cache) override {
    const size_t num_seqs = b.seqs.size();
    PA_CHECK(b.q_indptr.size() == num_seqs + 1, "FakeModel: q_indptr size");
    PA_CHECK(b.tokens.size() == size_t(b.q_indptr.back()), "FakeModel: tokens size");
    PA_CHECK(b.positions.size() == b.tokens.size() && b.slots.size() == b.tokens.size(),
             "FakeModel: positions/slots size");
    ++num_forward_calls;
    PA_CHECK(num_forward_calls != fail_on_forward, "FakeModel: forward call ", num_forward_calls,
             " failed (injected)");
    if (const auto delay = step_delay.load(); delay.count() > 0) std::this_thread::sleep_for(delay);
    batch_tokens.push_back(int32_t(b.tokens.size()));
    batch_seqs.push_back(int32_t(num_seqs));
    const int32_t ps = cache.config().page_size;
    // NOTE: the batch's layout, not the cache's bookkeeping (a runner reads only the pools): a
    // pass begun ahead runs after the cache has moved on (Model::begin_greedy's default).
    PA_CHECK(b.kv_len.size() == num_seqs && b.block_table.size() == num_seqs * size_t(b.max_pages),
             "FakeModel: the batch's attention layout");
    auto table = [&](size_t s) {
      return std::span<const int32_t>(b.block_table.data() + s * size_t(b.max_pages),
                                      size_t(b.max_pages));
    };
    // Write: every layer gets the same token-derived K/V.
    for (size_t s = 0; s < num_seqs; ++s) {
      const int32_t kv_len = b.kv_len[s];
      const int32_t q_len = b.q_indptr[s + 1] - b.q_indptr[s];
      for (int32_t j = 0; j < q_len; ++j) {
        const size_t i = size_t(b.q_indptr[s] + j);
        PA_CHECK(b.positions[i] == kv_len - q_len + j, "FakeModel: position of row ", i);
        const auto bt = table(s);
        PA_CHECK(b.slots[i] == bt[size_t(b.positions[i] / ps)] * ps + b.positions[i] % ps,
                 "FakeModel: slot of row ", i, " does not match the block table");
        for (int32_t l = 0; l < cfg_.num_layers; ++l) {
          const PagedKVView v = cache.layer_view(l);
          for (int32_t h = 0; h < cfg_.num_kv_heads; ++h) {
            const int64_t off = v.offset(b.slots[i] / ps, h, b.slots[i] % ps);
            float* k = static_cast<float*>(v.k_pages) + off;
            float* vv = static_cast<float*>(v.v_pages) + off;
            k[0] = float(b.tokens[i]);
            k[1] = float(b.positions[i]);
            k[2] = float(l);
            k[3] = float(h);
            vv[0] = float(b.positions[i]);
            vv[1] = float(b.tokens[i]);
            vv[2] = float(l);
            vv[3] = float(h);
          }
        }
      }
    }
    // Read back and compute logits.
    Tensor logits = Tensor::empty({int64_t(b.logit_rows.size()), cfg_.vocab_size}, DType::f32);
    for (size_t r = 0; r < b.logit_rows.size(); ++r) {
      const int32_t row = b.logit_rows[r];
      size_t s = 0;
      while (b.q_indptr[s + 1] <= row) ++s;
      const auto bt = table(s);
      uint64_t h = 1469598103934665603ull;
      for (int32_t p = 0; p <= b.positions[size_t(row)]; ++p) {
        for (int32_t l = 0; l < cfg_.num_layers; ++l) {
          const PagedKVView v = cache.layer_view(l);
          for (int32_t kh = 0; kh < cfg_.num_kv_heads; ++kh) {
            const int64_t off = v.offset(bt[size_t(p / ps)], kh, p % ps);
            const float* k = static_cast<const float*>(v.k_pages) + off;
            const float* vv = static_cast<const float*>(v.v_pages) + off;
            PA_CHECK(k[1] == float(p) && vv[0] == float(p) && k[0] == vv[1] && k[2] == float(l) &&
                         k[3] == float(kh),
                     "FakeModel: K/V of position ", p, " read back wrong (paging bug)");
          }
        }
        const float* k0 = static_cast<const float*>(cache.layer_view(0).k_pages) +
                          cache.layer_view(0).offset(bt[size_t(p / ps)], 0, p % ps);
        h = (h ^ uint64_t(int64_t(k0[0]))) * 1099511628211ull;
      }
      fill_logits(h, b.positions[size_t(row)] + 1, logits.data_as<float>() + r * cfg_.vocab_size);
    }
    return logits;
  }

  // The default greedy step (forward, then the host argmax), counted.
  std::vector<int32_t> forward_greedy(const ForwardBatch& b, KvCache& cache) override {
    ++num_greedy_calls;
    return Model::forward_greedy(b, cache);
  }
  // The default two-call steps; passes begun with stand-in tokens (schedule ahead) counted, and
  // every pass begun recorded with whether another was open then.
  void begin_greedy(const ForwardBatch& b, KvCache& cache) override {
    const bool ahead = open_passes > 0;
    Model::begin_greedy(b, cache);
    note_begun(b, ahead);
    if (std::any_of(b.tokens.begin(), b.tokens.end(), [](int32_t t) { return t < 0; }))
      ++num_chained_passes;
  }
  void begin_sample(const ForwardBatch& b, KvCache& cache) override {
    const bool ahead = open_passes > 0;
    Model::begin_sample(b, cache);
    note_begun(b, ahead);
    if (std::any_of(b.tokens.begin(), b.tokens.end(), [](int32_t t) { return t < 0; })) {
      ++num_chained_passes;
      ++num_chained_sampled_passes;
    }
  }
  // A call that finishes the oldest open pass, counted (an error drops every open pass: Model's
  // contract).
  template <class F>
  auto closing_pass(F&& finish) {
    try {
      auto out = finish();
      --open_passes;
      return out;
    } catch (...) {
      open_passes = 0;
      throw;
    }
  }
  std::vector<int32_t> finish_greedy() override {
    return closing_pass([this] { return Model::finish_greedy(); });
  }
  std::vector<TokenLogprobs> take_sampled() override {
    return closing_pass([this] { return Model::take_sampled(); });
  }
  void pick_sampled(const SamplePlan& plan) override {
    try {
      Model::pick_sampled(plan);
    } catch (...) {
      open_passes = 0;
      throw;
    }
  }
  // A begun pass: its batch's tokens, its rows without a logit row (prompt chunks before their
  // last), and whether another pass was open when it was begun.
  struct BegunPass {
    int32_t tokens = 0;
    int32_t rows_without_logits = 0;
    bool ahead = false;
  };
  void note_begun(const ForwardBatch& b, bool ahead) {
    ++open_passes;
    BegunPass p;
    p.tokens = int32_t(b.tokens.size());
    p.rows_without_logits = int32_t(b.q_indptr.size()) - 1 - int32_t(b.logit_rows.size());
    p.ahead = ahead;
    begun.push_back(p);
  }
  // The default sampled step (forward, then the host twin of the plan), counted.
  std::vector<TokenLogprobs> forward_sample(const ForwardBatch& b, KvCache& cache,
                                            const SamplePlan& plan) override {
    ++num_sample_calls;
    return Model::forward_sample(b, cache, plan);
  }

  // The logits after a history hashing to h of length len (for oracle
  // computations in tests).
  void fill_logits(uint64_t h, int32_t len, float* out) const {
    for (int32_t v = 0; v < cfg_.vocab_size; ++v) {
      uint64_t x = h ^ (uint64_t(v) * 0x9e3779b97f4a7c15ull);
      x ^= x >> 31;
      x *= 0xbf58476d1ce4e5b9ull;
      x ^= x >> 29;
      out[v] = float(x % 10000) / 1000.f;  // [0, 10)
    }
    for (int32_t e : cfg_.eos_token_ids) out[e] = eos_logit;
    if (eos_every > 0 && !cfg_.eos_token_ids.empty() && len % eos_every == 0)
      out[cfg_.eos_token_ids[0]] = 100.f;
  }

  // The logits after a whole history, computed without any cache. out: [vocab].
  void logits_after(const std::vector<int32_t>& tokens, float* out) const {
    uint64_t h = 1469598103934665603ull;
    for (int32_t tok : tokens) h = (h ^ uint64_t(int64_t(tok))) * 1099511628211ull;
    fill_logits(h, int32_t(tokens.size()), out);
  }

  // Greedy continuation computed without any cache: the independent oracle.
  std::vector<int32_t> greedy_oracle(std::vector<int32_t> tokens, int32_t max_tokens) const {
    std::vector<int32_t> out;
    std::vector<float> logits(size_t(cfg_.vocab_size));
    for (int32_t t = 0; t < max_tokens; ++t) {
      logits_after(tokens, logits.data());
      int32_t best = 0;
      for (int32_t v = 1; v < cfg_.vocab_size; ++v)
        if (logits[size_t(v)] > logits[size_t(best)]) best = v;
      out.push_back(best);
      tokens.push_back(best);
      if (std::find(cfg_.eos_token_ids.begin(), cfg_.eos_token_ids.end(), best) !=
          cfg_.eos_token_ids.end())
        break;
    }
    return out;
  }

  // NOTE: atomic: server tests change these while the engine's thread runs forward().
  // Model::health: what a runner that can no longer run reports (a tensor-parallel group whose
  // rank died); empty when healthy. Set from a test thread, read by the server's.
  std::string health() const override {
    std::lock_guard<std::mutex> lock(health_mu);
    return unhealthy;
  }
  void set_unhealthy(const std::string& why) {
    std::lock_guard<std::mutex> lock(health_mu);
    unhealthy = why;
  }
  mutable std::mutex health_mu;
  std::string unhealthy;
  std::atomic<int32_t> eos_every{0};
  float eos_logit = -10.f;                  // the eos logits where eos_every does not favour them
  std::atomic<std::chrono::microseconds> step_delay{std::chrono::microseconds(0)};  // slow steps
  int64_t num_forward_calls = 0;            // every step (forward_greedy runs forward)
  int64_t fail_on_forward = -1;             // that forward call (1-based) throws Error
  int64_t num_greedy_calls = 0;             // the steps that took forward_greedy
  int64_t num_sample_calls = 0;             // the steps that took forward_sample
  int64_t num_chained_passes = 0;           // passes begun with stand-in tokens
  int64_t num_chained_sampled_passes = 0;   // of those, sampled ones
  int32_t open_passes = 0;                  // begun and not yet finished
  std::vector<BegunPass> begun;             // every pass begun, in order
  std::vector<int32_t> batch_tokens;        // tokens per forward call
  std::vector<int32_t> batch_seqs;          // sequences per forward call

 private:
  ModelConfig cfg_;
};

// Byte-level "tokenizer" for tests: token id = byte value (vocab 256).
inline std::string fake_decode(const std::vector<int32_t>& ids) {
  std::string s;
  for (int32_t id : ids) s.push_back(char(uint8_t(id)));
  return s;
}
inline std::vector<int32_t> fake_encode(const std::string& text) {
  std::vector<int32_t> ids;
  for (unsigned char c : text) ids.push_back(int32_t(c));
  return ids;
}

}  // namespace pagedattn::fakes
