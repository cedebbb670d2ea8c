// `pagedattn bench serve`: the serving benchmark's flags (the benchmark itself is
// bench/serve_bench_driver.h). Replays an open-loop workload (Poisson arrivals at each
// --request-rate, or a closed loop to --target-tokens) against the in-process engine, for every
// combination of --mode (paged, static) and --prefix-cache (on, off), at one KV budget, or
// against a running `pagedattn serve` over HTTP (--url: mode http), and reports throughput,
// latency percentiles, KV use and waste, preemptions and prefix hits: a table on stdout (or
// --json, one object per run), --csv (a row per run) and --timeline-csv (KV use per step, or per
// poll of the server's /metrics) for scripts/plot.sh. Values a mode cannot know are absent ("-",
// an empty cell, null).
#include <memory>
#include <string>

#include "cli.h"
#include "model_session.h"
#include "pagedattn/default_model.h"
#include "pagedattn/error.h"
#include "serve_bench_driver.h"

namespace pagedattn::tools {

using bench::BenchServeArgs;
using bench::run_bench_serve;

void register_bench_serve(CLI::App& bench) {
  auto a = std::make_shared<BenchServeArgs>();
  a->model = kDefaultModelPath;
  auto device = std::make_shared<std::string>("auto");
  CLI::App* cmd = bench.add_subcommand(
      "serve", "Serving benchmark: paged continuous batching vs a static contiguous-KV baseline");
  cmd->add_option("--model", a->model,
                  "A .gguf file, a Hugging Face folder or synthetic:NAME (synthetic:llama3-8b, "
                  "synthetic:smollm2-135m, synthetic:tiny)")
      ->capture_default_str();
  cmd->add_option("--device", *device, "auto (cuda when a GPU is usable), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--mode", a->modes,
                  "paged and/or static, e.g. paged,static (in process); http with --url")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--prefix-cache", a->prefix_cache, "on and/or off (paged mode)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--request-rate", a->rates, "Requests/s (Poisson), a list; inf: all at once")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--admission", a->admission,
                  "Paged mode: lookahead (admit while the forecast peak of KV pages fits) and/or "
                  "immediate (admit when the first chunk fits, the policy before the lookahead)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--preemption-mode", a->preemption,
                  "Paged mode: auto (swap a preempted sequence's pages to host memory when that "
                  "is cheaper than recomputing them), recompute and/or swap")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--sampling", a->run.sampling,
                  "greedy, or mixed: temperature 0.8, top-p 0.95, top-k 50, repetition penalty "
                  "1.1, logprobs 5, seeded per request")
      ->capture_default_str();
  cmd->add_option("--swap-space", a->run.swap_space_mib,
                  "Paged mode: MiB of host memory for swapped pages (-1: 4096 with a CUDA cache, "
                  "0 on the CPU)")
      ->capture_default_str();
  cmd->add_flag(
      "--sweep", a->sweep,
      "Run the workload sweep: fixed, uniform, lognormal and pareto outputs (from a fixed "
      "--output-len) at KV budgets of 1x, 2x and 4x one request's worst case times "
      "--sweep-concurrency (--kv-tokens is ignored), then a summary against static");
  cmd->add_option("--sweep-concurrency", a->sweep_concurrency,
                  "--sweep: requests the static baseline holds at once at the 1x budget")
      ->capture_default_str();
  cmd->add_option("--num-requests", a->num_requests, "Requests per run")->capture_default_str();
  cmd->add_option("--prompt-len", a->prompt_len,
                  "Own prompt tokens: N, uniform:LO:HI, lognormal:MEDIAN:SIGMA:MAX, "
                  "pareto:MIN:ALPHA:MAX")
      ->capture_default_str();
  cmd->add_option("--output-len", a->output_len, "Output tokens (same forms; EOS is ignored)")
      ->capture_default_str();
  cmd->add_option("--prefix-len", a->prefix_len, "Shared system-prompt tokens before each prompt")
      ->capture_default_str();
  cmd->add_option("--kv-tokens", a->run.kv_budget_tokens, "KV memory budget in tokens (both modes)")
      ->capture_default_str();
  cmd->add_option("--page-size,--block-size", a->run.page_size, "Tokens per KV page")
      ->capture_default_str();
  cmd->add_option("--max-num-seqs", a->run.max_num_seqs, "Most concurrent sequences")
      ->capture_default_str();
  cmd->add_option("--max-num-batched-tokens", a->run.max_num_batched_tokens,
                  "Token budget of one step")
      ->capture_default_str();
  cmd->add_option("--batch-timeout", a->run.batch_timeout_s,
                  "Static mode: seconds a partial batch waits to fill")
      ->capture_default_str();
  cmd->add_option("--target-tokens", a->run.target_tokens,
                  "Closed loop: keep --concurrency requests active until this many output tokens")
      ->capture_default_str();
  cmd->add_option("--concurrency", a->run.concurrency, "Active requests in --target-tokens mode")
      ->capture_default_str();
  cmd->add_option("--seed", a->seed, "Workload seed")->capture_default_str();
  cmd->add_flag("--json", a->json, "One JSON object per run on stdout");
  cmd->add_option("--csv", a->csv, "Append one row per run to this CSV file");
  cmd->add_option("--timeline-csv", a->timeline_csv, "Append KV use per step to this CSV file");
  cmd->add_flag("--no-progress", a->no_progress, "No progress bar on stderr");
  cmd->add_flag("--no-warmup", a->no_warmup, "Skip the unmeasured warm-up run");
  cmd->add_option("--url", a->url,
                  "A running pagedattn serve, http://HOST:PORT: the workload goes to its "
                  "/v1/completions (streamed), KV use comes from its /metrics");
  cmd->add_option("--http-timeout", a->http_timeout_s,
                  "With --url: seconds to wait for the next bytes of a response")
      ->capture_default_str();
  cmd->callback([a, device, cmd] {
    // The engine's own settings: with --url the server has its own.
    for (const char* name :
         {"--model", "--device", "--prefix-cache", "--admission", "--preemption-mode",
          "--swap-space", "--kv-tokens", "--page-size",
          "--max-num-seqs", "--max-num-batched-tokens", "--batch-timeout"})
      if (cmd->get_option(name)->count() > 0) a->in_process_options.push_back(name);
    if (!a->url.empty() && cmd->get_option("--mode")->count() == 0) a->modes = {"http"};
    PA_CHECK(a->url.empty() || a->http_timeout_s > 0,
             "bench serve: --http-timeout must be positive, got ", a->http_timeout_s);
    if (a->url.empty()) a->device = resolve_device(*device);
    run_bench_serve(*a);
    set_exit_code(0);
  });
}

}  // namespace pagedattn::tools