// `bench serve --url` (bench/serve_bench_http.cpp, with the replay loop it shares, from the
// benchmark library): URL and Prometheus parsing, clear errors for an unreachable or failing
// server, a scripted server that streams known chunks, and the default model served in process by
// `pagedattn serve`'s own Server and AsyncEngine (skipped when
// the default model, models/SmolLM2-135M-Instruct.Q4_1.gguf, is absent). No timing assertions
// beyond the order of events.
#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <sys/socket.h>
#include <unistd.h>

#include <atomic>
#include <csignal>
#include <filesystem>
#include <limits>
#include <nlohmann/json.hpp>
#include <thread>

#include "default_model.h"
#include "pagedattn/chat_template.h"
#include "pagedattn/engine.h"
#include "pagedattn/model.h"
#include "pagedattn/model_file.h"
#include "pagedattn/server.h"
#include "pagedattn/tokenizer.h"
#include "serve_bench_http.h"
#include "serve_bench_run.h"

namespace sb = pagedattn::bench::serve_bench;
using namespace pagedattn;
using nlohmann::json;

namespace {

constexpr double kInf = std::numeric_limits<double>::infinity();

template <class Fn>
void expect_error_naming(Fn&& fn, const std::vector<std::string>& needles) {
  try {
    fn();
    ADD_FAILURE() << "no Error";
  } catch (const Error& e) {
    for (const std::string& n : needles)
      EXPECT_NE(std::string(e.what()).find(n), std::string::npos)
          << "message '" << e.what() << "' does not name " << n;
  }
}

sb::WorkloadSpec small_spec(double rate, int32_t vocab) {
  sb::WorkloadSpec w;
  w.num_requests = 6;
  w.rate = rate;
  w.prefix_len = 16;
  w.prompt = sb::parse_length_spec("uniform:4:16", "--prompt-len");
  w.output = sb::parse_length_spec("uniform:4:8", "--output-len");
  w.vocab_lo = std::min(256, vocab - 1);
  w.vocab_hi = vocab;
  w.seed = 5;
  return w;
}

sb::RunConfig quiet() {
  sb::RunConfig rc;
  rc.progress = false;
  return rc;
}

// What must hold of any successful run: every request complete with exactly its output length,
// its first chunk before its end, the token counts adding up.
void expect_complete(const sb::RunResult& r, const std::vector<sb::WorkItem>& work) {
  EXPECT_EQ(r.config.mode, "http");
  ASSERT_EQ(r.requests.size(), work.size());
  EXPECT_EQ(r.completed, int32_t(work.size()));
  int64_t out = 0, prompt = 0, chunks = 0;
  for (size_t i = 0; i < work.size(); ++i) {
    const sb::RequestRecord& q = r.requests[i];
    EXPECT_EQ(q.max_tokens, work[i].max_tokens);
    EXPECT_EQ(q.output_tokens, work[i].max_tokens) << "request " << i;
    EXPECT_EQ(q.prompt_tokens, int32_t(work[i].prompt.size()));
    EXPECT_GT(q.ttft_s, 0) << "request " << i;
    EXPECT_LE(q.ttft_s, q.e2e_s) << "request " << i;
    EXPECT_GE(q.chunks, 1);
    EXPECT_LE(q.chunks, q.output_tokens);  // a chunk carries one or more tokens' text
    out += work[i].max_tokens;
    prompt += int64_t(work[i].prompt.size());
    chunks += q.chunks;
  }
  EXPECT_EQ(r.output_tokens, out);
  EXPECT_EQ(r.prompt_tokens, prompt);
  EXPECT_EQ(r.ttft_s.count, int64_t(work.size()));
  EXPECT_EQ(r.e2e_s.count, int64_t(work.size()));
  EXPECT_EQ(r.itl_s.count, chunks - int64_t(work.size()));  // the gaps between chunks
  EXPECT_LE(r.ttft_s.p50, r.e2e_s.p99);
  EXPECT_NEAR(r.ramp_s + r.steady_s + r.tail_s, r.duration_s, 1e-9);
}

// ---- a scripted server: /v1/models, and streams of known chunks ----

struct ScriptedServer {
  httplib::Server http;
  std::thread thread;
  int port = 0;
  int status = 200;  // of /v1/completions
  int short_by = 0;  // the usage reports this many tokens fewer than asked
  int tokens_per_chunk = 1;
  std::atomic<int> requests{0};

  ScriptedServer() {
    http.Get("/v1/models", [](const httplib::Request&, httplib::Response& res) {
      res.set_content(
          R"({"object": "list", "data": [{"id": "scripted", "max_model_len": 128,
              "vocab_size": 300}]})",
          "application/json");
    });
    http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
      ++requests;
      if (status != 200) {
        res.status = status;
        res.set_content(R"({"error": {"message": "overloaded", "type": "server_error"}})",
                        "application/json");
        return;
      }
      const json b = json::parse(req.body);
      const int n = b["max_tokens"];
      const bool ok = b["ignore_eos"] == true && b["temperature"] == 0 && b["stream"] == true &&
                      b["prompt"].is_array() && b["stream_options"]["include_usage"] == true;
      const int reported = n - short_by;
      const int per = tokens_per_chunk;
      res.set_chunked_content_provider(
          "text/event-stream", [n, ok, reported, per](size_t, httplib::DataSink& sink) {
            for (int i = 0; i < n; i += per) {
              std::this_thread::sleep_for(std::chrono::milliseconds(2));
              const json c = {{"choices", {{{"index", 0}, {"text", ok ? "ab" : "?"}}}}};
              const std::string s = "data: " + c.dump() + "\n\n";
              sink.write(s.data(), s.size());
            }
            const json u = {{"choices", json::array()},
                            {"usage", {{"completion_tokens", ok ? reported : 0}}}};
            const std::string s = "data: " + u.dump() + "\n\ndata: [DONE]\n\n";
            sink.write(s.data(), s.size());
            sink.done();
            return true;
          });
    });
    port = http.bind_to_any_port("127.0.0.1");
    thread = std::thread([this] { http.listen_after_bind(); });
    while (!http.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  }
  ~ScriptedServer() {
    http.stop();
    thread.join();
  }
  std::string url() const { return "http://127.0.0.1:" + std::to_string(port); }
};

}  // namespace

TEST(ServeBenchHttp, ParsesUrls) {
  sb::Endpoint e = sb::parse_url("http://127.0.0.1:8000");
  EXPECT_EQ(e.host, "127.0.0.1");
  EXPECT_EQ(e.port, 8000);
  EXPECT_EQ(e.base_path, "");
  e = sb::parse_url("http://localhost/");
  EXPECT_EQ(e.host, "localhost");
  EXPECT_EQ(e.port, 80);
  EXPECT_EQ(e.base_path, "");
  e = sb::parse_url("http://[::1]:9000/proxy/llm/");
  EXPECT_EQ(e.host, "::1");
  EXPECT_EQ(e.port, 9000);
  EXPECT_EQ(e.base_path, "/proxy/llm");
  for (const std::string bad :
       {"localhost:8000", "https://h:1", "http://", "http://:80", "http://h:", "http://h:0",
        "http://h:65536", "http://h:8o", "http://[::1", "http://u@h:1", "ftp://h"})
    expect_error_naming([&] { sb::parse_url(bad); }, {"--url", "'" + bad + "'"});
}

TEST(ServeBenchHttp, ParsesPrometheusText) {
  const auto m = sb::parse_prometheus(
      "# HELP pagedattn_kv_pages_used Pages.\n# TYPE pagedattn_kv_pages_used gauge\n"
      "pagedattn_kv_pages_used{model_name=\"a}b \\\"c\\\"\"} 12\n"
      "plain_metric 3.5e2\n\n"
      "hist_bucket{model_name=\"m\",le=\"0.1\"} 4\nhist_bucket{model_name=\"m\",le=\"+Inf\"} 9\n"
      "broken{x=\"1\" 7\nnovalue{x=\"1\"} \n");
  EXPECT_EQ(m.at("pagedattn_kv_pages_used"), 12);
  EXPECT_EQ(m.at("plain_metric"), 350);
  EXPECT_EQ(m.at("hist_bucket"), 4);  // the first sample of a name
  EXPECT_EQ(m.count("broken"), 0u);
  EXPECT_EQ(m.count("novalue"), 0u);
  // The server's own text reads back.
  EngineMetrics em;
  em.pages_used = 7;
  em.pages_total = 64;
  em.kv_capacity_tokens = 1024;
  em.preemptions = 3;
  em.preemptions_recompute = 3;
  em.recomputed_tokens = 250;
  em.admission_stalls = 17;
  em.steps = 41;
  const auto p = sb::parse_prometheus(prometheus_text(em, "we\"ird}name"));
  EXPECT_EQ(p.at("pagedattn_num_preemptions_by_kind_total"), 3);  // kind="recompute"
  EXPECT_EQ(p.at("pagedattn_recomputed_tokens_total"), 250);
  EXPECT_EQ(p.at("pagedattn_admission_stalls_total"), 17);
  EXPECT_EQ(p.at("pagedattn_kv_pages_used"), 7);
  EXPECT_EQ(p.at("pagedattn_kv_cache_capacity_tokens"), 1024);
  EXPECT_EQ(p.at("pagedattn_num_preemptions_total"), 3);
  EXPECT_EQ(p.at("pagedattn_engine_steps_total"), 41);
  // Swap: its kind beside recompute, and counters of bytes printed whole.
  em.preemptions = 5;
  em.preemptions_swap = 2;
  em.swapped_tokens = 321;
  em.swap_out_bytes = 12345678901;
  em.swap_in_bytes = 1000;
  em.num_swapped = 1;
  em.swap_used_bytes = 256;
  em.swap_space_bytes = 1024;
  const std::string text = prometheus_text(em, "m");
  EXPECT_NE(text.find("pagedattn_num_preemptions_by_kind_total{model_name=\"m\",kind=\"swap\"} 2\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("pagedattn_swap_bytes_total{model_name=\"m\",direction=\"out\"} 12345678901\n"),
            std::string::npos) << text;
  EXPECT_NE(text.find("pagedattn_swap_bytes_total{model_name=\"m\",direction=\"in\"} 1000\n"),
            std::string::npos) << text;
  const auto q = sb::parse_prometheus(text);
  EXPECT_EQ(q.at("pagedattn_swapped_tokens_total"), 321);
  EXPECT_EQ(q.at("pagedattn_num_requests_swapped"), 1);
  EXPECT_EQ(q.at("pagedattn_swap_space_usage_perc"), 0.25);
}

TEST(ServeBenchHttp, UnreachableServerIsAClearError) {
  // A port that was free a moment ago, now closed: the connection is refused.
  int port = 0;
  {
    const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
    ASSERT_GE(fd, 0);
    sockaddr_in a = {};
    a.sin_family = AF_INET;
    a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
    socklen_t len = sizeof a;
    ASSERT_EQ(::bind(fd, reinterpret_cast<sockaddr*>(&a), sizeof a), 0);
    ASSERT_EQ(::getsockname(fd, reinterpret_cast<sockaddr*>(&a), &len), 0);
    port = ntohs(a.sin_port);
    ::close(fd);
  }
  const std::string url = "http://127.0.0.1:" + std::to_string(port);
  expect_error_naming([&] { sb::probe_server(sb::parse_url(url)); },
                      {"cannot reach the server at " + url, "/v1/models"});
  // A server without /v1/models.
  httplib::Server empty;
  const int p2 = empty.bind_to_any_port("127.0.0.1");
  std::thread t([&] { empty.listen_after_bind(); });
  while (!empty.is_running()) std::this_thread::sleep_for(std::chrono::milliseconds(1));
  const std::string url2 = "http://127.0.0.1:" + std::to_string(p2);
  expect_error_naming([&] { sb::probe_server(sb::parse_url(url2)); }, {url2, "HTTP 404"});
  empty.stop();
  t.join();
}

TEST(ServeBenchHttp, ScriptedStreamsAreTimedAndCounted) {
  std::signal(SIGPIPE, SIG_IGN);
  ScriptedServer srv;
  srv.tokens_per_chunk = 2;  // text of two tokens per chunk: ITL counts chunks
  const sb::Endpoint ep = sb::parse_url(srv.url());
  const sb::ServerInfo info = sb::probe_server(ep);
  EXPECT_EQ(info.model_name, "scripted");
  EXPECT_EQ(info.max_model_len, 128);
  EXPECT_EQ(info.vocab_size, 300);
  EXPECT_EQ(info.kv_capacity_tokens, -1);  // no /metrics
  const sb::WorkloadSpec w = small_spec(kInf, info.vocab_size);
  const auto work = sb::make_workload(w);
  const sb::RunResult r = sb::run_serve_bench_http(ep, info, work, w, quiet(), {});
  expect_complete(r, work);
  for (size_t i = 0; i < work.size(); ++i)
    EXPECT_EQ(r.requests[i].chunks, (work[i].max_tokens + 1) / 2);
  // Without /metrics: no timeline, and what it would give is absent, not zero.
  EXPECT_TRUE(r.timeline.empty());
  EXPECT_EQ(r.preemptions, -1);
  EXPECT_EQ(r.steps, -1);
  EXPECT_TRUE(std::isnan(r.prefix_hit_rate));
  EXPECT_TRUE(std::isnan(r.kv_waste_frac));
  EXPECT_TRUE(std::isnan(r.output_tokens_per_step));
  EXPECT_EQ(r.config.kv_budget_tokens, -1);
}

TEST(ServeBenchHttp, FailingRequestsAreClearErrors) {
  std::signal(SIGPIPE, SIG_IGN);
  ScriptedServer srv;
  const sb::Endpoint ep = sb::parse_url(srv.url());
  const sb::ServerInfo info = sb::probe_server(ep);
  const sb::WorkloadSpec w = small_spec(kInf, info.vocab_size);
  const auto work = sb::make_workload(w);
  srv.status = 503;
  expect_error_naming([&] { sb::run_serve_bench_http(ep, info, work, w, quiet(), {}); },
                      {"request", srv.url(), "HTTP 503", "overloaded"});
  srv.status = 200;
  srv.short_by = 1;  // stops early, as a server ignoring ignore_eos would
  expect_error_naming([&] { sb::run_serve_bench_http(ep, info, work, w, quiet(), {}); },
                      {"request", "ignore_eos"});
  // Requests that cannot fit the server are refused before any is sent.
  srv.short_by = 0;
  const int before = srv.requests.load();
  sb::WorkloadSpec big = w;
  big.output = sb::parse_length_spec("200", "--output-len");
  expect_error_naming(
      [&] { sb::run_serve_bench_http(ep, info, sb::make_workload(big), big, quiet(), {}); },
      {"max_model_len 128"});
  EXPECT_EQ(srv.requests.load(), before);
}

// ---- the default model behind the real server ----

namespace {

using pagedattn::testing::default_model_path;

// What `pagedattn serve --kv-cache-tokens 2048` runs, on an ephemeral loopback port.
class DefaultModelServer : public ::testing::Test {
 protected:
  void SetUp() override {
    const std::string path = default_model_path();
    if (!std::filesystem::exists(path))
      GTEST_SKIP() << path << " is absent (scripts/fetch-default-model.sh)";
    std::signal(SIGPIPE, SIG_IGN);
    auto tok = std::make_shared<Tokenizer>(load_tokenizer(path));
    std::unique_ptr<Model> model;
    {
      const ModelFile file = load_model_file(path);
      model = create_model(file, Device::cpu);
    }
    EngineConfig ec;
    ec.kv_cache_tokens = 2048;
    ec.eos_token_ids = tok->eog_ids();
    ec.log_startup = false;
    auto decode = [tok](const std::vector<int32_t>& ids) { return tok->decode(ids, true); };
    engine_ = std::make_unique<AsyncEngine>(std::make_unique<Engine>(std::move(model), ec, decode));
    TextCodec codec;
    codec.encode = [tok](const std::string& t) { return tok->encode(t, true, true); };
    codec.encode_chat = [tok](const std::vector<ChatMessage>& m) {
      return tok->encode(apply_chat_template(*tok, m, true), false, true);
    };
    ServerConfig sc;
    sc.port = 0;
    sc.model_name = "smollm2";
    server_ = std::make_unique<Server>(*engine_, codec, sc);
    url_ = "http://127.0.0.1:" + std::to_string(server_->start());
  }
  void TearDown() override {
    if (engine_) engine_->stop();
    if (server_) server_->stop();
  }

  std::unique_ptr<AsyncEngine> engine_;
  std::unique_ptr<Server> server_;
  std::string url_;
};

}  // namespace

TEST_F(DefaultModelServer, OpenLoopRunsCompleteWithTheirLengths) {
  const sb::Endpoint ep = sb::parse_url(url_);
  const sb::ServerInfo info = sb::probe_server(ep);
  EXPECT_EQ(info.model_name, "smollm2");
  EXPECT_EQ(info.kv_capacity_tokens, 2048);
  // Three runs of the same prompts: all at once (salt a), Poisson at 8/s (salt b), all at once
  // again with salt a.
  const std::vector<std::pair<double, std::string>> runs = {{kInf, "a"}, {8.0, "b"}, {kInf, "a"}};
  for (size_t k = 0; k < runs.size(); ++k) {
    const double rate = runs[k].first;
    SCOPED_TRACE("run " + std::to_string(k) + ", rate " + std::to_string(rate));
    const sb::WorkloadSpec w = small_spec(rate, info.vocab_size);
    const auto work = sb::make_workload(w);
    sb::HttpRunOptions opt;
    opt.cache_salt = "test-" + runs[k].second;
    const sb::RunResult r = sb::run_serve_bench_http(ep, info, work, w, quiet(), opt);
    expect_complete(r, work);
    // Open loop: each request sent at (never before) its arrival time, none waiting for another.
    for (size_t i = 0; i < work.size(); ++i) {
      EXPECT_EQ(r.requests[i].arrival_s, work[i].arrival_s);
      EXPECT_GE(r.requests[i].sent_s, work[i].arrival_s);
    }
    if (std::isinf(rate)) {  // all six in flight together: the last sent before the first ended
      double last_sent = 0, first_end = kInf;
      for (const sb::RequestRecord& q : r.requests) {
        last_sent = std::max(last_sent, q.sent_s);
        first_end = std::min(first_end, q.sent_s + q.e2e_s);
      }
      EXPECT_LT(last_sent, first_end);
    }
    // The timeline from /metrics: KV in use while requests ran, nothing held at the end, and the
    // tokens the server generated.
    ASSERT_GE(r.timeline.size(), 2u);
    int64_t most = 0;
    for (const sb::KvSample& s : r.timeline) {
      EXPECT_EQ(s.kv_live, -1);
      EXPECT_GE(s.kv_allocated, 0);
      EXPECT_LE(s.kv_allocated, 2048);
      most = std::max(most, s.kv_allocated);
    }
    EXPECT_GT(most, 0);
    EXPECT_EQ(r.timeline.back().kv_allocated, 0);
    EXPECT_EQ(r.timeline.back().output_tokens, r.output_tokens);
    EXPECT_GT(r.kv_allocated_mean, 0);
    EXPECT_TRUE(std::isnan(r.kv_live_mean));
    EXPECT_TRUE(std::isnan(r.kv_waste_frac));
    // Counters over the run: steps, preemptions and prefix hits are known.
    EXPECT_GT(r.steps, 0);
    EXPECT_NEAR(r.output_tokens_per_step, double(r.output_tokens) / double(r.steps), 1e-9);
    EXPECT_EQ(r.preemptions, 0);
    EXPECT_EQ(r.kv_pool_tokens, 2048);
    // Prefix hits: within a run only the shared 16-token page can match (at most 5 of 6 requests
    // find it), so a fresh salt finds nothing of the earlier runs; the same salt again finds every
    // prompt's first page (at least 16 tokens each) cached by run 0.
    const double page_hits = 16.0 / double(r.prompt_tokens);
    if (k == 1) {
      EXPECT_LE(r.prefix_hit_rate, 5 * page_hits + 1e-9);
    } else if (k == 2) {
      EXPECT_GE(r.prefix_hit_rate, 6 * page_hits - 1e-9);
    }
  }
}

TEST_F(DefaultModelServer, ClosedLoopOverHttpReachesTheTarget) {
  const sb::Endpoint ep = sb::parse_url(url_);
  const sb::ServerInfo info = sb::probe_server(ep);
  sb::WorkloadSpec w = small_spec(kInf, info.vocab_size);
  w.num_requests = 12;
  w.output = sb::parse_length_spec("4", "--output-len");
  const auto work = sb::make_workload(w);
  sb::RunConfig rc = quiet();
  rc.target_tokens = 18;
  rc.concurrency = 2;
  const sb::RunResult r = sb::run_serve_bench_http(ep, info, work, w, rc, {});
  ASSERT_EQ(r.requests.size(), 5u);  // 5 x 4 tokens: the first count to reach 18
  EXPECT_EQ(r.output_tokens, 20);
  for (size_t i = 0; i < r.requests.size(); ++i) {
    EXPECT_EQ(r.requests[i].output_tokens, 4);
    EXPECT_LE(r.requests[i].ttft_s, r.requests[i].e2e_s);
    int32_t unfinished = 0;  // released only while fewer than 2 were in flight
    for (size_t k = 0; k < i; ++k)
      if (r.requests[k].arrival_s + r.requests[k].e2e_s > r.requests[i].arrival_s + 1e-9)
        ++unfinished;
    EXPECT_LT(unfinished, 2) << "request " << i;
  }
  for (const sb::KvSample& s : r.timeline) EXPECT_LE(s.running + s.waiting, 2);
}
