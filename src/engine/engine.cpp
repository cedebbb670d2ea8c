// The step loop: schedule -> forward -> commit -> sample -> stop checks ->
// outputs.
#include "pagedattn/engine.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <random>

#include "beam_search.h"
#include "engine_counters.h"
#include "pagedattn/error.h"
#include "request_state.h"
#include "utf8.h"

namespace pagedattn {

using Clock = std::chrono::steady_clock;

const char* finish_reason_name(FinishReason r) {
  switch (r) {
    case FinishReason::none:
      return "";
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      return "cancelled";
  }
  return "";
}

namespace {

uint64_t splitmix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

std::unique_ptr<Sequence> make_sequence(const Request& req, uint64_t base_seed, RequestId id,
                                        int32_t index) {
  SamplingParams p = req.sampling;
  p.seed = splitmix(base_seed ^ splitmix(uint64_t(index)));
  auto s = std::make_unique<Sequence>(p);
  if (p.json_object) s->json.emplace();
  s->request_id = id;
  s->index = index;
  s->cache_salt = req.cache_salt;
  return s;
}

}  // namespace

Engine::Engine(std::unique_ptr<Model> model, const EngineConfig& config, DecodeFn decode)
    : config_(config),
      model_(std::move(model)),
      decode_(std::move(decode)),
      counters_(std::make_unique<Counters>()) {
  PA_CHECK(model_ != nullptr, "Engine: model is null");
  model_->set_exact_matmul(config.exact_matmul);
  const ModelConfig& mc = model_->config();
  const DType dtype = resolve_kv_dtype(config.kv_cache_dtype, model_->device());
  // NOTE: an fp8 cache needs per-head scales from a calibration pass before its first write; a
  // default scale of 1 is the commonest source of garbage output with fp8 KV.
  PA_CHECK(
      dtype != DType::fp8_e4m3 || !config.kv_calibration_tokens.empty(),
      "Engine: kv_cache_dtype fp8 needs kv_calibration_tokens (the tokenized calibration text)");
  PA_CHECK(config.max_model_len >= 0, "Engine: max_model_len must be >= 0, got ",
           config.max_model_len);
  max_model_len_ = config.max_model_len > 0 ? config.max_model_len : mc.max_position_embeddings;
  PA_CHECK(max_model_len_ >= 2, "Engine: max_model_len must be >= 2, got ", max_model_len_);

  KvCacheConfig kc;
  kc.num_layers = mc.num_layers;
  kc.num_kv_heads = mc.num_kv_heads;
  kc.head_dim = mc.head_dim;
  kc.page_size = config.page_size;
  model_->adapt_cache_config(kc);
  // The pages' bytes are this process's: a tensor-parallel rank holds only its KV heads.
  ModelConfig page_shape = mc;
  page_shape.num_kv_heads = kc.num_kv_heads;
  if (config.kv_cache_tokens == 0 && config.kv_cache_memory_mib == 0 &&
      config.kv_cache_memory_fraction != 0) {
    const int64_t free_b = free_memory_bytes(model_->device());
    EngineConfig sized = config;
    sized.kv_cache_memory_mib = kv_fraction_mib(config.kv_cache_memory_fraction, free_b);
    PA_CHECK(sized.kv_cache_memory_mib > 0, "Engine: kv_cache_memory_fraction ",
             config.kv_cache_memory_fraction, " of ", free_b, " free bytes is no memory");
    if (config.log_startup)
      std::fprintf(stderr, "pagedattn: KV budget %.0f%% of %.1f MiB free = %.1f MiB\n",
                   config.kv_cache_memory_fraction * 100, double(free_b) / (1024.0 * 1024.0),
                   sized.kv_cache_memory_mib);
    kc.num_pages = kv_num_pages(sized, page_shape, dtype);
  } else {
    kc.num_pages = kv_num_pages(config, page_shape, dtype);
  }
  kc.dtype = dtype;
  kc.device = model_->device();
  kc.enable_prefix_cache = config.enable_prefix_cache;
  cache_ = std::make_unique<KvCache>(kc);
  if (dtype == DType::fp8_e4m3) calibrate_kv_scales(*model_, *cache_, config.kv_calibration_tokens);

  SchedulerConfig sc;
  sc.max_num_batched_tokens = config.max_num_batched_tokens;
  sc.max_num_seqs = config.max_num_seqs;
  sc.watermark_pages = config.watermark_pages;
  sc.enable_prefix_cache = config.enable_prefix_cache;
  sc.prefill_first = config.prefill_first;
  sc.admission = config.admission;
  sc.victim = config.victim;
  sc.preemption = config.preemption;
  PA_CHECK(std::isfinite(config.swap_space_mib) &&
               (config.swap_space_mib >= 0 || config.swap_space_mib == -1),
           "Engine: swap_space_mib must be >= 0 (or -1: the default), got ", config.swap_space_mib);
  const double swap_mib = config.swap_space_mib >= 0 ? config.swap_space_mib
                          : kc.device == Device::cuda ? EngineConfig::kDefaultSwapMiB
                                                      : 0.0;
  sc.swap_space_bytes = int64_t(swap_mib * 1024.0 * 1024.0);
  scheduler_ = std::make_unique<Scheduler>(sc, *cache_);
  // NOTE: page-locked host memory is pinned at a few GB/s (1.8 on an H100 machine, slower than
  // the copies themselves: 42 GB/s): taken on demand, it makes the first swaps cost more than
  // recomputing. Pinned on a thread beside the decode steps, it halved their rate (the driver's
  // lock), so a server takes it here, before its first request. A tensor-parallel cache does not
  // swap.
  if (config.reserve_swap_space && kc.device == Device::cuda && sc.swap_space_bytes > 0 &&
      sc.preemption != PreemptionMode::recompute && !kc.record_page_copies)
    cache_->reserve_swap_space(size_t(sc.swap_space_bytes));
  PA_CHECK(config.schedule_ahead >= -1 && config.schedule_ahead <= 1,
           "Engine: schedule_ahead must be -1 (the runner's choice), 0 or 1, got ",
           config.schedule_ahead);
  schedule_ahead_ = config.device_sampling &&
                    (config.schedule_ahead < 0 ? model_->overlaps_passes() : config.schedule_ahead);
  eos_ids_ = mc.eos_token_ids;
  eos_ids_.insert(eos_ids_.end(), config.eos_token_ids.begin(), config.eos_token_ids.end());

  if (config.log_startup) {
    const int64_t tokens = kv_capacity_tokens();
    const double mib = double(tokens) * 2 * mc.num_layers * kc.num_kv_heads * mc.head_dim *
                       double(dtype_size(dtype)) / (1024.0 * 1024.0);
    std::fprintf(stderr,
                 "pagedattn: KV cache: %d pages x %d tokens = %lld tokens "
                 "(%.1f MiB, %s, %s); "
                 "max concurrency at %d tokens per request: %.2fx\n",
                 kc.num_pages, kc.page_size, (long long)tokens, mib,
                 std::string(dtype_name(dtype)).c_str(), device_name(kc.device).c_str(),
                 max_model_len_, double(tokens) / double(max_model_len_));
  }
}

Engine::~Engine() = default;

int64_t Engine::kv_capacity_tokens() const {
  return int64_t(cache_->config().num_pages) * cache_->config().page_size;
}

namespace {

// Throws RequestError(param, code, "add_request: " + parts) unless ok.
template <class... Args>
void check_request(bool ok, const char* param, const char* code, Args&&... parts) {
  if (!ok)
    throw RequestError(param, code, detail::concat("add_request: ", std::forward<Args>(parts)...));
}
constexpr const char* kInvalid = "invalid_value";
constexpr const char* kContext = "context_length_exceeded";

}  // namespace

void Engine::validate(const Request& req) const {
  const int32_t vocab = model_->config().vocab_size;
  check_request(!req.prompt.empty(), "prompt", kInvalid, "prompt is empty");
  for (size_t i = 0; i < req.prompt.size(); ++i)
    check_request(req.prompt[i] >= 0 && req.prompt[i] < vocab, "prompt", kInvalid, "prompt[", i,
                  "] = ", req.prompt[i], " is outside the vocabulary of ", vocab);
  // NOTE: the one place that says a prompt must fit: the context (room for one token of output)
  // and the KV cache (the scheduler trusts it).
  const int64_t len = int64_t(req.prompt.size());
  check_request(len < max_model_len_, "prompt", kContext, "prompt of ", len,
                " tokens does not leave room for output within max_model_len ", max_model_len_,
                ": this model's maximum context length is ", max_model_len_, " tokens");
  check_request(len < kv_capacity_tokens(), "prompt", kContext, "prompt of ", len,
                " tokens does not fit in the KV cache (", kv_capacity_tokens(), " tokens)");
  check_request(req.n >= 1 && req.n <= Request::kMaxSequences, "n", kInvalid, "n must be in [1, ",
                Request::kMaxSequences, "], got ", req.n);
  check_request(req.max_tokens >= 1, "max_tokens", kInvalid, "max_tokens must be >= 1, got ",
                req.max_tokens);
  check_request(req.best_of == 0 || (req.best_of >= req.n && req.best_of <= Request::kMaxSequences),
                "best_of", kInvalid, "best_of must be 0 or in [n = ", req.n, ", ",
                Request::kMaxSequences, "], got ", req.best_of);
  if (req.use_beam_search) {
    check_request(req.beam_width >= 0, "beam_width", kInvalid, "beam_width must be >= 0, got ",
                  req.beam_width);
    check_request(req.width() >= req.n && req.width() <= Request::kMaxBeamWidth, "beam_width",
                  kInvalid, "beam_width must be in [n = ", req.n, ", ", Request::kMaxBeamWidth,
                  "], got ", req.width());
    check_request(std::isfinite(req.length_penalty), "length_penalty", kInvalid,
                  "length_penalty must be finite");
  }
  try {
    validate_sampling_params(req.sampling);
  } catch (const RequestError&) {
    throw;
  } catch (const Error& e) {
    // "sampling: <field> ...": the field names the parameter.
    std::string what = e.what(), param = "sampling";
    const std::string prefix = "sampling: ";
    if (what.rfind(prefix, 0) == 0)
      param = what.substr(prefix.size(), what.find(' ', prefix.size()) - prefix.size());
    throw RequestError(param, kInvalid, "add_request: " + what);
  }
  check_request(req.sampling.stop.empty() || decode_, "stop", kInvalid,
                "stop strings need a tokenizer");
  for (const std::string& s : req.sampling.stop)
    check_request(!s.empty(), "stop", kInvalid, "stop strings must not be empty");
  for (int32_t t : req.sampling.stop_token_ids)
    check_request(t >= 0 && t < vocab, "stop_token_ids", kInvalid, "stop_token_ids entry ", t,
                  " is outside the vocabulary");
  for (const auto& [t, b] : req.sampling.logit_bias)
    check_request(t < vocab, "logit_bias", kInvalid, "logit_bias token ", t,
                  " is outside the vocabulary of ", vocab);
  if (req.return_logits) {
    check_request(req.num_sequences() == 1 && !req.use_beam_search, "return_logits", kInvalid,
                  "return_logits needs one sequence (n = 1, no beam search or best_of)");
  }
  check_request(req.forced_tokens.empty() || req.return_logits, "forced_tokens", kInvalid,
                "forced_tokens needs return_logits");
  for (size_t i = 0; i < req.forced_tokens.size(); ++i)
    check_request(req.forced_tokens[i] >= 0 && req.forced_tokens[i] < vocab, "forced_tokens",
                  kInvalid, "forced_tokens[", i, "] = ", req.forced_tokens[i],
                  " is outside the vocabulary of ", vocab);
  check_request(req.sampling.logprobs < 0 || !req.use_beam_search, "logprobs", kInvalid,
                "logprobs cannot be used with beam search");
  if (req.sampling.json_object) {
    check_request(bool(decode_), "response_format", kInvalid, "json_object needs a tokenizer");
    check_request(!req.holds_output(), "response_format", kInvalid,
                  "json_object cannot be used with beam search or best_of > n");
  }
}

const std::vector<std::string>& Engine::token_bytes() {
  if (token_bytes_.empty()) {
    const int32_t vocab = model_->config().vocab_size;
    token_bytes_.reserve(size_t(vocab));
    for (int32_t t = 0; t < vocab; ++t) token_bytes_.push_back(decode_({t}));
  }
  return token_bytes_;
}

RequestId Engine::add_request(Request req, RequestId id) {
  validate(req);
  return enqueue(std::move(req), id);
}

RequestId Engine::enqueue(Request req, RequestId id) {
  if (id < 0) id = new_request_id();
  PA_CHECK(!requests_.count(id), "add_request: id ", id, " is already in use");
  auto rs = std::make_unique<RequestState>();
  rs->id = id;
  rs->req = std::move(req);
  rs->base_seed = rs->req.seed
                      ? *rs->req.seed
                      : (uint64_t(std::random_device{}()) << 32) ^ uint64_t(std::random_device{}());
  rs->arrival = Clock::now();
  rs->last_token.resize(size_t(rs->req.num_sequences()));
  rs->finish_sent.assign(size_t(rs->req.num_sequences()), false);
  rs->track_logprobs = rs->req.num_sequences() > 1 || rs->req.holds_output();
  auto seq = make_sequence(rs->req, rs->base_seed, id, 0);
  seq->tokens = rs->req.prompt;
  seq->prompt_len = int32_t(seq->tokens.size());
  seq->editor = LogitEditor(seq->sampler.params(), seq->tokens);
  seq->all_logit_rows = rs->req.return_logits;
  seq->max_length =
      int32_t(std::min<int64_t>(int64_t(seq->prompt_len) + rs->req.max_tokens, max_model_len_));
  // NOTE: forks and beams multiply a request's growth after its prompt; their forecast is an
  // estimate (the scheduler keeps its watermark for it).
  seq->exact_length = rs->req.ignore_eos && rs->req.sampling.stop_token_ids.empty() &&
                      rs->req.sampling.stop.empty() && rs->req.num_sequences() == 1;
  // NOTE: 2^24 orders per request leave room for every beam a request can fork.
  seq->order = (arrivals_ << 24);
  rs->base_order = seq->order;
  scheduler_->add_waiting(seq.get());
  ++arrivals_;
  counters_->prompt_tokens += int64_t(rs->req.prompt.size());
  rs->seqs.push_back(std::move(seq));
  requests_[id] = std::move(rs);
  return id;
}

void Engine::cancel(RequestId id, const std::string& error) {
  auto it = requests_.find(id);
  if (it == requests_.end()) return;
  RequestState& rs = *it->second;
  if (rs.cancelled) return;
  rs.cancelled = true;
  rs.error = error;
  for (auto& s : rs.seqs)
    if (!s->finished()) finish_seq(*s, FinishReason::cancelled);
  pending_final_.push_back(id);
}

bool Engine::is_stop_token(int32_t token, const std::vector<int32_t>& stop_token_ids) const {
  return std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end() ||
         std::find(stop_token_ids.begin(), stop_token_ids.end(), token) != stop_token_ids.end();
}

bool Engine::has_work() const {
  return scheduler_->has_work() || !pending_final_.empty() || ahead_ != nullptr;
}

void Engine::finish_seq(Sequence& seq, FinishReason reason) {
  seq.finish = reason;
  scheduler_->remove(&seq);  // frees its pages now
  // Whatever text was held back (an incomplete character, a possible
  // stop-string prefix) is released unless a stop string cut the output.
  if (!seq.pending_bytes.empty()) {
    seq.new_text += seq.stop_matcher.feed(utf8_sanitize(seq.pending_bytes));
    seq.pending_bytes.clear();
  }
  seq.new_text += seq.stop_matcher.flush();
}

void Engine::fork_children(RequestState& rs, Sequence& parent) {
  for (int32_t i = 1; i < rs.req.num_sequences(); ++i) {
    auto child = make_sequence(rs.req, rs.base_seed, rs.id, i);
    child->tokens = parent.tokens;
    child->prompt_len = parent.prompt_len;
    child->editor = parent.editor;
    child->max_length = parent.max_length;
    child->exact_length = parent.exact_length;
    child->order = parent.order + uint64_t(i);
    child->cache_seq = cache_->fork(parent.cache_seq);  // shares every page of the prompt
    child->num_computed = parent.num_computed;
    scheduler_->add_running(child.get());
    rs.seqs.push_back(std::move(child));
  }
  parent.forked = true;
}

void Engine::append_token(RequestState& rs, Sequence& seq, int32_t token) {
  seq.tokens.push_back(token);
  after_token(rs, seq);
}

void Engine::after_token(RequestState& rs, Sequence& seq) {
  const auto now = Clock::now();
  const int32_t token = seq.tokens.back();
  seq.editor.add_output(token);
  ++counters_->generation_tokens;
  if (!rs.first_token_seen) {
    rs.first_token_seen = true;
    counters_->ttft.observe(std::chrono::duration<double>(now - rs.arrival).count());
  }
  if (rs.last_token.size() <= size_t(seq.index)) rs.last_token.resize(size_t(seq.index) + 1);
  auto& last = rs.last_token[size_t(seq.index)];
  if (seq.num_generated() > 1)
    counters_->itl.observe(std::chrono::duration<double>(now - last).count());
  last = now;

  const bool eos =
      !rs.req.ignore_eos && std::find(eos_ids_.begin(), eos_ids_.end(), token) != eos_ids_.end();
  const bool stop_token = seq.sampler.is_stop_token(token);
  if (decode_ && !eos && !stop_token) {
    seq.pending_bytes += decode_({token});
    const size_t complete = utf8_complete_prefix(seq.pending_bytes);
    if (complete > 0) {
      seq.new_text +=
          seq.stop_matcher.feed(std::string_view(seq.pending_bytes).substr(0, complete));
      seq.pending_bytes.erase(0, complete);
    }
  }
  if (eos || stop_token || seq.stop_matcher.stopped())
    finish_seq(seq, FinishReason::stop);
  else if (seq.num_generated() >= rs.req.max_tokens || seq.num_tokens() >= max_model_len_)
    finish_seq(seq, FinishReason::length);
}

void Engine::sample_scheduled(const SchedulerOutput& out, const Tensor& logits,
                              std::vector<RequestId>& touched) {
  const int64_t vocab = logits.dim(1);
  std::vector<float> masked;
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.logit_row < 0) continue;
    Sequence& seq = *s.seq;
    RequestState& rs = *requests_.at(seq.request_id);
    std::span<const float> row(logits.data_as<float>() + int64_t(s.logit_row) * vocab,
                               size_t(vocab));
    touched.push_back(seq.request_id);
    if (rs.req.use_beam_search) {
      // Enough continuations per beam that width of them survive ending tokens.
      rs.beam_pending[&seq] = beam::top_logprobs(row, 2 * rs.req.width() + 1);
      continue;
    }
    const size_t first_new = rs.seqs.size();
    if (rs.req.num_sequences() > 1 && seq.index == 0 && !seq.forked) fork_children(rs, seq);
    auto sample = [&](Sequence& q) {
      std::span<const float> r = row;
      if (q.json) {
        // NOTE: the constraint applies before every other filter: top-k, top-p and min-p choose
        // among the tokens that keep the output a JSON prefix.
        masked.assign(row.begin(), row.end());
        if (mask_json_logits(*q.json, token_bytes(), masked) == 0) {
          finish_seq(q, FinishReason::stop);  // no token continues it (a vocabulary without one)
          return;
        }
        r = masked;
      }
      const std::vector<int32_t>& forced = rs.req.forced_tokens;
      const size_t g = size_t(q.num_generated());
      RowSampling plan_row = row_of(rs, q);
      const int32_t want = plan_row.logprobs;
      plan_row.logprobs = -1;  // of the raw row, below (a JSON row draws from its masked copy)
      TokenLogprobs picked;
      picked.token =
          g < forced.size() ? forced[g] : sample_row(r, plan_row, q.editor.edits()).token;
      if (want >= 0) picked = token_logprobs(row, picked.token, want);
      if (q.json) q.json->feed(token_bytes()[size_t(picked.token)]);
      take_token(rs, q, picked);
      if (q.json && q.json->complete() && !q.finished()) finish_seq(q, FinishReason::stop);
    };
    sample(seq);
    for (size_t i = first_new; i < rs.seqs.size(); ++i) sample(*rs.seqs[i]);
  }
}

RowSampling Engine::row_of(const RequestState& rs, const Sequence& seq) const {
  const SamplingParams& p = seq.sampler.params();
  const int32_t want = p.logprobs >= 0 ? p.logprobs : (rs.track_logprobs ? 0 : -1);
  return row_sampling(p, uint64_t(seq.num_generated()), want);
}

void Engine::take_token(RequestState& rs, Sequence& seq, const TokenLogprobs& picked) {
  record_logprobs(rs, seq, picked);
  append_token(rs, seq, picked.token);
}

void Engine::record_logprobs(RequestState& rs, Sequence& seq, const TokenLogprobs& picked) {
  if (rs.track_logprobs) seq.cumulative_logprob += picked.logprob;
  const int32_t want = seq.sampler.params().logprobs;
  if (want >= 0) {
    seq.new_logprobs.push_back(picked);
    if (int32_t(seq.new_logprobs.back().top.size()) > want)
      seq.new_logprobs.back().top.resize(size_t(want));
  }
}

bool Engine::sample_step(const SchedulerOutput& out) const {
  if (!config_.device_sampling) return false;
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.first_logit_row >= 0) return false;  // its rows are wanted
    if (s.logit_row < 0) continue;
    const RequestState& rs = *requests_.at(s.seq->request_id);
    const Sequence& q = *s.seq;
    if (rs.req.use_beam_search || q.json || !rs.req.forced_tokens.empty()) return false;
    if (rs.req.num_sequences() > 1 && q.index == 0 && !q.forked) return false;  // forks here
  }
  return true;
}

const SamplePlan& Engine::sample_plan(const SchedulerOutput& out) {
  SamplePlan& plan = plan_;
  plan.rows.assign(out.batch.logit_rows.size(), RowSampling{});
  plan.edits.clear();
  // NOTE: one allocation for every row's edits (a row with a repetition penalty has one per
  // distinct token of its history): growing the vector row by row copied them again and again,
  // 0.1 ms a step at 32 rows of 512-token prompts. The capacity stays for the next steps, and
  // doubles when it must grow (the histories grow every step).
  size_t total = 0;
  for (const ScheduledSeq& s : out.scheduled)
    if (s.logit_row >= 0) total += s.seq->editor.edits().size();
  if (total > plan.edits.capacity())
    plan.edits.reserve(std::max(total, 2 * plan.edits.capacity()));
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.logit_row < 0) continue;
    const Sequence& q = *s.seq;
    if (q.finished()) continue;  // cancelled while its pass ran: argmax, and dropped
    RowSampling r = row_of(*requests_.at(q.request_id), q);
    r.edit_begin = int32_t(plan.edits.size());
    const std::vector<LogitEdit>& e = q.editor.edits();
    plan.edits.insert(plan.edits.end(), e.begin(), e.end());
    r.edit_end = int32_t(plan.edits.size());
    plan.rows[size_t(s.logit_row)] = r;
  }
  return plan;
}

bool Engine::greedy_step(const SchedulerOutput& out) const {
  if (!config_.device_sampling) return false;
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.first_logit_row >= 0) return false;  // its rows are wanted
    if (s.logit_row >= 0 && !requests_.at(s.seq->request_id)->plain_greedy()) return false;
  }
  return true;
}

void Engine::append_greedy(const SchedulerOutput& out, const std::vector<int32_t>& ids,
                           std::vector<RequestId>& touched) {
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.logit_row < 0 || s.seq->finished()) continue;  // finished: cancelled while it ran
    Sequence& seq = *s.seq;
    touched.push_back(seq.request_id);
    append_token(*requests_.at(seq.request_id), seq, ids[size_t(s.logit_row)]);
  }
}

void Engine::keep_logit_rows(const ScheduledSeq& s, const Tensor& logits) {
  Sequence& seq = *s.seq;
  const int64_t vocab = logits.dim(1);
  for (int32_t i = 0; i < s.num_tokens; ++i) {
    const int32_t position = seq.num_computed + i;      // before commit: the step's first token
    if (position < seq.logit_positions_done) continue;  // recomputed after a preemption
    const float* row = logits.data_as<float>() + int64_t(s.first_logit_row + i) * vocab;
    seq.new_logits.insert(seq.new_logits.end(), row, row + vocab);
    seq.logit_positions_done = position + 1;
  }
}

std::vector<RequestOutput> Engine::generate(std::vector<Request> requests) {
  PA_CHECK(requests_.empty(), "generate: the engine has ", requests_.size(),
           " requests in flight (step() them to the end first)");
  for (const Request& r : requests) validate(r);
  std::vector<RequestId> ids;
  std::map<RequestId, RequestOutput> done;
  for (Request& r : requests) {
    ids.push_back(enqueue(std::move(r), -1));
    done[ids.back()].id = ids.back();
  }
  while (has_work()) {
    for (RequestOutput& o : step()) {
      RequestOutput& d = done.at(o.id);
      for (SequenceOutput& so : o.seqs) {
        auto it = std::find_if(d.seqs.begin(), d.seqs.end(),
                               [&](const SequenceOutput& x) { return x.index == so.index; });
        if (it == d.seqs.end()) {
          d.seqs.push_back(std::move(so));
          continue;
        }
        it->new_tokens.insert(it->new_tokens.end(), so.new_tokens.begin(), so.new_tokens.end());
        it->new_text += so.new_text;
        it->logits.insert(it->logits.end(), so.logits.begin(), so.logits.end());
        it->logprobs.insert(it->logprobs.end(), so.logprobs.begin(), so.logprobs.end());
        it->finish = so.finish;
        it->cumulative_logprob = so.cumulative_logprob;
      }
      d.prompt_tokens = o.prompt_tokens;
      d.cached_tokens = o.cached_tokens;
      d.completion_tokens = o.completion_tokens;
      d.finished = o.finished;
      d.error = o.error;
    }
  }
  std::vector<RequestOutput> results;
  for (RequestId id : ids) {
    RequestOutput& d = done.at(id);
    std::sort(d.seqs.begin(), d.seqs.end(),
              [](const SequenceOutput& a, const SequenceOutput& b) { return a.index < b.index; });
    results.push_back(std::move(d));
  }
  return results;
}

RequestOutput Engine::collect(RequestState& rs) {
  if (rs.req.holds_output()) return collect_held(rs);
  RequestOutput o;
  o.id = rs.id;
  o.prompt_tokens = int32_t(rs.req.prompt.size());
  o.cached_tokens = std::max(rs.cached_tokens, 0);
  bool all_finished = true;
  for (auto& sp : rs.seqs) {
    Sequence& s = *sp;
    o.completion_tokens += s.num_generated();
    all_finished = all_finished && s.finished();
    const bool report_finish = s.finished() && !rs.finish_sent[size_t(s.index)];
    if (s.tokens_sent == size_t(s.num_generated()) && s.new_text.empty() && s.new_logits.empty() &&
        s.new_logprobs.empty() && !report_finish)
      continue;
    SequenceOutput so;
    so.index = s.index;
    so.new_tokens.assign(s.tokens.begin() + s.prompt_len + int64_t(s.tokens_sent), s.tokens.end());
    so.new_text = std::move(s.new_text);
    s.new_text.clear();
    s.tokens_sent = size_t(s.num_generated());
    so.logits = std::move(s.new_logits);
    s.new_logits.clear();
    so.logprobs = std::move(s.new_logprobs);
    s.new_logprobs.clear();
    so.finish = s.finish;
    so.cumulative_logprob = s.cumulative_logprob;
    if (report_finish) rs.finish_sent[size_t(s.index)] = true;
    o.seqs.push_back(std::move(so));
  }
  // NOTE: a prompt that the cache cannot hold finishes before it forks; no sibling will come.
  const bool unforked_end = rs.seqs.size() == 1 && !rs.seqs[0]->forked;
  o.finished = all_finished &&
               (rs.cancelled || unforked_end || int32_t(rs.seqs.size()) == rs.req.num_sequences());
  // A request that ends before it forks (cancelled while queued or prefilling, or a prompt the
  // cache cannot hold) ends its other sequences too, with the first one's reason and no tokens:
  // every index of the request is reported finished once.
  if (o.finished && rs.seqs.size() == 1 && rs.req.num_sequences() > 1) {
    for (int32_t i = 0; i < rs.req.num_sequences(); ++i) {
      if (i == rs.seqs[0]->index || rs.finish_sent[size_t(i)]) continue;
      SequenceOutput so;
      so.index = i;
      so.finish = rs.seqs[0]->finish;
      rs.finish_sent[size_t(i)] = true;
      o.seqs.push_back(std::move(so));
    }
  }
  o.error = rs.error;
  return o;
}

bool Engine::can_schedule_next(const SchedulerOutput& out, bool sampled) const {
  if (sampled && !model_->chains_after_sampled()) return false;
  // NOTE: a waiting request may be admitted into the next step (its prompt's tokens are known);
  // every row of that step must be one the device picks (greedy or by a sample plan).
  for (const auto& [id, rs] : requests_)
    if (!rs->cancelled && !rs->device_picks()) return false;
  int32_t rows = 0;
  int64_t pages = 0;
  for (const ScheduledSeq& s : out.scheduled) {
    const Sequence& q = *s.seq;
    if (q.finished()) continue;  // cancelled while its pass ran
    ++rows;
    if (s.logit_row < 0) {
      // A prompt chunk before its last: the next chunks' tokens are known. Their pages are
      // counted as the whole rest of the prompt (the next step takes at most that).
      // NOTE: each chunk of a long prompt was read before the next was scheduled and planned,
      // the GPU idle meanwhile. Serving 2048-token prompts in 1024-token steps beside decode rows
      // (Llama-3-8B shapes, H100): device idle 0.73-0.88% -> 0.31-0.43% of the run, +1.1% output.
      if (s.first_logit_row >= 0) return false;  // its rows are wanted (not a greedy step anyway)
      const int32_t rest = q.num_tokens() - (q.num_computed + s.num_tokens);
      if (rest <= 0) return false;
      pages += cache_->pages_needed(q.cache_seq, rest);
      continue;
    }
    // NOTE: a sequence that this step's token ends for sure (max_tokens, the context) would take
    // a row of the next step computed for nothing.
    if (q.num_tokens() + 1 >= q.max_length) return false;
    pages += cache_->pages_needed(q.cache_seq, 1);
  }
  // Every running sequence has a row next (a decode row, or its prompt's next chunk), and their
  // pages fit without a preemption (whose swap would copy pages that the running pass still
  // writes).
  return rows > 0 && rows == scheduler_->num_running() && pages <= cache_->num_available_pages();
}

bool Engine::schedule_next(const SchedulerOutput& out, bool sampled) {
  if (!can_schedule_next(out, sampled)) return false;
  for (const ScheduledSeq& s : out.scheduled) {
    if (s.seq->finished()) continue;
    RequestState& rs = *requests_.at(s.seq->request_id);
    if (rs.cached_tokens < 0) rs.cached_tokens = s.seq->num_computed;
  }
  scheduler_->commit(out, /*written=*/false);
  for (const ScheduledSeq& s : out.scheduled)
    if (!s.seq->finished() && s.logit_row >= 0) s.seq->tokens.push_back(chained_token(s.logit_row));
  // NOTE: from here on `out` is committed whatever happens; a failure ends its requests (their
  // stand-ins are dropped with the picks, take_ahead_picks) while its pass still runs to its end.
  try {
    auto next = std::make_unique<SchedulerOutput>(scheduler_->schedule());
    PA_CHECK(next->preempted.empty() && next->out_of_memory.empty(),
             "the step scheduled ahead preempted a sequence (its pages were counted before)");
    if (next->empty()) return true;
    const bool greedy = greedy_step(*next);
    PA_CHECK(greedy || sample_step(*next), "the step scheduled ahead has a row the device does ",
             "not pick");
    if (greedy)
      model_->begin_greedy(next->batch, *cache_);
    else
      model_->begin_sample(next->batch, *cache_);
    ahead_ = std::move(next);
    ahead_greedy_ = greedy;
  } catch (const std::exception& e) {
    for (const ScheduledSeq& s : out.scheduled)
      cancel(s.seq->request_id, std::string("step: scheduling ahead failed: ") + e.what());
  }
  return true;
}

void Engine::take_ahead_picks(const SchedulerOutput& out, const std::vector<int32_t>& ids,
                              const std::vector<TokenLogprobs>& picked,
                              std::vector<RequestId>& touched) {
  for (const ScheduledSeq& s : out.scheduled) {
    Sequence& q = *s.seq;
    if (s.logit_row < 0) {  // a prompt chunk: its pages written now
      if (!q.finished()) cache_->commit(q.cache_seq, q.num_computed);
      continue;
    }
    if (q.tokens.back() != chained_token(s.logit_row)) {
      PA_ASSERT(q.finished());  // cancelled before the next step was scheduled: no stand-in
      continue;
    }
    if (q.finished()) {  // cancelled after it: its token is dropped
      q.tokens.pop_back();
      continue;
    }
    const size_t row = size_t(s.logit_row);
    const int32_t position = q.num_tokens() - 1;
    const int32_t token = picked.empty() ? ids[row] : picked[row].token;
    q.tokens.back() = token;
    if (cache_->kv_len(q.cache_seq) > position) cache_->set_token(q.cache_seq, position, token);
    cache_->commit(q.cache_seq, q.num_computed);  // the pass has written its K/V now
    touched.push_back(q.request_id);
    RequestState& rs = *requests_.at(q.request_id);
    if (!picked.empty()) record_logprobs(rs, q, picked[row]);
    after_token(rs, q);
  }
}

std::vector<RequestOutput> Engine::step() {
  std::vector<RequestId> touched;
  // Requests that ended while the step read below had rows of theirs: freed as this call ends.
  const std::vector<std::unique_ptr<RequestState>> retired = std::move(retired_);
  retired_.clear();
  SchedulerOutput out;
  const bool begun = ahead_ != nullptr;  // a pass begun by the call before (schedule_next)
  if (begun) {
    out = std::move(*ahead_);
    ahead_.reset();
  } else {
    out = scheduler_->schedule();
  }
  for (Sequence* s : out.preempted) {  // a preempted beam recomputes its continuations
    auto it = requests_.find(s->request_id);
    if (it != requests_.end()) it->second->beam_pending.erase(s);
  }
  for (Sequence* s : out.out_of_memory) {
    requests_.at(s->request_id)->beam_pending.erase(s);
    finish_seq(*s, FinishReason::length);
    touched.push_back(s->request_id);
  }
  if (!out.empty()) {
    // NOTE: a greedy step downloads R token ids instead of R x vocab logits (16 MB at batch 32
    // with a 128K vocabulary on CUDA) and skips the host argmax.
    const bool greedy = begun ? ahead_greedy_ : greedy_step(out);
    const bool sampled = begun ? !ahead_greedy_ : !greedy && sample_step(out);
    Tensor logits;
    std::vector<int32_t> ids;
    std::vector<TokenLogprobs> picked;
    bool ok = true;
    bool committed = false;  // by schedule_next, which began the step after this one
    const Clock::time_point t0 = Clock::now();
    try {
      if ((greedy || sampled) && schedule_ahead_) {
        // NOTE: the next step is scheduled and begun while this one runs (a sampled one's plan is
        // built while its pass runs, and its picking enqueued first); this one's picks are read
        // (and its outputs handled, and handed out) while the next one runs.
        if (!begun && greedy) model_->begin_greedy(out.batch, *cache_);
        if (!begun && sampled) model_->begin_sample(out.batch, *cache_);
        if (sampled) model_->pick_sampled(sample_plan(out));
        committed = schedule_next(out, sampled);
        if (greedy)
          ids = model_->finish_greedy();
        else
          picked = model_->take_sampled();
      } else if (greedy) {
        ids = model_->forward_greedy(out.batch, *cache_);
      } else if (sampled) {
        // NOTE: the pass starts before the plan is built: its edits (one per distinct token of
        // each history under a repetition penalty) are copied and checked while a device runs.
        model_->begin_sample(out.batch, *cache_);
        picked = model_->finish_sample(sample_plan(out));
      } else {
        logits = model_->forward(out.batch, *cache_);
      }
      scheduler_->observe_step(out, std::chrono::duration<double>(Clock::now() - t0).count());
    } catch (const std::exception& e) {
      ok = false;
      // NOTE: an error from finish_greedy, pick_sampled or take_sampled drops the step begun
      // ahead too (Model's contract): its sequences are this step's.
      ahead_.reset();
      for (const ScheduledSeq& s : out.scheduled) {
        cancel(s.seq->request_id, std::string("step: the forward pass failed: ") + e.what());
        if (s.logit_row >= 0 && s.seq->tokens.back() < 0) s.seq->tokens.pop_back();  // stand-in
      }
    }
    if (ok) {
      if (greedy) {
        PA_ASSERT(ids.size() == out.batch.logit_rows.size());
        for (int32_t t : ids) PA_ASSERT(t >= 0 && t < model_->config().vocab_size);
      } else if (sampled) {
        PA_ASSERT(picked.size() == out.batch.logit_rows.size());
        for (const TokenLogprobs& t : picked)
          PA_ASSERT(t.token >= 0 && t.token < model_->config().vocab_size);
      } else {
        PA_ASSERT(logits.ndim() == 2 && logits.dim(0) == int64_t(out.batch.logit_rows.size()) &&
                  logits.dim(1) == model_->config().vocab_size);
      }
      if (committed) {
        take_ahead_picks(out, ids, picked, touched);
      } else {
        for (const ScheduledSeq& s : out.scheduled) {
          if (s.seq->finished()) continue;  // cancelled while its pass ran (begun ahead)
          RequestState& rs = *requests_.at(s.seq->request_id);
          if (rs.cached_tokens < 0) rs.cached_tokens = s.seq->num_computed;
          if (s.first_logit_row >= 0) keep_logit_rows(s, logits);
        }
        scheduler_->commit(out);
        if (greedy) {
          append_greedy(out, ids, touched);
        } else if (sampled) {
          for (const ScheduledSeq& s : out.scheduled) {
            if (s.logit_row < 0 || s.seq->finished()) continue;  // finished: cancelled meanwhile
            touched.push_back(s.seq->request_id);
            take_token(*requests_.at(s.seq->request_id), *s.seq, picked[size_t(s.logit_row)]);
          }
        } else {
          sample_scheduled(out, logits, touched);
        }
      }
    }
  }
  run_beam_steps(out, touched);
  ++counters_->steps;
  counters_->record_rate(Clock::now());
  touched.insert(touched.end(), pending_final_.begin(), pending_final_.end());
  pending_final_.clear();

  // Requests with rows in the step begun ahead outlive their end until the next step reads it.
  std::vector<RequestId> in_ahead;
  if (ahead_)
    for (const ScheduledSeq& s : ahead_->scheduled) in_ahead.push_back(s.seq->request_id);
  std::vector<RequestOutput> outputs;
  std::sort(touched.begin(), touched.end());
  touched.erase(std::unique(touched.begin(), touched.end()), touched.end());
  for (RequestId id : touched) {
    auto it = requests_.find(id);
    if (it == requests_.end()) continue;
    RequestOutput o = collect(*it->second);
    if (o.seqs.empty() && !o.finished) continue;
    if (o.finished) {
      ++(it->second->cancelled ? counters_->requests_cancelled : counters_->requests_finished);
      if (std::find(in_ahead.begin(), in_ahead.end(), id) != in_ahead.end())
        retired_.push_back(std::move(it->second));
      requests_.erase(it);
    }
    outputs.push_back(std::move(o));
  }
  return outputs;
}

int32_t Engine::num_running() const { return scheduler_->num_running(); }
int32_t Engine::num_waiting() const { return scheduler_->num_waiting(); }

EngineMetrics Engine::metrics() const {
  EngineMetrics m;
  const KvCacheStats st = cache_->stats();
  m.num_running = scheduler_->num_running();
  m.num_waiting = scheduler_->num_waiting();
  m.num_requests = int32_t(requests_.size());
  m.pages_total = st.num_pages;
  m.pages_used = st.pages_used;
  m.pages_free = st.pages_free;
  m.pages_cached = st.pages_cached;
  m.kv_capacity_tokens = kv_capacity_tokens();
  m.prefix_queried_tokens = st.prefix_queries;  // the cache counts its lookups, nothing else
  m.prefix_hit_tokens = st.prefix_hits;
  m.resumed_prefix_hit_tokens = st.resume_hits;
  m.preempted_computed_tokens = scheduler_->preempted_computed_tokens();
  m.preemptions = scheduler_->num_preemptions();
  m.preemptions_recompute = scheduler_->num_recompute_preemptions();
  const SwapStats& swap = scheduler_->swap_stats();
  m.preemptions_swap = swap.preemptions;
  m.swapped_tokens = swap.tokens;
  m.swap_out_bytes = swap.out_bytes;
  m.swap_in_bytes = swap.in_bytes;
  m.swap_seconds = swap.seconds;
  m.swap_pin_seconds = swap.pin_seconds;
  m.num_swapped = swap.swapped_now;
  m.swap_used_bytes = swap.used_bytes;
  m.swap_space_bytes = scheduler_->config().swap_space_bytes;
  m.recomputed_tokens = scheduler_->recomputed_tokens();
  m.admission_stalls = scheduler_->admission_stalls();
  counters_->fill(m);
  return m;
}

}  // namespace pagedattn
