// `pagedattn bench serve`: the serving benchmark. Replays an open-loop workload (Poisson arrivals
// at each --request-rate, or a closed loop to --target-tokens) against the in-process engine, for
// every combination of --mode (paged, static) and --prefix-cache (on, off), at one KV budget, or
// against a running `pagedattn serve` over HTTP (--url: mode http), and reports throughput,
// latency percentiles, KV use and waste, preemptions and prefix hits: a table on stdout (or
// --json, one object per run), --csv (a row per run) and --timeline-csv (KV use per step, or per
// poll of the server's /metrics) for scripts/plot.sh. Values a mode cannot know are absent ("-",
// an empty cell, null).
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "cli.h"
#include "model_session.h"
#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/model_file.h"
#include "pagedattn/synthetic_model.h"
#include "serve_bench_http.h"
#include "serve_bench_run.h"
#include "serve_bench_sweep.h"

namespace pagedattn::tools {

namespace sb = serve_bench;

namespace {

struct BenchServeArgs {
  std::string model = kDefaultModelPath;
  std::string device = "auto";
  std::vector<std::string> modes = {"paged", "static"};
  std::vector<std::string> prefix_cache = {"on"};
  std::vector<std::string> admission = {"lookahead"};
  bool sweep = false;
  int32_t sweep_concurrency = 4;
  std::vector<std::string> rates = {"inf"};
  int32_t num_requests = 64;
  std::string prompt_len = "128";
  std::string output_len = "128";
  int32_t prefix_len = 0;
  uint64_t seed = 1;
  sb::RunConfig run;
  bool json = false, no_progress = false, no_warmup = false;
  std::string csv, timeline_csv;
  std::string url;  // a running server: the workload goes over HTTP
  double http_timeout_s = 600;
  std::vector<std::string> in_process_options;  // given on the command line (refused with --url)
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
    file = std::make_shared<const ModelFile>(load_model_file(name, weight_format_for(device)));
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

// Absent values (serve_bench_run.h): NaN doubles, negative counts.
nlohmann::json num_json(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json();
}
nlohmann::json count_json(int64_t x) { return x >= 0 ? nlohmann::json(x) : nlohmann::json(); }

nlohmann::json summary_json(const sb::Summary& s) {
  return {{"mean", num_json(s.mean)},
          {"p50", num_json(s.p50)},
          {"p90", num_json(s.p90)},
          {"p99", num_json(s.p99)}};
}

// device: "" for a server (not known here); url: "" in process.
nlohmann::json result_json(const sb::RunResult& r, const std::string& model,
                           const std::string& device, const std::string& url) {
  const auto& c = r.config;
  const auto& w = r.workload;
  const bool http = c.mode == "http";
  nlohmann::json j = {
      {"bench", "serve"},
      {"model", model},
      {"device", device.empty() ? nlohmann::json() : nlohmann::json(device)},
      {"hw_threads", std::thread::hardware_concurrency()},
      {"mode", c.mode},
      {"prefix_cache",
       http ? nlohmann::json() : nlohmann::json(c.mode == "paged" && c.prefix_cache)},
      {"request_rate", std::isinf(w.rate) ? nlohmann::json("inf") : nlohmann::json(w.rate)},
      {"target_tokens", c.target_tokens},
      {"concurrency", c.target_tokens > 0 ? nlohmann::json(c.concurrency) : nlohmann::json()},
      {"num_requests", r.completed},
      {"prefix_len", w.prefix_len},
      {"kv_budget_tokens", count_json(c.kv_budget_tokens)},
      {"kv_pool_tokens", count_json(r.kv_pool_tokens)},
      {"max_num_seqs", count_json(c.max_num_seqs)},
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
      {"kv_allocated_mean_tokens", num_json(r.kv_allocated_mean)},
      {"kv_allocated_max_tokens", count_json(r.kv_allocated_max)},
      {"kv_live_mean_tokens", num_json(r.kv_live_mean)},
      {"kv_waste_frac", num_json(r.kv_waste_frac)},
      {"running_mean", num_json(r.running_mean)},
      {"running_max", count_json(r.running_max)},
      {"preemptions", count_json(r.preemptions)},
      {"admission", http || c.mode != "paged" ? nlohmann::json() : nlohmann::json(c.admission)},
      {"preemptions_recompute", count_json(r.preemptions_recompute)},
      {"recomputed_tokens", count_json(r.recomputed_tokens)},
      {"preempted_computed_tokens", count_json(r.preempted_computed_tokens)},
      {"resumed_prefix_hit_tokens", count_json(r.resumed_prefix_hit_tokens)},
      {"admission_stalls", count_json(r.admission_stalls)},
      {"steps", count_json(r.steps)},
      {"output_tokens_per_step", num_json(r.output_tokens_per_step)},
      {"prefix_hit_rate", num_json(r.prefix_hit_rate)}};
  if (!url.empty()) j["url"] = url;
  return j;
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

// The prefix-cache column: on/off in process; over HTTP it is the server's setting.
std::string prefix_text(const sb::RunConfig& c) {
  if (c.mode == "http") return "server";
  return c.mode == "paged" && c.prefix_cache ? "on" : "off";
}

// A number in printf format, or `absent` for NaN.
std::string fmt(double v, const char* format, const char* absent = "") {
  if (!std::isfinite(v)) return absent;
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}
std::string fmt_count(int64_t v, const char* absent = "") {
  return v >= 0 ? std::to_string(v) : std::string(absent);
}

void append_csv(const std::string& path, const sb::RunResult& r) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  FILE* f = std::fopen(path.c_str(), "a");
  PA_CHECK(f, "bench serve: cannot open --csv '", path, "'");
  if (fresh) std::fputs(kCsvHeader, f);
  std::fprintf(f,
               "%s,%s,%s,%d,%s,%.4f,%.4f,%.3f,%.3f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,%.5f,"
               "%.5f,%.4f,%.4f,%.4f,%s,%s,%s,%s,%s,%s,%s,%.3f,%.3f,%.3f,%.3f,%d,%s,%s\n",
               r.config.mode.c_str(), prefix_text(r.config).c_str(),
               rate_text(r.workload.rate).c_str(), r.completed,
               fmt_count(r.config.kv_budget_tokens).c_str(), r.duration_s, r.req_per_s,
               r.output_tok_per_s, r.total_tok_per_s, r.ttft_s.p50, r.ttft_s.p90, r.ttft_s.p99,
               r.tpot_s.p50, r.tpot_s.p90, r.tpot_s.p99, r.itl_s.p50, r.itl_s.p90, r.itl_s.p99,
               r.e2e_s.p50, r.e2e_s.p90, r.e2e_s.p99, fmt(r.kv_allocated_mean, "%.1f").c_str(),
               fmt(r.kv_live_mean, "%.1f").c_str(), fmt(r.kv_waste_frac, "%.4f").c_str(),
               fmt(r.running_mean, "%.2f").c_str(), fmt_count(r.running_max).c_str(),
               fmt_count(r.preemptions).c_str(), fmt(r.prefix_hit_rate, "%.4f").c_str(), r.ramp_s,
               r.steady_s, r.tail_s, r.steady_output_tok_per_s, r.workload.prefix_len,
               fmt_count(r.steps).c_str(), fmt(r.output_tokens_per_step, "%.3f").c_str());
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
    std::fprintf(f, "%s,%s,%s,%.4f,%lld,%s,%d,%d,%lld\n", r.config.mode.c_str(),
                 prefix_text(r.config).c_str(), rate_text(r.workload.rate).c_str(), s.t,
                 (long long)s.kv_allocated, fmt_count(s.kv_live).c_str(), s.running, s.waiting,
                 (long long)s.output_tokens);
  std::fclose(f);
}

// The admission column: the paged engine's policy (admission.h), "-" for the others.
std::string admission_text(const sb::RunConfig& c) {
  return c.mode == "paged" ? c.admission.substr(0, 5) : "-";
}

void print_header() {
  std::printf(
      "%-6s %-6s %-5s %5s %4s %7s %8s %8s | %-23s | %-15s | %-15s | %-15s | %-13s %5s %4s %6s "
      "%5s %5s | %s | %s\n",
      "mode", "prefix", "admit", "rate", "reqs", "req/s", "out t/s", "tot t/s",
      "TTFT p50/p90/p99 s", "TPOT p50/p99 ms", "ITL p50/p99 ms", "E2E p50/p99 s", "KV alloc/live",
      "waste", "pre", "recomp", "stall", "hit", "ramp/steady/tail s", "tok/step");
}

void print_row(const sb::RunResult& r) {
  std::printf(
      "%-6s %-6s %-5s %5s %4d %7.3f %8.1f %8.1f | %6.2f/%7.2f/%7.2f | %6.1f/%7.1f | %6.1f/%7.1f |"
      " %6.2f/%7.2f | %6s/%6s %5s %4s %6s %5s %5s | %.1f/%.1f/%.1f | %s\n",
      r.config.mode.c_str(), prefix_text(r.config).c_str(), admission_text(r.config).c_str(),
      rate_text(r.workload.rate).c_str(), r.completed, r.req_per_s, r.output_tok_per_s,
      r.total_tok_per_s, r.ttft_s.p50, r.ttft_s.p90, r.ttft_s.p99, 1e3 * r.tpot_s.p50,
      1e3 * r.tpot_s.p99, 1e3 * r.itl_s.p50, 1e3 * r.itl_s.p99, r.e2e_s.p50, r.e2e_s.p99,
      fmt(r.kv_allocated_mean, "%.0f", "-").c_str(), fmt(r.kv_live_mean, "%.0f", "-").c_str(),
      fmt(100 * r.kv_waste_frac, "%.0f%%", "-").c_str(), fmt_count(r.preemptions, "-").c_str(),
      fmt_count(r.recomputed_tokens, "-").c_str(), fmt_count(r.admission_stalls, "-").c_str(),
      fmt(100 * r.prefix_hit_rate, "%.0f%%", "-").c_str(), r.ramp_s, r.steady_s, r.tail_s,
      fmt(r.output_tokens_per_step, "%.2f", "-").c_str());
  std::fflush(stdout);
}

// Prints one run's result the way the flags ask.
void report(const BenchServeArgs& a, const sb::RunResult& r, const std::string& model,
            const std::string& device) {
  if (a.json)
    std::printf("%s\n", result_json(r, model, device, a.url).dump().c_str());
  else
    print_row(r);
  std::fflush(stdout);
  if (!a.csv.empty()) append_csv(a.csv, r);
  if (!a.timeline_csv.empty()) append_timeline(a.timeline_csv, r);
}

// The workload's lengths and seed from the flags (the token range is set by the caller).
sb::WorkloadSpec workload_from(const BenchServeArgs& a) {
  sb::WorkloadSpec w;
  w.num_requests = a.num_requests;
  w.prompt = sb::parse_length_spec(a.prompt_len, "--prompt-len");
  w.output = sb::parse_length_spec(a.output_len, "--output-len");
  w.prefix_len = a.prefix_len;
  w.seed = a.seed;
  return w;
}

// Closed loop: enough requests to reach the target.
void size_closed_loop(const BenchServeArgs& a, sb::WorkloadSpec& w) {
  if (a.run.target_tokens <= 0) return;
  const double mean_out = std::max(1.0, double(w.output.max_value()) / 8);
  w.num_requests =
      std::max(a.num_requests, int32_t(double(a.run.target_tokens) / mean_out) + a.run.concurrency);
}

// The four-request warm-up workload (not measured).
sb::WorkloadSpec warmup_workload(sb::WorkloadSpec w) {
  w.num_requests = 4;
  w.prefix_len = 0;
  w.prompt = {sb::LengthKind::fixed, 16};
  w.output = {sb::LengthKind::fixed, 4};
  w.rate = std::numeric_limits<double>::infinity();
  return w;
}

// `--url`: the same workloads sent to a running server.
void run_bench_serve_http(const BenchServeArgs& a, const std::vector<double>& rates) {
  for (const auto& m : a.modes)
    PA_CHECK(m != "static", "bench serve: --mode static is not available with --url: the static ",
             "contiguous-KV baseline runs in process (drop --url to compare paged with static)");
  for (const auto& m : a.modes)
    PA_CHECK(m == "http", "bench serve: --mode '", m, "' is not available with --url (the mode ",
             "is http: the server's engine)");
  for (const auto& o : a.in_process_options)
    fail("bench serve: ", o, " sets up the in-process engine and cannot be used with --url (the ",
         "server's own settings apply: pass them to pagedattn serve)");
  const sb::Endpoint ep = sb::parse_url(a.url);
  const sb::ServerInfo info = sb::probe_server(ep);
  if (!a.json)
    std::fprintf(stderr, "bench serve: '%s' at %s (max_model_len %lld, KV cache %s tokens)\n",
                 info.model_name.c_str(), a.url.c_str(), (long long)info.max_model_len,
                 fmt_count(info.kv_capacity_tokens, "unknown").c_str());
  sb::WorkloadSpec w = workload_from(a);
  w.vocab_hi = info.vocab_size;
  w.vocab_lo = std::min(256, w.vocab_hi - 1);  // past byte tokens and most special ids
  size_closed_loop(a, w);
  // NOTE: the server keeps its prefix cache between runs; a salt of its own per run keeps a run
  // from reusing the pages of the previous ones (in process, every run gets a fresh engine).
  std::random_device rd;
  char salt[40];
  std::snprintf(salt, sizeof salt, "bench-serve-%08x%08x", rd(), rd());
  sb::HttpRunOptions opt;
  opt.timeout_s = a.http_timeout_s;
  if (!a.no_warmup) {
    const sb::WorkloadSpec ws = warmup_workload(w);
    sb::RunConfig rc = a.run;
    rc.target_tokens = 0;
    rc.progress = false;
    opt.cache_salt = std::string(salt) + "-warmup";
    sb::run_serve_bench_http(ep, info, sb::make_workload(ws), ws, rc, opt);
  }
  if (!a.json) print_header();
  for (size_t k = 0; k < rates.size(); ++k) {
    w.rate = rates[k];
    sb::RunConfig rc = a.run;
    rc.progress = !a.no_progress;
    opt.cache_salt = std::string(salt) + "-" + std::to_string(k);
    const sb::RunResult r = sb::run_serve_bench_http(ep, info, sb::make_workload(w), w, rc, opt);
    report(a, r, info.model_name, "");
  }
}

// Every mode x prefix-cache x admission run of one workload, interleaved in that order; the
// static baseline runs once (it has neither).
template <class OnResult>
void run_modes(const BenchServeArgs& a, const BenchModel& model,
               const std::vector<sb::WorkItem>& work, const sb::WorkloadSpec& w,
               const sb::RunConfig& base, OnResult&& on_result) {
  for (const auto& mode : a.modes) {
    for (const auto& pc : a.prefix_cache) {
      if (mode == "static" && &pc != &a.prefix_cache.front()) continue;  // it has none
      for (const auto& adm : a.admission) {
        if (mode == "static" && &adm != &a.admission.front()) continue;
        sb::RunConfig rc = base;
        rc.mode = mode;
        rc.prefix_cache = pc == "on";
        rc.admission = adm;
        rc.progress = !a.no_progress;
        const sb::RunResult r = sb::run_serve_bench(model.make, work, w, rc);
        on_result(r);
        if (mode == "static" && r.preemptions > 0)
          std::fprintf(stderr, "bench serve: warning: the static baseline preempted %lld times\n",
                       (long long)r.preemptions);
      }
    }
  }
}

// --sweep: the workloads and budgets of serve_bench_sweep.h in one run, then a summary of each
// paged run against the static baseline of the same case (stdout; stderr with --json).
void run_sweep(const BenchServeArgs& a, const BenchModel& model, sb::WorkloadSpec w,
               const std::vector<double>& rates) {
  std::vector<sb::SweepCase> cases = sb::make_sweep(w.prompt, w.output, a.sweep_concurrency);
  // NOTE: the tightest budgets first: they take longest and matter most, so a run cut short still
  // has them.
  std::stable_sort(cases.begin(), cases.end(), [](const sb::SweepCase& x, const sb::SweepCase& y) {
    return x.multiple < y.multiple;
  });
  struct Row {
    const sb::SweepCase* c;
    double rate;
    std::vector<sb::RunResult> runs;
  };
  std::vector<Row> rows;
  const std::string device = device_name(model.device);
  for (double rate : rates) {
    for (const sb::SweepCase& c : cases) {
      w.rate = rate;
      w.output = c.output;
      sb::RunConfig base = a.run;
      base.kv_budget_tokens = c.kv_tokens;
      if (!a.json) {
        std::printf("# %s outputs, KV %dx = %lld tokens\n", c.workload.c_str(), c.multiple,
                    (long long)c.kv_tokens);
        print_header();
      }
      Row row{&c, rate, {}};
      run_modes(a, model, sb::make_workload(w), w, base, [&](const sb::RunResult& r) {
        if (a.json) {
          nlohmann::json j = result_json(r, a.model, device, "");
          j["workload"] = c.workload;
          j["kv_multiple"] = c.multiple;
          std::printf("%s\n", j.dump().c_str());
          std::fflush(stdout);
        } else {
          print_row(r);
        }
        if (!a.csv.empty()) append_csv(a.csv, r);
        row.runs.push_back(r);
      });
      rows.push_back(std::move(row));
    }
  }
  FILE* out = a.json ? stderr : stdout;
  std::fprintf(out,
               "\nsweep summary (output tok/s against the static baseline of the same case)\n");
  std::fprintf(out, "%-10s %4s %6s %5s | %-24s %9s %8s %6s %6s %8s\n", "workload", "KV", "tokens",
               "rate", "run", "out t/s", "x static", "pre", "stall", "recomp%");
  for (const Row& row : rows) {
    double static_tps = NAN;
    for (const sb::RunResult& r : row.runs)
      if (r.config.mode == "static") static_tps = r.output_tok_per_s;
    for (const sb::RunResult& r : row.runs) {
      const std::string run =
          r.config.mode == "static"
              ? std::string("static")
              : r.config.mode + (r.config.prefix_cache ? "+prefix " : " ") + r.config.admission;
      const double recomp = r.recomputed_tokens >= 0 && r.output_tokens > 0
                                ? 100.0 * double(r.recomputed_tokens) / double(r.output_tokens)
                                : NAN;
      std::fprintf(out, "%-10s %3dx %6lld %5s | %-24s %9.1f %8s %6s %6s %8s\n",
                   row.c->workload.c_str(), row.c->multiple, (long long)row.c->kv_tokens,
                   rate_text(row.rate).c_str(), run.c_str(), r.output_tok_per_s,
                   fmt(r.output_tok_per_s / static_tps, "%.2f", "-").c_str(),
                   fmt_count(r.preemptions, "-").c_str(),
                   fmt_count(r.admission_stalls, "-").c_str(), fmt(recomp, "%.1f", "-").c_str());
    }
  }
  std::fflush(out);
}

void run_bench_serve(const BenchServeArgs& a) {
  PA_CHECK(a.num_requests >= 1, "bench serve: --num-requests must be >= 1, got ", a.num_requests);
  PA_CHECK(!a.modes.empty() && !a.prefix_cache.empty() && !a.rates.empty(),
           "bench serve: --mode, --prefix-cache and --request-rate need at least one value");
  for (const auto& m : a.modes)
    PA_CHECK(m == "paged" || m == "static" || m == "http", "bench serve: --mode '", m,
             "' is not paged, static or http");
  for (const auto& p : a.prefix_cache)
    PA_CHECK(p == "on" || p == "off", "bench serve: --prefix-cache '", p, "' is not on or off");
  PA_CHECK(!a.admission.empty(), "bench serve: --admission needs at least one value");
  for (const auto& p : a.admission)
    PA_CHECK(p == "lookahead" || p == "immediate", "bench serve: --admission '", p,
             "' is not lookahead or immediate");
  PA_CHECK(!a.sweep || a.url.empty(), "bench serve: --sweep runs in process (drop --url)");
  std::vector<double> rates;
  for (const auto& s : a.rates) rates.push_back(parse_rate(s));
  if (!a.url.empty()) return run_bench_serve_http(a, rates);
  for (const auto& m : a.modes)
    PA_CHECK(m != "http", "bench serve: --mode http needs --url (a running pagedattn serve)");
  sb::WorkloadSpec w = workload_from(a);

  const BenchModel model = load_bench_model(a.model, resolve_device(a.device));
  if (!a.json) {
    std::fprintf(stderr, "bench serve: %s on %s\n", a.model.c_str(),
                 device_name(model.device).c_str());
  }
  w.vocab_hi = model.config.vocab_size;
  w.vocab_lo = std::min(256, w.vocab_hi - 1);  // past byte tokens and most special ids
  size_closed_loop(a, w);
  if (!a.no_warmup) {  // first-touch allocations and BLAS threads, not measured
    const sb::WorkloadSpec ws = warmup_workload(w);
    sb::RunConfig rc = a.run;
    rc.mode = "paged";
    rc.target_tokens = 0;
    rc.progress = false;
    sb::run_serve_bench(model.make, sb::make_workload(ws), ws, rc);
  }
  if (a.sweep) return run_sweep(a, model, w, rates);
  if (!a.json) print_header();
  for (double rate : rates) {
    w.rate = rate;
    run_modes(a, model, sb::make_workload(w), w, a.run,
              [&](const sb::RunResult& r) { report(a, r, a.model, device_name(model.device)); });
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
  cmd->callback([a, cmd] {
    // The engine's own settings: with --url the server has its own.
    for (const char* name :
         {"--model", "--device", "--prefix-cache", "--admission", "--kv-tokens", "--page-size",
          "--max-num-seqs", "--max-num-batched-tokens", "--batch-timeout"})
      if (cmd->get_option(name)->count() > 0) a->in_process_options.push_back(name);
    if (!a->url.empty() && cmd->get_option("--mode")->count() == 0) a->modes = {"http"};
    PA_CHECK(a->url.empty() || a->http_timeout_s > 0,
             "bench serve: --http-timeout must be positive, got ", a->http_timeout_s);
    run_bench_serve(*a);
    set_exit_code(0);
  });
}

}  // namespace pagedattn::tools
