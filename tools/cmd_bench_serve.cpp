// `pagedattn bench serve`: the serving benchmark. Replays an open-loop workload (Poisson arrivals
// at each --request-rate, or a closed loop to --target-tokens) against the in-process engine, for
// every combination of --mode (paged, static) and --prefix-cache (on, off), at one KV budget, and
// reports throughput, latency percentiles, KV use and waste, preemptions and prefix hits: a table
// on stdout (or --json, one object per run), --csv (a row per run) and --timeline-csv (KV use per
// step) for scripts/plot.sh.
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "model_session.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/model_file.h"
#include "pagedattn/synthetic_model.h"
#include "serve_bench_run.h"

namespace pagedattn::tools {

namespace sb = serve_bench;

namespace {

struct BenchServeArgs {
  std::string model = kDefaultModelPath;
  std::string device = "auto";
  std::vector<std::string> modes = {"paged", "static"};
  std::vector<std::string> prefix_cache = {"on"};
  std::vector<std::string> rates = {"inf"};
  int32_t num_requests = 64;
  std::string prompt_len = "128";
  std::string output_len = "128";
  int32_t prefix_len = 0;
  uint64_t seed = 1;
  sb::RunConfig run;
  bool json = false, no_progress = false, no_warmup = false;
  std::string csv, timeline_csv;
};

// What every run builds its engine around: --model on --device. A file (or a synthetic model on
// the CPU) is loaded once and each run's model is made from it; a synthetic model on CUDA is
// filled on the device for each run (no host copy of its weights).
struct BenchModel {
  ModelConfig config;
  Device device = Device::cpu;
  sb::ModelFactory make;
};

BenchModel load_bench_model(const std::string& name, Device device) {
  BenchModel m;
  m.device = device;
  if (is_synthetic_model(name) && device == Device::cuda) {
    m.config = synthetic_model_config(name);
    m.make = [name] { return create_synthetic_model(name, Device::cuda); };
    return m;
  }
  std::shared_ptr<const ModelFile> file;
  if (is_synthetic_model(name)) {
    file = std::make_shared<const ModelFile>(make_synthetic_preset_file(name));
  } else {
    PA_CHECK(std::filesystem::exists(name), "bench serve: --model '", name,
             "' does not exist (fetch the default model with scripts/fetch-default-model.sh)");
    file = std::make_shared<const ModelFile>(load_model_file(name));
  }
  m.config = file->config;
  m.make = [file, device] { return create_model(*file, device); };
  return m;
}

double parse_rate(const std::string& s) {
  if (s == "inf" || s == "Inf" || s == "INF") return std::numeric_limits<double>::infinity();
  try {
    size_t used = 0;
    const double r = std::stod(s, &used);
    PA_CHECK(used == s.size() && r > 0, "bench serve: --request-rate '", s,
             "' is not a positive number or inf");
    return r;
  } catch (const std::logic_error&) {
    fail("bench serve: --request-rate '", s, "' is not a number or inf");
  }
}

nlohmann::json summary_json(const sb::Summary& s) {
  auto num = [](double x) { return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json(); };
  return {{"mean", num(s.mean)}, {"p50", num(s.p50)}, {"p90", num(s.p90)}, {"p99", num(s.p99)}};
}

nlohmann::json result_json(const sb::RunResult& r, const std::string& model, Device device) {
  const auto& c = r.config;
  const auto& w = r.workload;
  return {{"bench", "serve"},
          {"model", model},
          {"device", device_name(device)},
          {"hw_threads", std::thread::hardware_concurrency()},
          {"mode", c.mode},
          {"prefix_cache", c.mode == "paged" && c.prefix_cache},
          {"request_rate", std::isinf(w.rate) ? nlohmann::json("inf") : nlohmann::json(w.rate)},
          {"target_tokens", c.target_tokens},
          {"concurrency", c.target_tokens > 0 ? nlohmann::json(c.concurrency) : nlohmann::json()},
          {"num_requests", r.completed},
          {"prefix_len", w.prefix_len},
          {"kv_budget_tokens", c.kv_budget_tokens},
          {"kv_pool_tokens", r.kv_pool_tokens},
          {"max_num_seqs", c.max_num_seqs},
          {"duration_s", r.duration_s},
          {"prompt_tokens", r.prompt_tokens},
          {"output_tokens", r.output_tokens},
          {"requests_per_s", r.req_per_s},
          {"output_tokens_per_s", r.output_tok_per_s},
          {"total_tokens_per_s", r.total_tok_per_s},
          {"ttft_s", summary_json(r.ttft_s)},
          {"tpot_s", summary_json(r.tpot_s)},
          {"itl_s", summary_json(r.itl_s)},
          {"e2e_s", summary_json(r.e2e_s)},
          {"ramp_s", r.ramp_s},
          {"steady_s", r.steady_s},
          {"tail_s", r.tail_s},
          {"steady_output_tokens_per_s", r.steady_output_tok_per_s},
          {"kv_allocated_mean_tokens", r.kv_allocated_mean},
          {"kv_allocated_max_tokens", r.kv_allocated_max},
          {"kv_live_mean_tokens", r.kv_live_mean},
          {"kv_waste_frac", r.kv_waste_frac},
          {"running_mean", r.running_mean},
          {"running_max", r.running_max},
          {"preemptions", r.preemptions},
          {"steps", r.steps},
          {"output_tokens_per_step", r.output_tokens_per_step},
          {"prefix_hit_rate", r.prefix_hit_rate}};
}

const char* kCsvHeader =
    "mode,prefix_cache,request_rate,num_requests,kv_budget_tokens,duration_s,requests_per_s,"
    "output_tokens_per_s,total_tokens_per_s,ttft_p50,ttft_p90,ttft_p99,tpot_p50,tpot_p90,tpot_p99,"
    "itl_p50,itl_p90,itl_p99,e2e_p50,e2e_p90,e2e_p99,kv_allocated_mean,kv_live_mean,kv_waste_frac,"
    "running_mean,running_max,preemptions,prefix_hit_rate,ramp_s,steady_s,tail_s,"
    "steady_output_tokens_per_s,prefix_len,steps,output_tokens_per_step\n";

std::string rate_text(double rate) {
  if (std::isinf(rate)) return "inf";
  char b[32];
  std::snprintf(b, sizeof b, "%g", rate);
  return b;
}

std::string prefix_text(const sb::RunConfig& c) {
  return c.mode == "paged" && c.prefix_cache ? "on" : "off";
}

void append_csv(const std::string& path, const sb::RunResult& r) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  FILE* f = std::fopen(path.c_str(), "a");
  PA_CHECK(f, "bench serve: cannot open --csv '", path, "'");
  if (fresh) std::fputs(kCsvHeader, f);
  std::fprintf(
      f,
      "%s,%s,%s,%d,%lld,%.4f,%.4f,%.3f,%.3f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,"
      "%.5f,%.4f,%.4f,%.4f,%.1f,%.1f,%.4f,%.2f,%d,%lld,%.4f,%.3f,%.3f,%.3f,%.3f,%d,%lld,%.3f\n",
      r.config.mode.c_str(), prefix_text(r.config).c_str(), rate_text(r.workload.rate).c_str(),
      r.completed, (long long)r.config.kv_budget_tokens, r.duration_s, r.req_per_s,
      r.output_tok_per_s, r.total_tok_per_s, r.ttft_s.p50, r.ttft_s.p90, r.ttft_s.p99, r.tpot_s.p50,
      r.tpot_s.p90, r.tpot_s.p99, r.itl_s.p50, r.itl_s.p90, r.itl_s.p99, r.e2e_s.p50, r.e2e_s.p90,
      r.e2e_s.p99, r.kv_allocated_mean, r.kv_live_mean, r.kv_waste_frac, r.running_mean,
      r.running_max, (long long)r.preemptions, r.prefix_hit_rate, r.ramp_s, r.steady_s, r.tail_s,
      r.steady_output_tok_per_s, r.workload.prefix_len, (long long)r.steps,
      r.output_tokens_per_step);
  std::fclose(f);
}

void append_timeline(const std::string& path, const sb::RunResult& r) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  FILE* f = std::fopen(path.c_str(), "a");
  PA_CHECK(f, "bench serve: cannot open --timeline-csv '", path, "'");
  if (fresh)
    std::fputs(
        "mode,prefix_cache,request_rate,t,kv_allocated,kv_live,running,waiting,"
        "output_tokens\n",
        f);
  for (const sb::KvSample& s : r.timeline)
    std::fprintf(f, "%s,%s,%s,%.4f,%lld,%lld,%d,%d,%lld\n", r.config.mode.c_str(),
                 prefix_text(r.config).c_str(), rate_text(r.workload.rate).c_str(), s.t,
                 (long long)s.kv_allocated, (long long)s.kv_live, s.running, s.waiting,
                 (long long)s.output_tokens);
  std::fclose(f);
}

void print_header() {
  std::printf(
      "%-6s %-6s %5s %4s %7s %8s %8s | %-23s | %-15s | %-15s | %-15s | %-13s %5s %4s %5s "
      "| %s | %s\n",
      "mode", "prefix", "rate", "reqs", "req/s", "out t/s", "tot t/s", "TTFT p50/p90/p99 s",
      "TPOT p50/p99 ms", "ITL p50/p99 ms", "E2E p50/p99 s", "KV alloc/live", "waste", "pre", "hit",
      "ramp/steady/tail s", "tok/step");
}

void print_row(const sb::RunResult& r) {
  std::printf(
      "%-6s %-6s %5s %4d %7.3f %8.1f %8.1f | %6.2f/%7.2f/%7.2f | %6.1f/%7.1f | %6.1f/%7.1f |"
      " %6.2f/%7.2f | %6.0f/%6.0f %4.0f%% %4lld %4.0f%% | %.1f/%.1f/%.1f | %.2f\n",
      r.config.mode.c_str(), prefix_text(r.config).c_str(), rate_text(r.workload.rate).c_str(),
      r.completed, r.req_per_s, r.output_tok_per_s, r.total_tok_per_s, r.ttft_s.p50, r.ttft_s.p90,
      r.ttft_s.p99, 1e3 * r.tpot_s.p50, 1e3 * r.tpot_s.p99, 1e3 * r.itl_s.p50, 1e3 * r.itl_s.p99,
      r.e2e_s.p50, r.e2e_s.p99, r.kv_allocated_mean, r.kv_live_mean, 100 * r.kv_waste_frac,
      (long long)r.preemptions, 100 * r.prefix_hit_rate, r.ramp_s, r.steady_s, r.tail_s,
      r.output_tokens_per_step);
  std::fflush(stdout);
}

void run_bench_serve(const BenchServeArgs& a) {
  PA_CHECK(a.num_requests >= 1, "bench serve: --num-requests must be >= 1, got ", a.num_requests);
  PA_CHECK(!a.modes.empty() && !a.prefix_cache.empty() && !a.rates.empty(),
           "bench serve: --mode, --prefix-cache and --request-rate need at least one value");
  for (const auto& m : a.modes)
    PA_CHECK(m == "paged" || m == "static", "bench serve: --mode '", m, "' is not paged or static");
  for (const auto& p : a.prefix_cache)
    PA_CHECK(p == "on" || p == "off", "bench serve: --prefix-cache '", p, "' is not on or off");
  std::vector<double> rates;
  for (const auto& s : a.rates) rates.push_back(parse_rate(s));
  sb::WorkloadSpec w;
  w.num_requests = a.num_requests;
  w.prompt = sb::parse_length_spec(a.prompt_len, "--prompt-len");
  w.output = sb::parse_length_spec(a.output_len, "--output-len");
  w.prefix_len = a.prefix_len;
  w.seed = a.seed;

  const BenchModel model = load_bench_model(a.model, resolve_device(a.device));
  if (!a.json) {
    std::fprintf(stderr, "bench serve: %s on %s\n", a.model.c_str(),
                 device_name(model.device).c_str());
  }
  w.vocab_hi = model.config.vocab_size;
  w.vocab_lo = std::min(256, w.vocab_hi - 1);  // past byte tokens and most special ids
  if (a.run.target_tokens > 0) {               // closed loop: enough requests to reach the target
    const double mean_out = std::max(1.0, double(w.output.max_value()) / 8);
    w.num_requests = std::max(a.num_requests,
                              int32_t(double(a.run.target_tokens) / mean_out) + a.run.concurrency);
  }
  if (!a.no_warmup) {  // first-touch allocations and BLAS threads, not measured
    sb::WorkloadSpec ws = w;
    ws.num_requests = 4;
    ws.prefix_len = 0;
    ws.prompt = {sb::LengthKind::fixed, 16};
    ws.output = {sb::LengthKind::fixed, 4};
    sb::RunConfig rc = a.run;
    rc.mode = "paged";
    rc.target_tokens = 0;
    rc.progress = false;
    sb::run_serve_bench(model.make, sb::make_workload(ws), ws, rc);
  }
  if (!a.json) print_header();
  for (double rate : rates) {
    w.rate = rate;
    const std::vector<sb::WorkItem> work = sb::make_workload(w);  // the same for every mode
    for (const auto& mode : a.modes) {
      for (const auto& pc : a.prefix_cache) {
        if (mode == "static" && &pc != &a.prefix_cache.front()) continue;  // it has none
        sb::RunConfig rc = a.run;
        rc.mode = mode;
        rc.prefix_cache = pc == "on";
        rc.progress = !a.no_progress;
        const sb::RunResult r = sb::run_serve_bench(model.make, work, w, rc);
        if (a.json)
          std::printf("%s\n", result_json(r, a.model, model.device).dump().c_str());
        else
          print_row(r);
        std::fflush(stdout);
        if (!a.csv.empty()) append_csv(a.csv, r);
        if (!a.timeline_csv.empty()) append_timeline(a.timeline_csv, r);
        if (mode == "static" && r.preemptions > 0)
          std::fprintf(stderr, "bench serve: warning: the static baseline preempted %lld times\n",
                       (long long)r.preemptions);
      }
    }
  }
}

}  // namespace

void register_bench_serve(CLI::App& bench) {
  auto a = std::make_shared<BenchServeArgs>();
  CLI::App* cmd = bench.add_subcommand(
      "serve", "Serving benchmark: paged continuous batching vs a static contiguous-KV baseline");
  cmd->add_option("--model", a->model,
                  "A .gguf file, a Hugging Face folder or synthetic:NAME (synthetic:llama3-8b, "
                  "synthetic:smollm2-135m, synthetic:tiny)")
      ->capture_default_str();
  cmd->add_option("--device", a->device, "auto (cuda when a GPU is usable), cpu or cuda")
      ->check(CLI::IsMember({"auto", "cpu", "cuda"}))
      ->capture_default_str();
  cmd->add_option("--mode", a->modes, "paged and/or static, e.g. paged,static")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--prefix-cache", a->prefix_cache, "on and/or off (paged mode)")
      ->delimiter(',')
      ->capture_default_str();
  cmd->add_option("--request-rate", a->rates, "Requests/s (Poisson), a list; inf: all at once")
      ->delimiter(',')
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
  cmd->add_option("--block-size", a->run.block_size, "Tokens per KV page")->capture_default_str();
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
  cmd->callback([a] {
    run_bench_serve(*a);
    set_exit_code(0);
  });
}

}  // namespace pagedattn::tools
