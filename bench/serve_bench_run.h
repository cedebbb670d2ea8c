// One run of the serving benchmark: a workload (serve_bench.h) replayed open-loop against an
// in-process Engine, either as it is (paged: continuous batching over the paged KV cache) or
// behind the static contiguous-KV baseline's admission rule (static_baseline.h). The same
// workload sent to a running server over HTTP fills the same RunResult (serve_bench_http.h).
//
// Absent values: what a run cannot know (over HTTP: the live KV tokens, hence the waste) is NaN
// for a double and -1 for an integer; the reports print "-", an empty CSV cell or JSON null.
#pragma once

#include <cstdint>
#include <functional>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/model.h"
#include "pagedattn/model_file.h"
#include "serve_bench.h"

namespace pagedattn::bench::serve_bench {

inline constexpr double kAbsent = std::numeric_limits<double>::quiet_NaN();

struct RunConfig {
  std::string mode = "paged";  // paged | static (in process) | http (a server, serve_bench_http.h)
  bool prefix_cache = true;    // paged only (the static baseline has none)
  // paged only: lookahead (admission that foresees growth, the least-work victim) or immediate
  // (admission on current use, the newest victim: the engine's policy before the lookahead).
  std::string admission = "lookahead";
  // paged only: what a preemption does (auto, recompute or swap: EngineConfig::preemption) and
  // the host memory for swapped pages (MiB; -1: the engine's default for the device).
  std::string preemption = "auto";
  double swap_space_mib = -1;
  // greedy, or mixed: bench::mixed_sampling() (sampling_mix.h), seeded per request.
  std::string sampling = "greedy";
  int64_t kv_budget_tokens = 4096;  // http: the server's KV capacity (-1 when it does not say)
  int32_t page_size = 16;
  int32_t max_num_seqs = 64;  // http: -1 (the server's setting, not reported)
  int32_t max_num_batched_tokens = 512;
  double batch_timeout_s = 0.5;  // static: longest a partial batch waits to fill
  // Tokens-target mode (> 0): closed loop, `concurrency` requests kept active until this many
  // output tokens are produced; arrival times are ignored.
  int64_t target_tokens = 0;
  int32_t concurrency = 16;
  bool progress = true;  // a progress bar on stderr
};

// KV memory over time (one sample per engine step; over HTTP, one per poll of GET /metrics).
struct KvSample {
  double t = 0;
  int64_t kv_allocated = 0;  // tokens held: pages in use x page size (paged), reservations (static)
  int64_t kv_live = 0;       // tokens actually stored for live sequences (-1: unknown, http)
  int32_t running = 0, waiting = 0;
  int64_t output_tokens = 0;  // produced so far
};

// One request as the client saw it (seconds from the start of the run).
struct RequestRecord {
  double arrival_s = 0;  // released: its arrival time (open loop) or when it was issued (closed)
  double sent_s = -1;    // http: when the request was sent (>= arrival_s); in process: -1
  double ttft_s = kAbsent, e2e_s = kAbsent;  // from arrival (in process) or send (http)
  int32_t prompt_tokens = 0, max_tokens = 0;
  int32_t output_tokens = 0;  // produced (http: the final usage's completion_tokens)
  int32_t chunks = -1;        // http: streamed chunks of the completion; in process: -1
};

struct RunResult {
  RunConfig config;
  WorkloadSpec workload;
  int32_t completed = 0;
  double duration_s = 0;
  int64_t prompt_tokens = 0, output_tokens = 0;
  double req_per_s = 0, output_tok_per_s = 0, total_tok_per_s = 0;
  Summary ttft_s, tpot_s, itl_s, e2e_s;
  // Wall time split: ramp (start to the first completion), tail (from the moment nothing is left
  // to admit to the end), steady (between); steady throughput counts output tokens in that window.
  double ramp_s = 0, steady_s = 0, tail_s = 0, steady_output_tok_per_s = 0;
  double kv_allocated_mean = 0, kv_live_mean = 0, kv_waste_frac = 0;
  int64_t kv_allocated_max = 0;
  double running_mean = 0;
  int32_t running_max = 0;
  int64_t preemptions = 0;
  // The scheduler's decisions (-1: unknown, http): preemptions that recompute, tokens computed
  // again, computed tokens the preempted sequences held and how many of those their re-admission
  // found in the prefix cache, steps in which admission waited for pages.
  int64_t preemptions_recompute = -1, recomputed_tokens = -1;
  // Preemptions that swapped, the computed tokens they kept, bytes copied out and in, and the
  // seconds those copies took (-1 / NaN: unknown).
  int64_t preemptions_swap = -1, swapped_tokens = -1, swap_bytes = -1;
  double swap_s = kAbsent, swap_pin_s = kAbsent;  // swap's time, and the pinning part of it
  // The device's time on the run's forward steps (Model::device_busy_seconds), the fraction of
  // the run it spent idle between them, and that idle time per engine step in ms (NaN: not
  // measured, the CPU or over HTTP).
  double device_busy_s = kAbsent, device_idle_frac = kAbsent, device_idle_ms_per_step = kAbsent;
  // Whether the engine scheduled decode steps ahead (Engine::schedules_ahead; -1: unknown, HTTP).
  int32_t schedule_ahead = -1;
  int64_t preempted_computed_tokens = -1, resumed_prefix_hit_tokens = -1;
  int64_t admission_stalls = -1;
  // CUDA graphs of decode steps during the run (Model::cuda_graph_stats): captured, and steps
  // replayed from one (-1: none, the CPU or HTTP).
  int64_t graph_captures = -1, graph_replays = -1;
  // Engine steps (forward passes) and output tokens per step: how much batching the KV budget
  // allowed, independent of how fast the machine ran each step.
  int64_t steps = 0;
  double output_tokens_per_step = 0;
  double prefix_hit_rate = 0;
  int64_t kv_pool_tokens = 0;  // pages the engine was given (static: budget + rounding slack)
  std::vector<KvSample> timeline;
  std::vector<RequestRecord> requests;  // the requests issued, in order of release
};

// Builds a fresh engine for the run around make_model() and replays `work`. Throws Error when a
// request can never fit the budget.
using ModelFactory = std::function<std::unique_ptr<Model>()>;
RunResult run_serve_bench(const ModelFactory& make_model, const std::vector<WorkItem>& work,
                          const WorkloadSpec& spec, const RunConfig& cfg);
// The same on the CPU, the model sharing the file's weights.
RunResult run_serve_bench(const ModelFile& file, const std::vector<WorkItem>& work,
                          const WorkloadSpec& spec, const RunConfig& cfg);

// Shared by both drivers.
// A progress bar on stderr: "label [####....] done/total requests, tokens, t s".
void print_progress(const std::string& label, int32_t done, int32_t total, int64_t tokens, double t,
                    bool final);
// Fills r's rates, latency summaries, ramp/steady/tail split and the time-weighted KV and running
// means from the latencies, r.timeline, r.duration_s, r.output_tokens, r.prompt_tokens and
// r.completed. first_done: the first completion; last_backlog: the last moment requests were still
// to be released or waiting. A timeline sample with kv_live < 0 makes kv_live_mean and
// kv_waste_frac absent; an empty timeline makes every KV and running figure absent.
void summarize_run(RunResult& r, const std::vector<double>& ttft, const std::vector<double>& tpot,
                   const std::vector<double>& itl, const std::vector<double>& e2e,
                   double first_done, double last_backlog);

}  // namespace pagedattn::bench::serve_bench
