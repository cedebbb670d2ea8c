// Engine: owns the model, the KV cache and the scheduler, and runs the step
// loop.
//
//   step(): schedule -> model.forward -> commit -> sample -> stop checks ->
//   outputs. A step whose every sampled sequence is plain greedy (temperature 0, no repetition
//   penalty, one sequence, no logprobs) runs model.forward_greedy instead and takes its ids; a
//   step whose rows need nothing but sample_plan.h's rules (no JSON constraint, beam, fork of a
//   prompt, forced token or kept logits) runs model.forward_sample with the step's plan: on a
//   device runner the logits never leave the device. Other steps download their logits and pick
//   on the host with the same rules.
//   Scheduling ahead (EngineConfig::schedule_ahead, on with the CUDA runner): a greedy step runs
//   as Model::begin_greedy / finish_greedy, and where nothing but plain greedy requests is alive
//   and every running sequence has a row in it, the engine commits it, schedules the next step
//   with stand-ins for its ids (chained_token) and begins it before it reads them; step() then
//   hands out this step's tokens while the next one runs. A row whose sequence this step ends
//   (EOS, a stop, a cancel) is computed and dropped.
// A finished or cancelled request frees its pages at once. Engine itself is
// single-threaded; AsyncEngine (async_engine.h) runs it on a background thread for the server.
#pragma once

#include <atomic>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/engine_config.h"
#include "pagedattn/engine_metrics.h"
#include "pagedattn/kv_budget.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"
#include "pagedattn/request.h"

namespace pagedattn {

// The engine's internals (src/engine/): the scheduler, its step output and a sequence's state.
class Scheduler;
struct SchedulerOutput;
struct ScheduledSeq;
struct Sequence;

class Engine {
 public:
  Engine(std::unique_ptr<Model> model, const EngineConfig& config, DecodeFn decode = {});
  ~Engine();
  Engine(const Engine&) = delete;
  Engine& operator=(const Engine&) = delete;

  // The engine's door: checks a request without queuing it (thread-safe: reads only fixed
  // configuration). Throws RequestError naming the field at fault; every check of a request
  // (its prompt fitting the context and the KV cache included) is here and nowhere else.
  void validate(const Request& req) const;
  // Queues a request (validated first). id < 0: a new id is assigned. Returns
  // the id.
  RequestId add_request(Request req, RequestId id = -1);
  // A fresh id (thread-safe).
  RequestId new_request_id() { return next_id_.fetch_add(1); }
  // Finishes a request as cancelled and frees its pages now; its final output
  // comes with the next step(). Unknown or finished ids are ignored (it may
  // have just finished).
  void cancel(RequestId id, const std::string& error = "");
  // One scheduling step. Returns the outputs of every request that produced
  // tokens or finished.
  std::vector<RequestOutput> step();
  // Offline batch use: queues every request (all validated first: one bad request queues none)
  // and steps until they finish. Returns one output per request, in order, each sequence's
  // tokens, text and logits whole. Needs an idle engine (no request in flight).
  std::vector<RequestOutput> generate(std::vector<Request> requests);
  bool has_work() const;
  int32_t num_active_requests() const { return int32_t(requests_.size()); }

  // Whether `token` ends a request's generation (unless it ignores eos): the model's or the
  // config's eos ids, or one of the request's stop_token_ids.
  bool is_stop_token(int32_t token, const std::vector<int32_t>& stop_token_ids) const;

  const EngineConfig& config() const { return config_; }
  // Whether greedy decode steps are scheduled ahead (EngineConfig::schedule_ahead as resolved).
  bool schedules_ahead() const { return schedule_ahead_; }
  const Model& model() const { return *model_; }
  const KvCache& cache() const { return *cache_; }
  int32_t max_model_len() const { return max_model_len_; }
  // Sequences the scheduler runs / holds back (metrics() has these and every counter).
  int32_t num_running() const;
  int32_t num_waiting() const;
  int64_t kv_capacity_tokens() const;
  EngineMetrics metrics() const;

 private:
  friend class AsyncEngine;  // validates in submit(), enqueues on its loop thread
  struct RequestState;
  // Queues a validated request (add_request's second half). Returns its id.
  RequestId enqueue(Request req, RequestId id);
  void sample_scheduled(const SchedulerOutput& out, const Tensor& logits,
                        std::vector<RequestId>& touched);
  // Whether every scheduled sequence with a logit row is plain greedy (RequestState::plain_greedy).
  bool greedy_step(const SchedulerOutput& out) const;
  // sample_scheduled for a greedy step: ids [logit_rows] from Model::forward_greedy.
  void append_greedy(const SchedulerOutput& out, const std::vector<int32_t>& ids,
                     std::vector<RequestId>& touched);
  // Whether every scheduled row can be picked by Model::forward_sample, and the step's plan.
  bool sample_step(const SchedulerOutput& out) const;
  // The plan is built in plan_, whose buffers are kept from step to step (no allocation, and no
  // fresh pages to fault in, for a step's tens of thousands of edits).
  const SamplePlan& sample_plan(const SchedulerOutput& out);
  // The plan row of a sequence's next token.
  RowSampling row_of(const RequestState& rs, const Sequence& seq) const;
  // A picked token: its logprobs recorded, then appended.
  void take_token(RequestState& rs, Sequence& seq, const TokenLogprobs& picked);
  // Request::return_logits: keeps the step's logit rows of s (positions not yet handed out).
  void keep_logit_rows(const ScheduledSeq& s, const Tensor& logits);
  void fork_children(RequestState& rs, Sequence& parent);
  void append_token(RequestState& rs, Sequence& seq, int32_t token);
  // The stop checks, text and counters of the token just appended (seq's last).
  void after_token(RequestState& rs, Sequence& seq);
  // Schedule ahead (EngineConfig::schedule_ahead): whether the step after `out` (a pass begun;
  // `sampled`: a sampled one) can be scheduled before out's picks are read, and doing it: out
  // committed, each of its sequences with a logit row given a stand-in token (chained_token; a
  // prompt chunk before its last has none: the next chunk's tokens are known), the next step
  // scheduled and begun (Model::begin_greedy or begin_sample) into ahead_. Returns whether out
  // was committed.
  bool can_schedule_next(const SchedulerOutput& out, bool sampled) const;
  bool schedule_next(const SchedulerOutput& out, bool sampled);
  // A committed step's picks (schedule_next): ids of a greedy step, else the sampled tokens. The
  // stand-ins become the tokens, in the cache's record too, and the pages the step wrote get their
  // hashes (prompt chunks' too); then record_logprobs (sampled) and after_token.
  void take_ahead_picks(const SchedulerOutput& out, const std::vector<int32_t>& ids,
                        const std::vector<TokenLogprobs>& picked, std::vector<RequestId>& touched);
  // take_token's first half: the pick's log-probabilities kept as the request asks.
  void record_logprobs(RequestState& rs, Sequence& seq, const TokenLogprobs& picked);
  void finish_seq(Sequence& seq, FinishReason reason);
  // decode_ of each token id alone (json_object's candidates), built on first use.
  const std::vector<std::string>& token_bytes();
  RequestOutput collect(RequestState& rs);
  // Beam search and best_of (engine_beam.cpp).
  void beam_step(RequestState& rs);
  void run_beam_steps(const SchedulerOutput& out, std::vector<RequestId>& touched);
  Sequence* fork_beam(RequestState& rs, Sequence& parent);
  void drop_seq(RequestState& rs, Sequence* seq);
  RequestOutput collect_held(RequestState& rs);

  EngineConfig config_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<KvCache> cache_;
  std::unique_ptr<Scheduler> scheduler_;
  DecodeFn decode_;
  std::vector<std::string> token_bytes_;  // [vocab] once a json_object request came
  std::vector<int32_t> eos_ids_;
  int32_t max_model_len_ = 0;
  std::atomic<RequestId> next_id_{1};
  uint64_t arrivals_ = 0;
  std::map<RequestId, std::unique_ptr<RequestState>> requests_;
  std::vector<RequestId> pending_final_;  // cancelled between steps
  bool schedule_ahead_ = false;
  // The greedy step begun ahead of the one the last step() read (its ids not taken yet), and the
  // requests that ended while it still had rows of theirs (kept until the next step() reads it).
  std::unique_ptr<SchedulerOutput> ahead_;
  bool ahead_greedy_ = false;  // ahead_ was begun as a greedy pass (else a sampled one)
  std::vector<std::unique_ptr<RequestState>> retired_;
  SamplePlan plan_;                       // sample_plan's
  struct Counters;
  std::unique_ptr<Counters> counters_;
};

}  // namespace pagedattn
