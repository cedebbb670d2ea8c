// Server tests: the server in-process on an ephemeral loopback port, with the fake model and a
// byte-level fake tokenizer (server_fixture.h), driven by httplib's client.
#include <gtest/gtest.h>
#include <httplib.h>

#include <algorithm>
#include <cmath>
#include <csignal>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/fake_model.h"
#include "pagedattn/server.h"
#include "server_fixture.h"

using namespace pagedattn;
using fakes::FakeModel;
using nlohmann::json;

namespace {

using testing_server::FakeServer;
constexpr int32_t kMaxLen = FakeServer::kMaxLen;

std::vector<int32_t> chat_ids(const std::vector<ChatMessage>& msgs) {
  return testing_server::fake_chat_ids(msgs);
}

struct Sse {
  std::vector<json> events;
  bool done = false;  // ended with data: [DONE]
};

Sse parse_sse(const std::string& body) {
  Sse s;
  size_t pos = 0;
  while (pos < body.size()) {
    size_t end = body.find("\n\n", pos);
    if (end == std::string::npos) end = body.size();
    std::string ev = body.substr(pos, end - pos);
    pos = end + 2;
    if (ev.rfind("data: ", 0) != 0) continue;
    ev = ev.substr(6);
    if (ev == "[DONE]") {
      s.done = true;
      continue;
    }
    s.events.push_back(json::parse(ev));
  }
  return s;
}

class ServerTest : public ::testing::TestWithParam<bool> {
 protected:
  void SetUp() override {
    srv_ = std::make_unique<FakeServer>(GetParam());
    fake_ = srv_->fake;
    start_free_ = metric("pagedattn_kv_pages_free");
  }
  void TearDown() override { srv_.reset(); }

  std::unique_ptr<httplib::Client> client() { return srv_->client(); }
  httplib::Result post(const std::string& path, const std::string& body) {
    return srv_->post(path, body);
  }
  double metric(const std::string& name) {
    auto r = client()->Get("/metrics");
    EXPECT_TRUE(r && r->status == 200);
    if (!r) return -1;
    const std::string& b = r->body;
    size_t at = b.find("\n" + name + "{");
    EXPECT_NE(at, std::string::npos) << name;
    if (at == std::string::npos) return -1;
    return std::stod(b.substr(b.find("} ", at) + 2));
  }
  // Pages back to where they started once every request is gone (bounded wait).
  void expect_pages_released() {
    for (int i = 0; i < 200 && metric("pagedattn_kv_pages_used") != 0; ++i)
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    EXPECT_EQ(metric("pagedattn_kv_pages_used"), 0);
    EXPECT_EQ(metric("pagedattn_num_requests_active"), 0);
    if (!GetParam())
      EXPECT_EQ(metric("pagedattn_kv_pages_free"), start_free_);
    else
      EXPECT_EQ(metric("pagedattn_kv_pages_free") + metric("pagedattn_kv_pages_cached"),
                start_free_);
  }
  std::string oracle_text(const std::vector<int32_t>& prompt, int32_t n) {
    return srv_->oracle_text(prompt, n);
  }

  std::unique_ptr<FakeServer> srv_;  // the fake model behind the server (server_fixture.h)
  FakeModel* fake_ = nullptr;
  double start_free_ = 0;
};

void expect_error(const httplib::Result& r, int status, const std::string& param,
                  const std::string& in_message) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  json j = json::parse(r->body, nullptr, false);
  ASSERT_FALSE(j.is_discarded()) << r->body;
  ASSERT_TRUE(j.contains("error")) << r->body;
  const json& e = j["error"];
  EXPECT_TRUE(e["message"].is_string());
  EXPECT_TRUE(e["type"].is_string());
  EXPECT_TRUE(e.contains("param") && e.contains("code")) << r->body;
  if (param.empty())
    EXPECT_TRUE(e["param"].is_null()) << r->body;
  else
    EXPECT_EQ(e["param"], param) << r->body;
  EXPECT_NE(e["message"].get<std::string>().find(in_message), std::string::npos) << r->body;
}

}  // namespace

TEST_P(ServerTest, HealthSaysWhenTheRunnerCannotRun) {
  auto c = client();
  fake_->set_unhealthy("tensor parallel: rank 1 exited or lost its connection");
  auto h = c->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 503);
  const json j = json::parse(h->body);
  EXPECT_EQ(j["status"], "error");
  EXPECT_EQ(j["error"], "tensor parallel: rank 1 exited or lost its connection");
  fake_->set_unhealthy("");
  EXPECT_EQ(c->Get("/health")->status, 200);
}

TEST_P(ServerTest, HealthModelsMetrics) {
  auto c = client();
  auto h = c->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  auto m = c->Get("/v1/models");
  ASSERT_TRUE(m);
  json j = json::parse(m->body);
  EXPECT_EQ(j["object"], "list");
  EXPECT_EQ(j["data"][0]["id"], "fake");
  EXPECT_EQ(j["data"][0]["max_model_len"], kMaxLen);
  EXPECT_EQ(j["data"][0]["vocab_size"], 128);
  EXPECT_EQ(metric("pagedattn_kv_pages_total"), 2048 / 16);
  EXPECT_EQ(metric("pagedattn_kv_pages_used"), 0);
  auto text = c->Get("/metrics")->body;
  EXPECT_NE(
      text.find("pagedattn_time_to_first_token_seconds_bucket{model_name=\"fake\",le=\"+Inf\"}"),
      std::string::npos);
}

TEST_P(ServerTest, CompletionMatchesOracle) {
  auto r = post("/v1/completions",
                R"({"model": "fake", "prompt": "Hello pages", "max_tokens": 9, "temperature": 0})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "text_completion");
  ASSERT_EQ(j["choices"].size(), 1u);
  EXPECT_EQ(j["choices"][0]["text"], oracle_text(fakes::fake_encode("Hello pages"), 9));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["prompt_tokens"], 11);
  EXPECT_EQ(j["usage"]["completion_tokens"], 9);
  EXPECT_EQ(j["usage"]["total_tokens"], 20);
  // Token-id prompts work too.
  r = post("/v1/completions",
           R"({"model": "fake", "prompt": [72, 105], "max_tokens": 4, "temperature": 0})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], oracle_text({72, 105}, 4));
  expect_pages_released();
}

TEST_P(ServerTest, ChatMatchesOracleAndStopStringCuts) {
  const std::string body =
      R"({"model": "fake", "messages": [{"role": "system", "content": "Be brief."},
          {"role": "user", "content": "Hi"}], "max_tokens": 12, "temperature": 0})";
  auto r = post("/v1/chat/completions", body);
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["object"], "chat.completion");
  const auto ids = chat_ids({{"system", "Be brief."}, {"user", "Hi"}});
  const std::string expect = oracle_text(ids, 12);
  EXPECT_EQ(j["choices"][0]["message"]["role"], "assistant");
  EXPECT_EQ(j["choices"][0]["message"]["content"], expect);
  // A stop string taken from the middle of the expected text.
  json b = json::parse(body);
  b["stop"] = expect.substr(4, 2);
  r = post("/v1/chat/completions", b.dump());
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["message"]["content"],
            expect.substr(0, expect.find(expect.substr(4, 2))));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  expect_pages_released();
}

// vLLM's stop_token_ids: the output ends at the first of them (not shown), finish_reason "stop";
// what is not an array of vocabulary ids is a 400 that names the field.
TEST_P(ServerTest, StopTokenIdsEndTheOutput) {
  const std::vector<int32_t> oracle = fake_->greedy_oracle(fakes::fake_encode("stop ids"), 12);
  size_t k = 3;  // the first token from the 4th on that did not come before
  while (k < oracle.size() && std::find(oracle.begin(), oracle.begin() + int64_t(k), oracle[k]) !=
                                  oracle.begin() + int64_t(k))
    ++k;
  ASSERT_LT(k, oracle.size());
  const json b = {{"model", "fake"}, {"prompt", "stop ids"}, {"max_tokens", 12},
                  {"temperature", 0}, {"stop_token_ids", {oracle[k]}}};
  auto r = post("/v1/completions", b.dump());
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["text"],
            fakes::fake_decode({oracle.begin(), oracle.begin() + int64_t(k)}));
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  for (const char* bad : {R"("x")", "[-1]", "[1.5]", "[100000000]", "[[1]]"})
    expect_error(post("/v1/completions",
                      std::string(R"({"model": "fake", "prompt": "x", "stop_token_ids": )") + bad +
                          "}"),
                 400, "stop_token_ids", "stop_token_ids");
  expect_pages_released();
}

TEST_P(ServerTest, StreamingEqualsNonStreaming) {
  auto r = post("/v1/completions",
                R"({"model": "fake", "prompt": "stream me", "max_tokens": 20, "temperature": 0,
                    "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_NE(r->get_header_value("Content-Type").find("text/event-stream"), std::string::npos);
  Sse s = parse_sse(r->body);
  EXPECT_TRUE(s.done);
  std::string text;
  std::string finish;
  bool usage_seen = false;
  for (const json& e : s.events) {
    if (e.contains("usage") && !e["usage"].is_null()) {
      usage_seen = true;
      EXPECT_EQ(e["usage"]["completion_tokens"], 20);
      continue;
    }
    text += e["choices"][0]["text"].get<std::string>();
    if (!e["choices"][0]["finish_reason"].is_null()) finish = e["choices"][0]["finish_reason"];
  }
  EXPECT_TRUE(usage_seen);
  EXPECT_EQ(text, oracle_text(fakes::fake_encode("stream me"), 20));
  EXPECT_EQ(finish, "length");

  r = post("/v1/chat/completions",
           R"({"model": "fake", "messages": [{"role": "user", "content": "yo"}], "max_tokens": 7,
               "temperature": 0, "stream": true})");
  ASSERT_EQ(r->status, 200) << r->body;
  s = parse_sse(r->body);
  EXPECT_TRUE(s.done);
  ASSERT_FALSE(s.events.empty());
  EXPECT_EQ(s.events[0]["object"], "chat.completion.chunk");
  EXPECT_EQ(s.events[0]["choices"][0]["delta"]["role"], "assistant");
  text.clear();
  for (const json& e : s.events)
    if (e["choices"][0]["delta"].contains("content"))
      text += e["choices"][0]["delta"]["content"].get<std::string>();
  EXPECT_EQ(text, oracle_text(chat_ids({{"user", "yo"}}), 7));
  EXPECT_EQ(s.events.back()["choices"][0]["finish_reason"], "length");
  expect_pages_released();
}

TEST_P(ServerTest, IgnoreEosRunsToMaxTokens) {
  // The end of sequence wins wherever the history's length is a multiple of 5: after the 2-token
  // prompt, the 4th generated token.
  fake_->eos_every = 5;
  const std::string base = R"({"model": "fake", "prompt": [72, 105], "max_tokens": 12,
                               "temperature": 0)";
  auto r = post("/v1/completions", base + "}");
  ASSERT_EQ(r->status, 200) << r->body;
  json j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "stop");
  EXPECT_EQ(j["usage"]["completion_tokens"], 4);
  EXPECT_EQ(j["choices"][0]["text"], oracle_text({72, 105}, 3));
  r = post("/v1/completions", base + R"(, "ignore_eos": false})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 4);
  // ignore_eos: all 12, past two end-of-sequence tokens, whole and streamed.
  r = post("/v1/completions", base + R"(, "ignore_eos": true})");
  ASSERT_EQ(r->status, 200) << r->body;
  j = json::parse(r->body);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  r = post(
      "/v1/completions",
      base + R"(, "ignore_eos": true, "stream": true, "stream_options": {"include_usage": true}})");
  ASSERT_EQ(r->status, 200) << r->body;
  const Sse s = parse_sse(r->body);
  EXPECT_TRUE(s.done);
  ASSERT_FALSE(s.events.empty());
  ASSERT_TRUE(s.events.back().contains("usage"));
  EXPECT_EQ(s.events.back()["usage"]["completion_tokens"], 12);
  EXPECT_EQ(s.events[s.events.size() - 2]["choices"][0]["finish_reason"], "length");
  // Chat takes it too.
  r = post("/v1/chat/completions", R"({"model": "fake", "messages": [{"role": "user",
           "content": "x"}], "max_tokens": 9, "temperature": 0, "ignore_eos": true})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 9);
  fake_->eos_every = 0;
  expect_pages_released();
}

TEST_P(ServerTest, ParallelSamplingReturnsNChoices) {
  const std::string body =
      R"({"model": "fake", "prompt": "sample", "max_tokens": 6, "n": 3, "seed": 42, "temperature": 1})";
  auto r1 = post("/v1/completions", body);
  auto r2 = post("/v1/completions", body);
  ASSERT_EQ(r1->status, 200) << r1->body;
  json a = json::parse(r1->body), b = json::parse(r2->body);
  ASSERT_EQ(a["choices"].size(), 3u);
  for (int i = 0; i < 3; ++i) EXPECT_EQ(a["choices"][i]["index"], i);
  EXPECT_EQ(a["choices"], b["choices"]);  // same seed, same samples
  EXPECT_EQ(a["usage"]["completion_tokens"], 18);
  expect_pages_released();
}

// Cumulative logprob of a completion text under the fake model (byte tokens), in double.
double oracle_cum_logprob(const FakeModel& m, std::vector<int32_t> history,
                          const std::string& text) {
  std::vector<float> logits(size_t(m.config().vocab_size));
  double cum = 0;
  for (int32_t t : fakes::fake_encode(text)) {
    m.logits_after(history, logits.data());
    double mx = -INFINITY, sum = 0;
    for (float x : logits) mx = std::max(mx, double(x));
    for (float x : logits) sum += std::exp(double(x) - mx);
    cum += double(logits[size_t(t)]) - mx - std::log(sum);
    history.push_back(t);
  }
  return cum;
}

TEST_P(ServerTest, BestOfReturnsTheHighestScoringSamples) {
  const std::string all_body =
      R"({"model": "fake", "prompt": "best", "max_tokens": 6, "n": 5, "best_of": 5, "seed": 9})";
  auto ra = post("/v1/completions", all_body);
  ASSERT_EQ(ra->status, 200) << ra->body;
  const json all = json::parse(ra->body)["choices"];
  ASSERT_EQ(all.size(), 5u);
  const auto prompt = fakes::fake_encode("best");
  std::vector<std::pair<double, std::string>> ranked;
  for (const json& c : all) {
    const std::string t = c["text"];
    ranked.emplace_back(oracle_cum_logprob(*fake_, prompt, t), t);
  }
  std::stable_sort(ranked.begin(), ranked.end(),
                   [](const auto& a, const auto& b) { return a.first > b.first; });
  // Same seed, best_of 5, n 2: the same five candidates, the best two returned, best first.
  auto rb = post("/v1/completions",
                 R"({"model": "fake", "prompt": "best", "max_tokens": 6, "n": 2, "best_of": 5,
                     "seed": 9})");
  ASSERT_EQ(rb->status, 200) << rb->body;
  const json best = json::parse(rb->body)["choices"];
  ASSERT_EQ(best.size(), 2u);
  for (size_t i = 0; i < 2; ++i) {
    EXPECT_EQ(best[i]["index"], int(i));
    EXPECT_EQ(best[i]["text"], ranked[i].second) << "rank " << i;
  }
  expect_pages_released();
}

TEST_P(ServerTest, BeamSearchCompletions) {
  // Width 1 is greedy.
  auto r = post("/v1/completions", R"({"model": "fake", "prompt": "beam", "max_tokens": 7,
                                       "use_beam_search": true, "beam_width": 1})");
  ASSERT_EQ(r->status, 200) << r->body;
  EXPECT_EQ(json::parse(r->body)["choices"][0]["text"], oracle_text(fakes::fake_encode("beam"), 7));
  // best_of as the width (vLLM's legacy API): three beams, best first.
  r = post("/v1/completions", R"({"model": "fake", "prompt": "beam", "max_tokens": 7, "n": 3,
                                  "best_of": 4, "use_beam_search": true, "length_penalty": 0.5})");
  ASSERT_EQ(r->status, 200) << r->body;
  const json choices = json::parse(r->body)["choices"];
  ASSERT_EQ(choices.size(), 3u);
  const auto prompt = fakes::fake_encode("beam");
  double prev = INFINITY;
  for (const json& c : choices) {
    EXPECT_EQ(c["finish_reason"], "length");
    const double s = oracle_cum_logprob(*fake_, prompt, c["text"]) / std::pow(7.0, 0.5);
    EXPECT_LE(s, prev);
    prev = s;
  }
  EXPECT_NE(choices[0]["text"], choices[1]["text"]);
  expect_pages_released();
}

TEST_P(ServerTest, ConcurrentClients) {
  std::vector<std::thread> threads;
  std::vector<std::string> got(12), want(12);
  for (int i = 0; i < 12; ++i) {
    const std::string prompt = "client number " + std::to_string(i);
    want[size_t(i)] = oracle_text(fakes::fake_encode(prompt), 10 + i);
    threads.emplace_back([&, i, prompt] {
      json b = {{"model", "fake"},
                {"prompt", prompt},
                {"max_tokens", 10 + i},
                {"temperature", 0},
                {"stream", i % 2 == 1}};
      auto r = post("/v1/completions", b.dump());
      if (!r || r->status != 200) return;
      if (i % 2 == 0) {
        got[size_t(i)] = json::parse(r->body)["choices"][0]["text"];
      } else {
        for (const json& e : parse_sse(r->body).events)
          got[size_t(i)] += e["choices"][0]["text"].get<std::string>();
      }
    });
  }
  for (auto& t : threads) t.join();
  for (int i = 0; i < 12; ++i) EXPECT_EQ(got[size_t(i)], want[size_t(i)]) << "client " << i;
  expect_pages_released();
}

TEST_P(ServerTest, BadInputGetsOpenAiErrors) {
  const std::string ok_prompt = R"("prompt": "x")";
  expect_error(post("/v1/completions", "{not json"), 400, "", "not valid JSON");
  expect_error(post("/v1/completions", "[1, 2]"), 400, "", "JSON object");
  expect_error(post("/v1/completions", R"({"prompt": "x"})"), 400, "model", "model is required");
  expect_error(post("/v1/completions", R"({"model": 7, "prompt": "x"})"), 400, "model",
               "model must be a string");
  expect_error(post("/v1/completions", R"({"model": "gpt-9", "prompt": "x"})"), 404, "model",
               "gpt-9");
  expect_error(post("/v1/completions", R"({"model": "fake"})"), 400, "prompt",
               "prompt is required");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": 3})"), 400, "prompt",
               "prompt must be");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": [1, 900]})"), 400, "prompt",
               "token ids");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": ""})"), 400, "prompt",
               "empty");
  for (const char* mt : {"0", "-3"})
    expect_error(post("/v1/completions",
                      std::string(R"({"model": "fake", "prompt": "x", "max_tokens": )") + mt + "}"),
                 400, "max_tokens", "max_tokens must be at least 1");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "max_tokens": "ten"})"),
               400, "max_tokens", "integer");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "temperature": "hot"})"),
               400, "temperature", "number");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "temperature": 3})"),
               400, "temperature", "temperature must be in");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "top_p": 0})"), 400,
               "top_p", "top_p");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "n": 0})"), 400, "n",
               "n must be in");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "n": 17})"), 400, "n",
               "n must be in");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "stop": 5})"), 400,
               "stop", "stop must be");
  expect_error(
      post("/v1/completions", R"({"model": "fake", "prompt": "x", "stop": ["a","b","c","d","e"]})"),
      400, "stop", "at most");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "stream": "yes"})"), 400,
               "stream", "boolean");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "seed": 1.5})"), 400,
               "seed", "integer");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "ignore_eos": "yes"})"),
               400, "ignore_eos", "ignore_eos must be a boolean");
  expect_error(post("/v1/chat/completions", R"({"model": "fake", "ignore_eos": 1,
                                                "messages": [{"role": "user", "content": "x"}]})"),
               400, "ignore_eos", "ignore_eos must be a boolean");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "n": 3, "best_of": 2})"),
               400, "best_of", "best_of must be >= n");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "best_of": 17})"), 400,
               "best_of", "best_of must be in");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "best_of": 1.5})"), 400,
               "best_of", "integer");
  expect_error(
      post("/v1/completions", R"({"model": "fake", "prompt": "x", "best_of": 3, "stream": true})"),
      400, "best_of", "stream");
  expect_error(post("/v1/completions",
                    R"({"model": "fake", "prompt": "x", "use_beam_search": true, "stream": true})"),
               400, "use_beam_search", "stream");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "beam_width": 2})"), 400,
               "beam_width", "needs use_beam_search");
  expect_error(
      post("/v1/completions",
           R"({"model": "fake", "prompt": "x", "use_beam_search": true, "beam_width": 9})"),
      400, "beam_width", "beam_width must be in");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "n": 3,
                                           "use_beam_search": true, "beam_width": 2})"),
               400, "beam_width", "must be >= n");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "use_beam_search": 1})"),
               400, "use_beam_search", "boolean");
  expect_error(post("/v1/completions", R"({"model": "fake", "prompt": "x", "use_beam_search": true,
                                           "length_penalty": "long"})"),
               400, "length_penalty", "number");
  json long_prompt = {{"model", "fake"}, {"prompt", std::string(kMaxLen + 10, 'a')}};
  expect_error(post("/v1/completions", long_prompt.dump()), 400, "prompt",
               "maximum context length");
  json too_many = {{"model", "fake"}, {"prompt", std::string(500, 'a')}, {"max_tokens", 100}};
  expect_error(post("/v1/completions", too_many.dump()), 400, "max_tokens",
               "maximum context length");
  expect_error(post("/v1/chat/completions", R"({"model": "fake"})"), 400, "messages",
               "messages is required");
  expect_error(post("/v1/chat/completions", R"({"model": "fake", "messages": []})"), 400,
               "messages", "non-empty");
  expect_error(post("/v1/chat/completions",
                    R"({"model": "fake", "messages": [{"role": "wizard", "content": "x"}]})"),
               400, "messages", "wizard");
  expect_error(post("/v1/chat/completions", R"({"model": "fake", "messages": [{"role": "user"}]})"),
               400, "messages", "content");
  json huge = {{"model", "fake"}, {"prompt", std::string(100 * 1024, 'a')}};
  expect_error(post("/v1/completions", huge.dump()), 413, "", "larger than");
  expect_error(client()->Get("/v1/nothing"), 404, "", "no route");
  // The server still works and holds no pages.
  auto r = post("/v1/completions", R"({"model": "fake", "prompt": "x", "max_tokens": 2})");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
  expect_pages_released();
}

TEST_P(ServerTest, ClientDisconnectMidStreamCancelsAndFreesPages) {
  const double cancelled_before = metric("pagedattn_request_cancelled_total");
  json b = {{"model", "fake"},
            {"prompt", std::string(100, 'q')},
            {"max_tokens", 400},
            {"temperature", 0},
            {"stream", true}};
  auto c = client();
  int chunks = 0;
  httplib::Headers headers;
  auto r = c->Post("/v1/completions", headers, b.dump(), "application/json");
  (void)r;
  // The same with a reader that hangs up after the first chunks.
  std::string body = b.dump();
  httplib::Request req;
  req.method = "POST";
  req.path = "/v1/completions";
  req.headers = {{"Content-Type", "application/json"}};
  req.body = body;
  req.content_receiver = [&](const char*, size_t, uint64_t, uint64_t) { return ++chunks < 3; };
  auto c2 = client();
  auto res = c2->send(req);
  EXPECT_GE(chunks, 3);
  c2.reset();  // hangs up (the destructor closes the socket)
  // The request is cancelled soon after, and its pages are back.
  for (int i = 0; i < 200 && metric("pagedattn_request_cancelled_total") < cancelled_before + 1;
       ++i)
    std::this_thread::sleep_for(std::chrono::milliseconds(25));
  EXPECT_GE(metric("pagedattn_request_cancelled_total"), cancelled_before + 1);
  expect_pages_released();
  // Fewer tokens than the full run: it stopped early (the first, complete request made 400).
  EXPECT_LT(metric("pagedattn_generation_tokens_total"), 2 * 400);
}

INSTANTIATE_TEST_SUITE_P(PrefixCache, ServerTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "on" : "off";
                         });
