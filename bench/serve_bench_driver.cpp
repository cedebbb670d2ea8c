// The serving benchmark's driver (serve_bench_driver.h): the runs the arguments ask for, in order,
// each reported as it finishes.
#include "serve_bench_driver.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <filesystem>
#include <limits>
#include <memory>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/llama.h"
#include "pagedattn/model_file.h"
#include "pagedattn/synthetic_model.h"
#include "serve_bench_http.h"
#include "serve_bench_report.h"
#include "serve_bench_run.h"
#include "serve_bench_sweep.h"

namespace pagedattn::bench {

namespace sb = serve_bench;
using sb::append_csv;
using sb::append_timeline;
using sb::fmt;
using sb::fmt_count;
using sb::print_header;
using sb::print_row;
using sb::rate_text;
using sb::result_json;

namespace {

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

// Every mode x prefix-cache x admission x preemption run of one workload, interleaved in that
// order; the static baseline runs once (it has none of them).
template <class OnResult>
void run_modes(const BenchServeArgs& a, const BenchModel& model,
               const std::vector<sb::WorkItem>& work, const sb::WorkloadSpec& w,
               const sb::RunConfig& base, OnResult&& on_result) {
  for (const auto& mode : a.modes) {
    for (const auto& pc : a.prefix_cache) {
      if (mode == "static" && &pc != &a.prefix_cache.front()) continue;  // it has none
      for (const auto& adm : a.admission) {
        if (mode == "static" && &adm != &a.admission.front()) continue;
        for (const auto& pre : a.preemption) {
          if (mode == "static" && &pre != &a.preemption.front()) continue;
          sb::RunConfig rc = base;
          rc.mode = mode;
          rc.prefix_cache = pc == "on";
          rc.admission = adm;
          rc.preemption = pre;
          rc.progress = !a.no_progress;
          const sb::RunResult r = sb::run_serve_bench(model.make, work, w, rc);
          on_result(r);
          if (mode == "static" && r.preemptions > 0)
            std::fprintf(stderr,
                         "bench serve: warning: the static baseline preempted %lld times\n",
                         (long long)r.preemptions);
        }
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
  std::fprintf(out, "%-10s %4s %6s %5s | %-34s %9s %8s %6s %5s %6s %8s %8s\n", "workload", "KV",
               "tokens", "rate", "run", "out t/s", "x static", "pre", "swap", "stall", "recomp%",
               "tok/step");
  for (const Row& row : rows) {
    double static_tps = NAN;
    for (const sb::RunResult& r : row.runs)
      if (r.config.mode == "static") static_tps = r.output_tok_per_s;
    for (const sb::RunResult& r : row.runs) {
      const std::string run =
          r.config.mode == "static"
              ? std::string("static")
              : r.config.mode + (r.config.prefix_cache ? "+prefix " : " ") + r.config.admission +
                    (r.config.preemption == "auto" ? "" : "/" + r.config.preemption);
      const double recomp = r.recomputed_tokens >= 0 && r.output_tokens > 0
                                ? 100.0 * double(r.recomputed_tokens) / double(r.output_tokens)
                                : NAN;
      std::fprintf(out, "%-10s %3dx %6lld %5s | %-34s %9.1f %8s %6s %5s %6s %8s %8.2f\n",
                   row.c->workload.c_str(), row.c->multiple, (long long)row.c->kv_tokens,
                   rate_text(row.rate).c_str(), run.c_str(), r.output_tok_per_s,
                   fmt(r.output_tok_per_s / static_tps, "%.2f", "-").c_str(),
                   fmt_count(r.preemptions, "-").c_str(),
                   fmt_count(r.preemptions_swap, "-").c_str(),
                   fmt_count(r.admission_stalls, "-").c_str(), fmt(recomp, "%.1f", "-").c_str(),
                   r.output_tokens_per_step);
    }
  }
  std::fflush(out);
}

}  // namespace

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
  PA_CHECK(!a.preemption.empty(), "bench serve: --preemption-mode needs at least one value");
  for (const auto& p : a.preemption)
    PA_CHECK(p == "auto" || p == "recompute" || p == "swap", "bench serve: --preemption-mode '", p,
             "' is not auto, recompute or swap");
  PA_CHECK(!a.sweep || a.url.empty(), "bench serve: --sweep runs in process (drop --url)");
  std::vector<double> rates;
  for (const auto& s : a.rates) rates.push_back(parse_rate(s));
  if (!a.url.empty()) return run_bench_serve_http(a, rates);
  for (const auto& m : a.modes)
    PA_CHECK(m != "http", "bench serve: --mode http needs --url (a running pagedattn serve)");
  sb::WorkloadSpec w = workload_from(a);

  const BenchModel model = load_bench_model(a.model, a.device);
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

}  // namespace pagedattn::bench
