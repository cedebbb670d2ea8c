// One run of the serving benchmark: a workload (serve_bench.h) replayed open-loop against an
// in-process Engine, either as it is (paged: continuous batching over the paged KV cache) or
// behind the static contiguous-KV baseline's admission rule (static_baseline.cpp).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/engine.h"
#include "pagedattn/model.h"
#include "pagedattn/model_file.h"
#include "serve_bench.h"

namespace pagedattn::tools::serve_bench {

struct RunConfig {
  std::string mode = "paged";  // paged | static
  bool prefix_cache = true;    // paged only (the static baseline has none)
  int64_t kv_budget_tokens = 4096;
  int32_t block_size = 16;
  int32_t max_num_seqs = 64;
  int32_t max_num_batched_tokens = 512;
  double batch_timeout_s = 0.5;  // static: longest a partial batch waits to fill
  // Tokens-target mode (> 0): closed loop, `concurrency` requests kept active until this many
  // output tokens are produced; arrival times are ignored.
  int64_t target_tokens = 0;
  int32_t concurrency = 16;
  bool progress = true;  // a progress bar on stderr
};

// KV memory over time (one sample per engine step).
struct KvSample {
  double t = 0;
  int64_t kv_allocated = 0;  // tokens held: pages in use x page size (paged), reservations (static)
  int64_t kv_live = 0;       // tokens actually stored for live sequences
  int32_t running = 0, waiting = 0;
  int64_t output_tokens = 0;  // produced so far
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
  // Engine steps (forward passes) and output tokens per step: how much batching the KV budget
  // allowed, independent of how fast the machine ran each step.
  int64_t steps = 0;
  double output_tokens_per_step = 0;
  double prefix_hit_rate = 0;
  int64_t kv_pool_tokens = 0;  // pages the engine was given (static: budget + rounding slack)
  std::vector<KvSample> timeline;
};

// Builds a fresh engine for the run around make_model() and replays `work`. Throws Error when a
// request can never fit the budget.
using ModelFactory = std::function<std::unique_ptr<Model>()>;
RunResult run_serve_bench(const ModelFactory& make_model, const std::vector<WorkItem>& work,
                          const WorkloadSpec& spec, const RunConfig& cfg);
// The same on the CPU, the model sharing the file's weights.
RunResult run_serve_bench(const ModelFile& file, const std::vector<WorkItem>& work,
                          const WorkloadSpec& spec, const RunConfig& cfg);

}  // namespace pagedattn::tools::serve_bench
