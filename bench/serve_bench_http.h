// The serving benchmark against a running `pagedattn serve` over HTTP (`bench serve --url`).
//
// The workload of serve_bench.h (the same arrivals, lengths, shared prefix and seeds) is sent to
// POST /v1/completions: the prompt as token ids, max_tokens = the request's output length, greedy,
// ignore_eos, stream with usage. Requests are released at their arrival times (open loop: one
// client thread per request in flight, nothing serialised) or kept `concurrency` in flight until
// `target_tokens` output tokens are asked for (closed loop).
//
// Per request, timed on this side: TTFT (send to the first streamed chunk of the completion), the
// gaps between chunks (ITL), end to end (send to the end of the stream); output tokens from the
// final usage's completion_tokens (which must equal max_tokens). A chunk carries the text of one
// engine step's new tokens; a token whose text the server holds back (an incomplete UTF-8
// sequence, a special token) arrives with the next chunk, so ITL counts chunks, not tokens.
// GET /metrics, polled every metrics_period_s on another thread, gives the timeline (KV pages in
// use x page size, running and waiting sequences, tokens generated) and, as differences over the
// run, preemptions, the prefix hit rate and engine steps. What the server does not say (the live
// KV tokens, hence the waste) is absent (serve_bench_run.h).
#pragma once

#include <map>
#include <string>
#include <vector>

#include "serve_bench_run.h"

namespace pagedattn::bench::serve_bench {

// http://HOST[:PORT][/BASE] (HOST may be [IPv6]; PORT defaults to 80; BASE is prepended to every
// path). Throws Error naming the URL when it is not of that form.
struct Endpoint {
  std::string url;  // as given, for messages
  std::string host;
  int port = 80;
  std::string base_path;  // "" or "/base", without a trailing slash
};
Endpoint parse_url(const std::string& url);

// What the benchmark needs from the server: GET /v1/models (the served model's id, max_model_len,
// vocab_size) and GET /metrics (the KV capacity; -1 when /metrics does not say). Throws Error
// naming the URL when the server cannot be reached or answers something else.
struct ServerInfo {
  std::string model_name;
  int64_t max_model_len = 0;
  int32_t vocab_size = 0;
  int64_t kv_capacity_tokens = -1;
};
ServerInfo probe_server(const Endpoint& ep);

// Prometheus text format: the value of each sample by metric name, labels dropped (the first
// sample of a name wins). Comments, blank lines and unparsable lines are skipped.
std::map<std::string, double> parse_prometheus(const std::string& text);

struct HttpRunOptions {
  std::string cache_salt;          // sent with every request of the run ("": none)
  double timeout_s = 600;          // longest wait for the next bytes of a response
  double metrics_period_s = 0.05;  // GET /metrics every this many seconds
};

// Replays `work` against the server (cfg: target_tokens, concurrency and progress are used; the
// result's config has mode "http", kv_budget_tokens = the server's KV capacity). Throws Error
// naming the request and the URL when a request fails (an HTTP error, a broken stream, fewer
// tokens than asked); requests still in flight are cancelled first.
RunResult run_serve_bench_http(const Endpoint& ep, const ServerInfo& info,
                               const std::vector<WorkItem>& work, const WorkloadSpec& spec,
                               const RunConfig& cfg, const HttpRunOptions& opt);

}  // namespace pagedattn::bench::serve_bench
