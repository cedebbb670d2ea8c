// Engine: owns the model, the KV cache and the scheduler, and runs the step
// loop.
//
//   step(): schedule -> model.forward -> commit -> sample -> stop checks ->
//   outputs. A step whose every sampled sequence is plain greedy (temperature 0, no repetition
//   penalty, one sequence, no logprobs) runs model.forward_greedy instead and takes its ids: on a
//   device runner the logits never leave the device.
// A finished or cancelled request frees its pages at once. Engine itself is
// single-threaded; AsyncEngine runs it on a background thread for the server
// (submit/cancel from any thread, outputs through per-request callbacks on the
// loop thread).
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <deque>
#include <functional>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <thread>
#include <unordered_map>
#include <vector>

#include "pagedattn/kv_cache.h"
#include "pagedattn/model.h"
#include "pagedattn/request.h"
#include "pagedattn/scheduler.h"

namespace pagedattn {

// A histogram with fixed upper bounds (Prometheus style; +Inf implied).
struct Histogram {
  std::vector<double> bounds;   // ascending upper bounds
  std::vector<int64_t> counts;  // [bounds.size() + 1], per bucket (not cumulative)
  double sum = 0;
  int64_t count = 0;

  Histogram() = default;
  explicit Histogram(std::vector<double> upper_bounds);
  void observe(double value);
};

// A snapshot of the engine's counters.
struct EngineMetrics {
  int32_t num_running = 0;  // sequences
  int32_t num_waiting = 0;
  int32_t num_requests = 0;  // active requests
  int32_t pages_total = 0, pages_used = 0, pages_free = 0, pages_cached = 0;
  int64_t kv_capacity_tokens = 0;
  int64_t prefix_queried_tokens = 0, prefix_hit_tokens = 0;
  int64_t preemptions = 0;            // every kind
  int64_t preemptions_recompute = 0;  // pages freed, recomputed at re-admission
  int64_t recomputed_tokens = 0;      // tokens computed again after a preemption
  int64_t admission_stalls = 0;       // steps the oldest waiting request waited for pages
  int64_t prompt_tokens = 0, generation_tokens = 0;
  int64_t requests_finished = 0, requests_cancelled = 0;
  int64_t steps = 0;
  double generation_tokens_per_s = 0;  // over the last few seconds
  Histogram ttft_s;                    // arrival -> first token
  Histogram itl_s;                     // between consecutive tokens of a sequence

  double prefix_hit_rate() const {
    return prefix_queried_tokens ? double(prefix_hit_tokens) / double(prefix_queried_tokens) : 0.0;
  }
};

// Token ids -> bytes, concatenative (byte-level BPE: decode(a + b) == decode(a)
// + decode(b)), special tokens skipped. Without one, outputs carry token ids
// only and stop strings are refused.
using DecodeFn = std::function<std::string(const std::vector<int32_t>&)>;

struct EngineConfig {
  // KV budget, first that is set: tokens, MiB, a fraction of free memory (the device's after the
  // weights are loaded; on the CPU, MemAvailable); else what the longest context takes for every
  // sequence at once (max_model_len x max_num_seqs tokens), at most kDefaultKvMiB.
  int64_t kv_cache_tokens = 0;
  double kv_cache_memory_mib = 0;
  double kv_cache_memory_fraction = 0;  // (0, 1]; 0: off
  int32_t block_size = 16;
  std::string kv_cache_dtype = "auto";  // auto (f32 on the CPU) | f32 | f16 | bf16 | fp8
  // fp8: the tokens of the calibration pass that sets the per-head scales (kv_calibration_text()).
  std::vector<int32_t> kv_calibration_tokens;
  // Ids that end generation besides the model's eos (the tokenizer's end-of-turn tokens).
  std::vector<int32_t> eos_token_ids;
  bool enable_prefix_cache = true;
  int32_t max_num_batched_tokens = 2048;
  int32_t max_num_seqs = 64;
  int32_t watermark_pages = -1;  // -1: 1% of the pool
  // The scheduler's admission and preemption victims (scheduler.h).
  AdmissionPolicy admission = AdmissionPolicy::lookahead;
  VictimPolicy victim = VictimPolicy::least_work;
  int32_t max_model_len = 0;  // 0: the model's max_position_embeddings
  bool log_startup = true;    // print the cache's capacity to stderr
  // CPU: f32 activations against the dequantised weights (Model::set_exact_matmul) instead of
  // int8 activation blocks.
  bool exact_matmul = false;
  // Plain greedy steps take their ids from Model::forward_greedy (picked where the logits are);
  // false: every step downloads its logits and picks on the host (the path of sampling).
  bool device_greedy = true;
  // SchedulerConfig::prefill_first: running decodes wait while a prefill can be scheduled.
  bool prefill_first = false;

  static constexpr double kDefaultKvMiB = 512;
};

// Pages for a config (validates the budget fields; throws Error naming the one
// at fault).
int32_t kv_num_pages(const EngineConfig& config, const ModelConfig& model, DType kv_dtype);
// --kv-cache-memory: MiB ("512", any value >= 1), a fraction ("0.5", in (0, 1)) or a percentage
// ("50%") of free memory. Exactly one of the fields is set. Throws Error ("kv_cache_memory: ...").
struct KvMemorySpec {
  double mib = 0;
  double fraction = 0;
};
KvMemorySpec parse_kv_cache_memory(const std::string& text);
// Bytes of MemAvailable in /proc/meminfo's text.
int64_t parse_mem_available(const std::string& meminfo);
// Free memory: cudaMemGetInfo's free bytes on CUDA, MemAvailable on the CPU.
int64_t free_memory_bytes(Device device);
// MiB that a fraction of free_bytes buys (validates the fraction).
double kv_fraction_mib(double fraction, int64_t free_bytes);
// "auto" -> the compute dtype of device's runner (f32 on the CPU, bf16 on CUDA), else parse_dtype.
DType resolve_kv_dtype(const std::string& name, Device device = Device::cpu);

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
  const Model& model() const { return *model_; }
  KvCache& cache() { return *cache_; }
  const KvCache& cache() const { return *cache_; }
  const Scheduler& scheduler() const { return *scheduler_; }
  int32_t max_model_len() const { return max_model_len_; }
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
  // Request::return_logits: keeps the step's logit rows of s (positions not yet handed out).
  void keep_logit_rows(const ScheduledSeq& s, const Tensor& logits);
  void fork_children(RequestState& rs, Sequence& parent);
  void append_token(RequestState& rs, Sequence& seq, int32_t token);
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
  struct Counters;
  std::unique_ptr<Counters> counters_;
};

// The thread-safe front: a background loop thread stepping an Engine.
class AsyncEngine {
 public:
  explicit AsyncEngine(std::unique_ptr<Engine> engine);
  ~AsyncEngine();  // stop()
  // Validates (throws Error, nothing queued) and queues the request; on_output
  // is called on the loop thread with each output, the last one with finished =
  // true (also on cancel or stop).
  RequestId submit(Request req, OutputCallback on_output);
  void cancel(RequestId id);
  // Cancels everything still running, delivers the final outputs and joins the
  // loop.
  void stop();
  EngineMetrics metrics() const;
  // Fixed configuration (safe from any thread).
  const Engine& engine() const { return *engine_; }

 private:
  void loop();

  std::unique_ptr<Engine> engine_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::deque<std::pair<Request, RequestId>> adds_;
  std::vector<RequestId> cancels_;
  std::unordered_map<RequestId, OutputCallback> callbacks_;      // touched on the loop thread only
  std::unordered_map<RequestId, OutputCallback> new_callbacks_;  // guarded by mu_
  EngineMetrics snapshot_;                                       // guarded by mu_
  bool stopping_ = false;
  std::thread thread_;
};

}  // namespace pagedattn
