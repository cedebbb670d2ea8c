// The serving benchmark's driver (`pagedattn bench serve`): replays an open-loop workload (Poisson
// arrivals at each rate, or a closed loop to a token target) against the in-process engine, for
// every combination of mode (paged, static) and prefix cache (on, off), at one KV budget or over
// the --sweep of budgets and output distributions, or against a running `pagedattn serve` over
// HTTP (mode http), and reports each run (serve_bench_report.h) the way the options ask.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "pagedattn/tensor.h"
#include "serve_bench_run.h"

namespace pagedattn::bench {

// What `bench serve`'s flags set (tools/cmd_bench_serve.cpp); the lists are run in turn.
struct BenchServeArgs {
  std::string model;  // a .gguf file, a Hugging Face folder or synthetic:NAME
  Device device = Device::cpu;
  std::vector<std::string> modes = {"paged", "static"};
  std::vector<std::string> prefix_cache = {"on"};
  std::vector<std::string> admission = {"lookahead"};
  std::vector<std::string> preemption = {"auto"};
  bool sweep = false;
  int32_t sweep_concurrency = 4;
  std::vector<std::string> rates = {"inf"};
  int32_t num_requests = 64;
  std::string prompt_len = "128";
  std::string output_len = "128";
  int32_t prefix_len = 0;
  uint64_t seed = 1;
  serve_bench::RunConfig run;
  bool json = false, no_progress = false, no_warmup = false;
  std::string csv, timeline_csv;
  std::string url;  // a running server: the workload goes over HTTP
  double http_timeout_s = 600;
  std::vector<std::string> in_process_options;  // given on the command line (refused with --url)
};

// Checks the arguments (Error naming the flag), then runs every requested run and reports it.
void run_bench_serve(const BenchServeArgs& a);

// A --request-rate value: a positive number, or inf (all at once).
double parse_rate(const std::string& s);

}  // namespace pagedattn::bench
