// The serving benchmark's reports (serve_bench_report.h).
#include "serve_bench_report.h"

#include <cmath>
#include <cstdio>
#include <filesystem>
#include <thread>

#include "pagedattn/error.h"

namespace pagedattn::bench::serve_bench {

namespace {

// Absent values (serve_bench_run.h): NaN doubles, negative counts.
nlohmann::json num_json(double x) {
  return std::isfinite(x) ? nlohmann::json(x) : nlohmann::json();
}
nlohmann::json count_json(int64_t x) { return x >= 0 ? nlohmann::json(x) : nlohmann::json(); }

nlohmann::json summary_json(const Summary& s) {
  return {{"mean", num_json(s.mean)},
          {"p50", num_json(s.p50)},
          {"p90", num_json(s.p90)},
          {"p99", num_json(s.p99)}};
}

// The prefix-cache column: on/off in process; over HTTP it is the server's setting.
std::string prefix_text(const RunConfig& c) {
  if (c.mode == "http") return "server";
  return c.mode == "paged" && c.prefix_cache ? "on" : "off";
}

// The admission column: the paged engine's policy (admission.h), "-" for the others.
std::string admission_text(const RunConfig& c) {
  if (c.mode != "paged") return "-";
  return c.admission.substr(0, 5) + (c.preemption == "auto" ? "" : "/" + c.preemption.substr(0, 4));
}

constexpr const char* kCsvHeader =
    "mode,prefix_cache,request_rate,num_requests,kv_budget_tokens,duration_s,requests_per_s,"
    "output_tokens_per_s,total_tokens_per_s,ttft_p50,ttft_p90,ttft_p99,tpot_p50,tpot_p90,tpot_p99,"
    "itl_p50,itl_p90,itl_p99,e2e_p50,e2e_p90,e2e_p99,kv_allocated_mean,kv_live_mean,kv_waste_frac,"
    "running_mean,running_max,preemptions,prefix_hit_rate,ramp_s,steady_s,tail_s,"
    "steady_output_tokens_per_s,prefix_len,steps,output_tokens_per_step\n";

}  // namespace

nlohmann::json result_json(const RunResult& r, const std::string& model, const std::string& device,
                           const std::string& url) {
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
      {"preemption", http || c.mode != "paged" ? nlohmann::json() : nlohmann::json(c.preemption)},
      {"sampling", c.sampling},
      {"preemptions_swap", count_json(r.preemptions_swap)},
      {"swapped_tokens", count_json(r.swapped_tokens)},
      {"swap_bytes", count_json(r.swap_bytes)},
      {"swap_s", num_json(r.swap_s)},
      {"swap_pin_s", num_json(r.swap_pin_s)},
      {"device_busy_s", num_json(r.device_busy_s)},
      {"device_idle_frac", num_json(r.device_idle_frac)},
      {"device_idle_ms_per_step", num_json(r.device_idle_ms_per_step)},
      {"schedule_ahead",
       r.schedule_ahead < 0 ? nlohmann::json() : nlohmann::json(r.schedule_ahead == 1)},
      {"preempted_computed_tokens", count_json(r.preempted_computed_tokens)},
      {"resumed_prefix_hit_tokens", count_json(r.resumed_prefix_hit_tokens)},
      {"admission_stalls", count_json(r.admission_stalls)},
      {"graph_captures", count_json(r.graph_captures)},
      {"graph_replays", count_json(r.graph_replays)},
      {"steps", count_json(r.steps)},
      {"output_tokens_per_step", num_json(r.output_tokens_per_step)},
      {"prefix_hit_rate", num_json(r.prefix_hit_rate)}};
  if (!url.empty()) j["url"] = url;
  return j;
}

std::string rate_text(double rate) {
  if (std::isinf(rate)) return "inf";
  char b[32];
  std::snprintf(b, sizeof b, "%g", rate);
  return b;
}

std::string fmt(double v, const char* format, const char* absent) {
  if (!std::isfinite(v)) return absent;
  char b[64];
  std::snprintf(b, sizeof b, format, v);
  return b;
}
std::string fmt_count(int64_t v, const char* absent) {
  return v >= 0 ? std::to_string(v) : std::string(absent);
}

void append_csv(const std::string& path, const RunResult& r) {
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

void append_timeline(const std::string& path, const RunResult& r) {
  const bool fresh = !std::filesystem::exists(path) || std::filesystem::file_size(path) == 0;
  FILE* f = std::fopen(path.c_str(), "a");
  PA_CHECK(f, "bench serve: cannot open --timeline-csv '", path, "'");
  if (fresh)
    std::fputs(
        "mode,prefix_cache,request_rate,t,kv_allocated,kv_live,running,waiting,"
        "output_tokens\n",
        f);
  for (const KvSample& s : r.timeline)
    std::fprintf(f, "%s,%s,%s,%.4f,%lld,%s,%d,%d,%lld\n", r.config.mode.c_str(),
                 prefix_text(r.config).c_str(), rate_text(r.workload.rate).c_str(), s.t,
                 (long long)s.kv_allocated, fmt_count(s.kv_live).c_str(), s.running, s.waiting,
                 (long long)s.output_tokens);
  std::fclose(f);
}

void print_header() {
  std::printf(
      "%-6s %-6s %-10s %5s %4s %7s %8s %8s | %-23s | %-15s | %-15s | %-15s | %-13s %5s %4s %4s "
      "%6s %5s %5s | %s | %s\n",
      "mode", "prefix", "admit", "rate", "reqs", "req/s", "out t/s", "tot t/s",
      "TTFT p50/p90/p99 s", "TPOT p50/p99 ms", "ITL p50/p99 ms", "E2E p50/p99 s", "KV alloc/live",
      "waste", "pre", "swap", "recomp", "stall", "hit", "ramp/steady/tail s", "tok/step");
}

void print_row(const RunResult& r) {
  std::printf(
      "%-6s %-6s %-10s %5s %4d %7.3f %8.1f %8.1f | %6.2f/%7.2f/%7.2f | %6.1f/%7.1f | %6.1f/%7.1f |"
      " %6.2f/%7.2f | %6s/%6s %5s %4s %4s %6s %5s %5s | %.1f/%.1f/%.1f | %s\n",
      r.config.mode.c_str(), prefix_text(r.config).c_str(), admission_text(r.config).c_str(),
      rate_text(r.workload.rate).c_str(), r.completed, r.req_per_s, r.output_tok_per_s,
      r.total_tok_per_s, r.ttft_s.p50, r.ttft_s.p90, r.ttft_s.p99, 1e3 * r.tpot_s.p50,
      1e3 * r.tpot_s.p99, 1e3 * r.itl_s.p50, 1e3 * r.itl_s.p99, r.e2e_s.p50, r.e2e_s.p99,
      fmt(r.kv_allocated_mean, "%.0f", "-").c_str(), fmt(r.kv_live_mean, "%.0f", "-").c_str(),
      fmt(100 * r.kv_waste_frac, "%.0f%%", "-").c_str(), fmt_count(r.preemptions, "-").c_str(),
      fmt_count(r.preemptions_swap, "-").c_str(), fmt_count(r.recomputed_tokens, "-").c_str(), fmt_count(r.admission_stalls, "-").c_str(),
      fmt(100 * r.prefix_hit_rate, "%.0f%%", "-").c_str(), r.ramp_s, r.steady_s, r.tail_s,
      fmt(r.output_tokens_per_step, "%.2f", "-").c_str());
  std::fflush(stdout);
}

}  // namespace pagedattn::bench::serve_bench
