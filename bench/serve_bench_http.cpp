// The serving benchmark over HTTP: arrivals -> one client thread per request streaming
// POST /v1/completions -> per-chunk timestamps; a poller thread samples GET /metrics into the
// timeline -> RunResult.
#include "serve_bench_http.h"

#include <httplib.h>

#include <algorithm>
#include <atomic>
#include <cctype>
#include <chrono>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <functional>
#include <memory>
#include <mutex>
#include <nlohmann/json.hpp>
#include <sstream>
#include <system_error>
#include <thread>

#include "pagedattn/error.h"
#include "sampling_mix.h"

namespace pagedattn::bench::serve_bench {

using nlohmann::json;

Endpoint parse_url(const std::string& url) {
  const std::string scheme = "http://";
  auto bad = [&](const std::string& why) {
    fail("bench serve: --url '", url, "' is not http://HOST[:PORT][/BASE]: ", why);
  };
  if (url.rfind(scheme, 0) != 0) {
    if (url.rfind("https://", 0) == 0) bad("https is not supported");
    bad("it must start with http://");
  }
  Endpoint ep;
  ep.url = url;
  std::string rest = url.substr(scheme.size());
  const size_t slash = rest.find('/');
  if (slash != std::string::npos) {
    ep.base_path = rest.substr(slash);
    rest = rest.substr(0, slash);
    while (!ep.base_path.empty() && ep.base_path.back() == '/') ep.base_path.pop_back();
  }
  std::string port;
  if (!rest.empty() && rest.front() == '[') {  // [IPv6]:PORT
    const size_t close = rest.find(']');
    if (close == std::string::npos) bad("an IPv6 address lacks its ']'");
    ep.host = rest.substr(1, close - 1);
    const std::string after = rest.substr(close + 1);
    if (!after.empty()) {
      if (after.front() != ':') bad("expected ':' after ']'");
      port = after.substr(1);
      if (port.empty()) bad("the port is empty");
    }
  } else {
    const size_t colon = rest.find(':');
    ep.host = rest.substr(0, colon);
    if (colon != std::string::npos) {
      port = rest.substr(colon + 1);
      if (port.empty()) bad("the port is empty");
    }
  }
  if (ep.host.empty()) bad("the host is empty");
  for (char c : ep.host)
    if (std::isspace(static_cast<unsigned char>(c)) || c == '@' || c == '?' || c == '#')
      bad("the host '" + ep.host + "' holds '" + std::string(1, c) + "'");
  if (!port.empty()) {
    if (port.size() > 5 || !std::all_of(port.begin(), port.end(), [](char c) {
          return std::isdigit(static_cast<unsigned char>(c));
        }))
      bad("the port '" + port + "' is not a number in [1, 65535]");
    ep.port = std::stoi(port);
    if (ep.port < 1 || ep.port > 65535) bad("the port " + port + " is outside [1, 65535]");
  }
  return ep;
}

std::map<std::string, double> parse_prometheus(const std::string& text) {
  std::map<std::string, double> out;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) {
    if (line.empty() || line[0] == '#') continue;
    size_t name_end = line.find_first_of("{ ");
    if (name_end == std::string::npos) continue;
    const std::string name = line.substr(0, name_end);
    size_t value_at = name_end;
    if (line[name_end] == '{') {
      // Label values may hold '}' inside quotes: skip quoted text.
      bool quoted = false;
      for (value_at = name_end + 1; value_at < line.size(); ++value_at) {
        const char c = line[value_at];
        if (c == '\\' && quoted) {
          ++value_at;
        } else if (c == '"') {
          quoted = !quoted;
        } else if (c == '}' && !quoted) {
          break;
        }
      }
      if (value_at >= line.size()) continue;
      ++value_at;
    }
    const char* start = line.c_str() + value_at;
    char* end = nullptr;
    const double v = std::strtod(start, &end);
    if (end == start) continue;
    out.emplace(name, v);
  }
  return out;
}

namespace {

using Clock = std::chrono::steady_clock;

std::unique_ptr<httplib::Client> make_client(const Endpoint& ep, double read_timeout_s) {
  auto c = std::make_unique<httplib::Client>(ep.host, ep.port);
  c->set_connection_timeout(5, 0);
  const auto us = std::chrono::microseconds(int64_t(read_timeout_s * 1e6));
  c->set_read_timeout(us);
  c->set_write_timeout(30, 0);
  return c;
}

// What went wrong with a request that got no (whole) response.
std::string describe(httplib::Error e) {
  switch (e) {
    case httplib::Error::Connection:
      return "could not connect";
    case httplib::Error::ConnectionTimeout:
      return "the connection timed out";
    case httplib::Error::Read:
      return "reading the response failed or timed out";
    case httplib::Error::Write:
      return "sending the request failed";
    case httplib::Error::Canceled:
      return "cancelled";
    default:
      return httplib::to_string(e);
  }
}

// The message of an OpenAI-style error body, else the body itself (shortened).
std::string error_message(const std::string& body) {
  const json j = json::parse(body, nullptr, false);
  if (j.is_object() && j.contains("error") && j["error"].is_object() &&
      j["error"].contains("message") && j["error"]["message"].is_string())
    return j["error"]["message"].get<std::string>();
  return body.size() > 200 ? body.substr(0, 200) + "..." : body;
}

// GET path; throws Error naming the URL unless it answers 200.
std::string get_ok(httplib::Client& c, const Endpoint& ep, const std::string& path) {
  const httplib::Result r = c.Get((ep.base_path + path).c_str());
  PA_CHECK(r, "bench serve: cannot reach the server at ", ep.url, " (GET ", path, ": ",
           describe(r.error()), ")");
  PA_CHECK(r->status == 200, "bench serve: GET ", path, " at ", ep.url, " answered HTTP ",
           r->status, ": ", error_message(r->body));
  return r->body;
}

// The /metrics samples the benchmark reads.
struct ServerCounters {
  bool ok = false;  // the KV gauges were there
  double pages_used = 0, pages_total = 0, capacity_tokens = 0, running = 0, waiting = 0;
  double generated = 0, preemptions = 0, prefix_queries = 0, prefix_hits = 0, steps = -1;
};

ServerCounters read_counters(const std::map<std::string, double>& m) {
  ServerCounters c;
  auto get = [&](const char* name, double& into) {
    const auto it = m.find(name);
    if (it == m.end()) return false;
    into = it->second;
    return true;
  };
  c.ok = get("pagedattn_kv_pages_used", c.pages_used) &&
         get("pagedattn_kv_pages_total", c.pages_total) &&
         get("pagedattn_kv_cache_capacity_tokens", c.capacity_tokens) &&
         get("pagedattn_num_requests_running", c.running) &&
         get("pagedattn_num_requests_waiting", c.waiting) &&
         get("pagedattn_generation_tokens_total", c.generated) &&
         get("pagedattn_num_preemptions_total", c.preemptions) &&
         get("pagedattn_prefix_cache_queries_total", c.prefix_queries) &&
         get("pagedattn_prefix_cache_hits_total", c.prefix_hits) && c.pages_total > 0;
  get("pagedattn_engine_steps_total", c.steps);  // optional
  return c;
}

// One request in flight, written by its own thread until `finished` (under the run's mutex).
struct Stream {
  std::shared_ptr<httplib::Client> client;
  std::thread thread;
  double arrival = -1, sent = -1, first = -1, last = -1, done = -1;
  int32_t chunks = 0;
  int64_t usage_tokens = -1;
  std::vector<double> itl;
  std::string error;
  bool finished = false;
};

// Sends one streamed completion and timestamps its chunks; on failure, s.error says why.
void stream_one(Stream& s, const std::string& path, const std::string& body,
                const std::function<double()>& elapsed, const std::atomic<bool>& cancel_all) {
  httplib::Request req;
  req.method = "POST";
  req.path = path;
  req.headers = {{"Content-Type", "application/json"}, {"Accept", "text/event-stream"}};
  req.body = body;
  int status = 0;
  bool done_seen = false;
  double done_at = -1;
  std::string buf, err_body;
  auto on_event = [&](std::string ev, double now) {
    ev.erase(std::remove(ev.begin(), ev.end(), '\r'), ev.end());
    if (ev.rfind("data:", 0) != 0) return;  // comments, other fields
    ev = ev.substr(ev.size() > 5 && ev[5] == ' ' ? 6 : 5);
    if (ev == "[DONE]") {
      done_seen = true;
      done_at = now;
      return;
    }
    const json j = json::parse(ev, nullptr, false);
    if (!j.is_object()) {
      if (s.error.empty()) s.error = "a streamed event is not JSON: " + ev.substr(0, 100);
      return;
    }
    if (j.contains("error")) {
      if (s.error.empty()) s.error = error_message(ev);
      return;
    }
    if (j.contains("usage") && j["usage"].is_object() && j["usage"].contains("completion_tokens") &&
        j["usage"]["completion_tokens"].is_number_integer())
      s.usage_tokens = j["usage"]["completion_tokens"].get<int64_t>();
    if (j.contains("choices") && j["choices"].is_array() && !j["choices"].empty()) {
      if (s.first < 0)
        s.first = now;
      else
        s.itl.push_back(now - s.last);
      s.last = now;
      ++s.chunks;
    }
  };
  req.response_handler = [&](const httplib::Response& r) {
    status = r.status;
    return !cancel_all.load();
  };
  req.content_receiver = [&](const char* data, size_t n, uint64_t, uint64_t) {
    if (cancel_all.load()) return false;
    if (status != 200) {
      err_body.append(data, std::min(n, size_t(4096) - std::min(size_t(4096), err_body.size())));
      return true;
    }
    const double now = elapsed();
    buf.append(data, n);
    for (size_t end; (end = buf.find("\n\n")) != std::string::npos;) {
      on_event(buf.substr(0, end), now);
      buf.erase(0, end + 2);
    }
    return true;
  };
  httplib::Response res;
  httplib::Error err = httplib::Error::Success;
  s.sent = elapsed();
  const bool ok = s.client->send(req, res, err);
  s.done = done_seen ? done_at : elapsed();  // end to end: until data: [DONE]
  if (!s.error.empty()) return;
  if (cancel_all.load()) {
    s.error = "cancelled (another request failed)";
  } else if (!ok && status == 0) {
    s.error = "no response (" + describe(err) + ")";
  } else if (status != 200) {
    s.error = "HTTP " + std::to_string(status) + ": " + error_message(err_body);
  } else if (!ok || !done_seen) {
    s.error = "the stream ended before data: [DONE]" + (ok ? "" : " (" + describe(err) + ")");
  } else if (s.usage_tokens < 0) {
    s.error = "the stream carried no usage";
  } else if (s.first < 0) {
    s.error = "the stream carried no completion chunk";
  }
}

}  // namespace

ServerInfo probe_server(const Endpoint& ep) {
  auto c = make_client(ep, 10);
  ServerInfo info;
  const std::string models = get_ok(*c, ep, "/v1/models");
  const json j = json::parse(models, nullptr, false);
  PA_CHECK(j.is_object() && j.contains("data") && j["data"].is_array() && !j["data"].empty() &&
               j["data"][0].is_object(),
           "bench serve: GET /v1/models at ", ep.url, " lists no model");
  const json& m = j["data"][0];
  PA_CHECK(m.contains("id") && m["id"].is_string(), "bench serve: GET /v1/models at ", ep.url,
           ": the model has no id");
  info.model_name = m["id"].get<std::string>();
  PA_CHECK(m.contains("max_model_len") && m["max_model_len"].is_number_integer() &&
               m["max_model_len"].get<int64_t>() > 0,
           "bench serve: GET /v1/models at ", ep.url, " does not give max_model_len");
  info.max_model_len = m["max_model_len"].get<int64_t>();
  PA_CHECK(m.contains("vocab_size") && m["vocab_size"].is_number_integer() &&
               m["vocab_size"].get<int64_t>() > 1,
           "bench serve: GET /v1/models at ", ep.url,
           " does not give vocab_size (the prompts are token ids below it; pagedattn serve "
           "reports it)");
  info.vocab_size = int32_t(m["vocab_size"].get<int64_t>());
  const httplib::Result r = c->Get((ep.base_path + "/metrics").c_str());
  if (r && r->status == 200) {
    const ServerCounters sc = read_counters(parse_prometheus(r->body));
    if (sc.ok) info.kv_capacity_tokens = int64_t(sc.capacity_tokens);
  }
  return info;
}

RunResult run_serve_bench_http(const Endpoint& ep, const ServerInfo& info,
                               const std::vector<WorkItem>& work, const WorkloadSpec& spec,
                               const RunConfig& cfg, const HttpRunOptions& opt) {
  PA_CHECK(cfg.sampling == "greedy" || cfg.sampling == "mixed",
           "bench serve: --sampling must be greedy or mixed, got '", cfg.sampling, "'");
  PA_CHECK(cfg.target_tokens >= 0 && cfg.concurrency > 0,
           "bench serve: --target-tokens must be >= 0 and --concurrency positive");
  PA_CHECK(!work.empty(), "bench serve: the workload is empty");
  PA_CHECK(opt.timeout_s > 0 && opt.metrics_period_s > 0,
           "bench serve: the HTTP timeout and the /metrics period must be positive");
  for (size_t i = 0; i < work.size(); ++i) {
    const int64_t len = int64_t(work[i].prompt.size()) + work[i].max_tokens;
    PA_CHECK(len <= info.max_model_len, "bench serve: request ", i, " needs ", len,
             " tokens, beyond the server's max_model_len ", info.max_model_len);
    PA_CHECK(info.kv_capacity_tokens < 0 || len <= info.kv_capacity_tokens, "bench serve: request ",
             i, " needs ", len, " tokens of KV, more than the server's KV cache holds (",
             info.kv_capacity_tokens, ")");
    for (int32_t t : work[i].prompt)
      PA_CHECK(t >= 0 && t < info.vocab_size, "bench serve: request ", i, " holds token id ", t,
               ", outside the server's vocabulary of ", info.vocab_size);
  }
  const bool closed_loop = cfg.target_tokens > 0;
  const std::string path = ep.base_path + "/v1/completions";

  RunResult r;
  r.config = cfg;
  r.config.mode = "http";
  r.config.kv_budget_tokens = info.kv_capacity_tokens;
  r.config.max_num_seqs = -1;
  r.config.max_num_batched_tokens = -1;
  r.workload = spec;
  r.kv_pool_tokens = info.kv_capacity_tokens;

  // The counters before the run: the run reports differences.
  auto metrics_client = make_client(ep, 5);
  auto poll = [&]() -> ServerCounters {
    const httplib::Result res = metrics_client->Get((ep.base_path + "/metrics").c_str());
    if (!res || res->status != 200) return {};
    return read_counters(parse_prometheus(res->body));
  };
  const ServerCounters base = poll();
  if (!base.ok)
    std::fprintf(stderr,
                 "bench serve: warning: GET /metrics at %s lacks the pagedattn KV gauges; KV use, "
                 "preemptions, prefix hits and steps will be absent\n",
                 ep.url.c_str());
  const int64_t page_tokens =
      base.ok ? std::llround(base.capacity_tokens / std::max(1.0, base.pages_total)) : 0;

  const Clock::time_point t0 = Clock::now();
  const std::function<double()> elapsed = [t0] {
    return std::chrono::duration<double>(Clock::now() - t0).count();
  };
  std::mutex mu;
  std::condition_variable cv;
  std::vector<Stream> st(work.size());
  std::atomic<bool> cancel_all{false};
  size_t next = 0, failed_index = 0;
  int32_t completed = 0, active = 0;
  int64_t issued_tokens = 0;
  double last_release = 0;

  // The timeline, from the poller thread (guarded by mu).
  std::atomic<bool> stop_polling{false};
  int64_t failed_polls = 0;
  auto to_sample = [&](const ServerCounters& c, double t) {
    KvSample s;
    s.t = t;
    s.kv_allocated = int64_t(c.pages_used) * page_tokens;
    s.kv_live = -1;  // the server does not say how full its pages are
    s.running = int32_t(c.running);
    s.waiting = int32_t(c.waiting);
    s.output_tokens = int64_t(c.generated - base.generated);
    return s;
  };
  std::thread poller;
  if (base.ok) {
    poller = std::thread([&] {
      while (!stop_polling.load()) {
        const ServerCounters c = poll();
        const double now = elapsed();
        {
          std::lock_guard<std::mutex> lk(mu);
          if (c.ok)
            r.timeline.push_back(to_sample(c, now));
          else
            ++failed_polls;
        }
        // The next tick of the period (a slow answer skips ticks rather than bursting).
        const double tick = (std::floor(now / opt.metrics_period_s) + 1) * opt.metrics_period_s;
        const auto wake =
            t0 + std::chrono::duration_cast<Clock::duration>(std::chrono::duration<double>(tick));
        while (!stop_polling.load() && Clock::now() < wake)
          std::this_thread::sleep_for(
              std::min<Clock::duration>(wake - Clock::now(), std::chrono::milliseconds(10)));
      }
    });
  }

  auto body_of = [&](size_t i) {
    json b = {{"model", info.model_name},
              {"prompt", work[i].prompt},
              {"max_tokens", work[i].max_tokens},
              {"temperature", 0},
              {"ignore_eos", true},
              {"stream", true},
              {"stream_options", {{"include_usage", true}}}};
    if (!opt.cache_salt.empty()) b["cache_salt"] = opt.cache_salt;
    if (cfg.sampling == "mixed") {
      const SamplingParams m = mixed_sampling();
      b["temperature"] = m.temperature;
      b["top_p"] = m.top_p;
      b["top_k"] = m.top_k;
      b["repetition_penalty"] = m.repetition_penalty;
      b["logprobs"] = m.logprobs;
      b["seed"] = int64_t(i);
    }
    return b.dump();
  };
  // Under mu.
  auto launch = [&](size_t i, double now) {
    Stream& s = st[i];
    s.arrival = closed_loop ? now : work[i].arrival_s;
    s.client = make_client(ep, opt.timeout_s);
    ++active;
    issued_tokens += work[i].max_tokens;
    last_release = now;
    try {
      s.thread = std::thread([&, i, body = body_of(i)] {
        Stream& me = st[i];
        stream_one(me, path, body, elapsed, cancel_all);
        if (me.error.empty() && me.usage_tokens != work[i].max_tokens)
          me.error = "asked for " + std::to_string(work[i].max_tokens) + " tokens and got " +
                     std::to_string(me.usage_tokens) + " (does the server honour ignore_eos?)";
        {
          std::lock_guard<std::mutex> lk(mu);
          me.finished = true;
          --active;
          if (me.error.empty()) {
            ++completed;
          } else if (!cancel_all.exchange(true)) {
            failed_index = i;
          }
        }
        cv.notify_all();
      });
    } catch (const std::system_error& e) {  // out of threads: fail the run, do not crash
      s.error = std::string("cannot start a client thread: ") + e.what();
      s.finished = true;
      --active;
      if (!cancel_all.exchange(true)) failed_index = i;
    }
  };
  auto more_to_come = [&] {
    return next < work.size() && (!closed_loop || issued_tokens < cfg.target_tokens);
  };
  char rate_text[32];
  std::snprintf(rate_text, sizeof rate_text, "%g", spec.rate);
  const std::string label = std::string("http rate=") + (closed_loop ? "closed" : rate_text);

  double last_progress = -1;
  {
    std::unique_lock<std::mutex> lk(mu);
    while (true) {
      const double now = elapsed();
      if (!cancel_all.load()) {
        if (closed_loop) {
          while (more_to_come() && active < cfg.concurrency) launch(next++, now);
        } else {
          while (next < work.size() && work[next].arrival_s <= now) launch(next++, now);
        }
      }
      if (active == 0 && (cancel_all.load() || !more_to_come())) break;
      if (cancel_all.load()) {  // cancel what is in flight (again: a thread may not have sent yet)
        for (size_t i = 0; i < next; ++i)
          if (!st[i].finished) st[i].client->stop();
      }
      if (cfg.progress && now - last_progress > 0.25) {
        last_progress = now;
        print_progress(label, completed, closed_loop ? int32_t(next) : int32_t(work.size()),
                       int64_t(r.timeline.empty() ? 0 : r.timeline.back().output_tokens), now,
                       false);
      }
      double wake = now + 0.25;
      if (!closed_loop && next < work.size() && !cancel_all.load())
        wake = std::min(wake, work[next].arrival_s);
      cv.wait_until(lk, t0 + std::chrono::duration_cast<Clock::duration>(
                                 std::chrono::duration<double>(wake)));
    }
  }
  r.duration_s = elapsed();
  for (size_t i = 0; i < next; ++i)
    if (st[i].thread.joinable()) st[i].thread.join();
  stop_polling = true;
  if (poller.joinable()) poller.join();
  PA_CHECK(!cancel_all.load(), "bench serve: request ", failed_index, " to ", ep.url,
           " failed: ", st[failed_index].error);
  // The end state, at the end of the run (a poll that came back later gives way to it).
  const ServerCounters end = poll();
  while (!r.timeline.empty() && r.timeline.back().t > r.duration_s) r.timeline.pop_back();
  if (end.ok) r.timeline.push_back(to_sample(end, r.duration_s));
  if (failed_polls > 0)
    std::fprintf(stderr, "bench serve: warning: %lld polls of GET /metrics failed\n",
                 (long long)failed_polls);
  double max_lag = 0;  // open loop: how late the requests went out
  for (size_t i = 0; i < next && !closed_loop; ++i)
    max_lag = std::max(max_lag, st[i].sent - st[i].arrival);
  if (max_lag > 0.05)
    std::fprintf(stderr,
                 "bench serve: warning: requests were sent up to %.3f s after their "
                 "arrival times (the client machine is busy)\n",
                 max_lag);

  std::vector<double> ttft, tpot, itl, e2e;
  // The backlog lasts until the last release and while the server has sequences waiting.
  double first_done = -1, last_backlog = last_release;
  for (size_t i = 0; i < next; ++i) {
    const Stream& s = st[i];
    RequestRecord q;
    q.arrival_s = s.arrival;
    q.sent_s = s.sent;
    q.prompt_tokens = int32_t(work[i].prompt.size());
    q.max_tokens = work[i].max_tokens;
    q.output_tokens = int32_t(s.usage_tokens);
    q.chunks = s.chunks;
    q.ttft_s = s.first - s.sent;
    q.e2e_s = s.done - s.sent;
    r.requests.push_back(q);
    ttft.push_back(q.ttft_s);
    e2e.push_back(q.e2e_s);
    itl.insert(itl.end(), s.itl.begin(), s.itl.end());
    if (s.usage_tokens > 1) tpot.push_back((s.last - s.first) / double(s.usage_tokens - 1));
    r.output_tokens += s.usage_tokens;
    r.prompt_tokens += q.prompt_tokens;
    first_done = first_done < 0 ? s.done : std::min(first_done, s.done);
  }
  for (const KvSample& s : r.timeline)
    if (s.waiting > 0) last_backlog = std::max(last_backlog, s.t);
  r.completed = completed;
  if (cfg.progress)
    print_progress(label, completed, completed, r.output_tokens, r.duration_s, true);
  summarize_run(r, ttft, tpot, itl, e2e, first_done, last_backlog);

  if (base.ok && end.ok) {
    r.preemptions = int64_t(end.preemptions - base.preemptions);
    const double queries = end.prefix_queries - base.prefix_queries;
    r.prefix_hit_rate = queries > 0 ? (end.prefix_hits - base.prefix_hits) / queries : 0.0;
  } else {
    r.preemptions = -1;
    r.prefix_hit_rate = kAbsent;
  }
  if (base.ok && end.ok && base.steps >= 0 && end.steps >= 0) {
    r.steps = int64_t(end.steps - base.steps);
    r.output_tokens_per_step = r.steps > 0 ? double(r.output_tokens) / double(r.steps) : 0.0;
  } else {
    r.steps = -1;
    r.output_tokens_per_step = kAbsent;
  }
  return r;
}

}  // namespace pagedattn::bench::serve_bench
