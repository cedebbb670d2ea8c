// ServerConfig's limits: the API key, the deadlines of each phase of a request, the connection
// bound, chat's default max_tokens.
#include <gtest/gtest.h>

#include <chrono>
#include <string>
#include <thread>
#include <vector>

#include "server_fixture.h"

using namespace pagedattn;
using namespace pagedattn::testing_server;

namespace {

using Clock = std::chrono::steady_clock;

double since(Clock::time_point t0) {
  return std::chrono::duration<double>(Clock::now() - t0).count();
}

void expect_401(const httplib::Result& r) {
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 401) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_EQ(j["error"]["type"], "invalid_request_error");
  EXPECT_EQ(j["error"]["code"], "invalid_api_key");
  EXPECT_TRUE(j["error"]["message"].is_string());
}

TEST(ServerLimits, ApiKeyGuardsEveryRouteButHealth) {
  FakeServer s(true, [](ServerConfig& c) { c.api_key = "sk-test-123"; });
  auto c = s.client();
  const httplib::Headers good = {{"Authorization", "Bearer sk-test-123"}};
  const std::string body = R"({"model": "fake", "prompt": "x", "max_tokens": 2})";
  EXPECT_EQ(c->Get("/health")->status, 200);
  expect_401(c->Get("/v1/models"));
  expect_401(c->Get("/v1/models/fake"));
  expect_401(c->Get("/metrics"));
  expect_401(c->Post("/v1/completions", body, "application/json"));
  for (const char* bad : {"Bearer sk-test-12", "Bearer sk-test-1234", "Bearer ", "sk-test-123",
                          "Basic c2stdGVzdC0xMjM=", "bearer sk-test-123"})
    expect_401(c->Get("/v1/models", {{"Authorization", bad}}));
  EXPECT_EQ(c->Get("/v1/models", good)->status, 200);
  EXPECT_EQ(c->Get("/metrics", good)->status, 200);
  auto r = c->Post("/v1/completions", good, body, "application/json");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200) << r->body;
  // Refused before its body is read: a body past the limit still gets 401, not 413.
  expect_401(c->Post("/v1/completions", std::string(200 * 1024, 'x'), "application/json"));
  EXPECT_TRUE(s.pages_released(good));
}

TEST(ServerLimits, MetricsCanStayOpen) {
  FakeServer s(true, [](ServerConfig& c) {
    c.api_key = "k";
    c.metrics_without_key = true;
  });
  auto c = s.client();
  EXPECT_EQ(c->Get("/metrics")->status, 200);
  expect_401(c->Get("/v1/models"));
}

// A connection that sends part of its headers and waits is closed at the header deadline; one that
// trickles a byte at a time is closed at it too (each byte would reset a plain read timeout).
TEST(ServerLimits, HeaderDeadlineClosesStalledAndTricklingConnections) {
  FakeServer s(true, [](ServerConfig& c) {
    c.header_timeout_s = 0.5;
    c.idle_timeout_s = 0.5;
  });
  const int stalled = connect_raw(s.port, 4);
  ASSERT_GE(stalled, 0);
  send_raw(stalled, "POST /v1/completions HTTP/1.1\r\nHost: x\r\n");
  auto t0 = Clock::now();
  recv_raw(stalled);  // returns when the server closes (or after 4 s)
  EXPECT_LT(since(t0), 2.0);
  ::close(stalled);

  const int trickle = connect_raw(s.port, 0.2);
  ASSERT_GE(trickle, 0);
  t0 = Clock::now();
  const std::string head =
      "GET /health HTTP/1.1\r\nHost: x\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaa";
  bool closed = false;
  for (size_t i = 0; i < head.size() && since(t0) < 4; ++i) {
    if (!send_raw(trickle, head.substr(i, 1))) {
      closed = true;
      break;
    }
    char b;
    const ssize_t n = ::recv(trickle, &b, 1, 0);  // waits 0.2 s
    if (n == 0) {
      closed = true;
      break;
    }
  }
  EXPECT_TRUE(closed) << "a trickling client was not cut off";
  EXPECT_LT(since(t0), 2.5);
  ::close(trickle);
  // An idle keep-alive connection is closed at the idle timeout.
  const int idle = connect_raw(s.port, 4);
  ASSERT_GE(idle, 0);
  t0 = Clock::now();
  recv_raw(idle);
  EXPECT_LT(since(t0), 2.0);
  ::close(idle);
  EXPECT_EQ(s.client()->Get("/health")->status, 200);
}

TEST(ServerLimits, BodyDeadline) {
  FakeServer s(true, [](ServerConfig& c) { c.body_timeout_s = 0.5; });
  const int fd = connect_raw(s.port, 4);
  ASSERT_GE(fd, 0);
  send_raw(fd,
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"model\"");
  const auto t0 = Clock::now();
  const std::string r = recv_raw(fd);
  ::close(fd);
  EXPECT_LT(since(t0), 2.0);
  EXPECT_EQ(raw_status(r), 400) << r;
}

// One connection more than max_connections gets a 503 at once; a freed slot serves again.
TEST(ServerLimits, ConnectionBound) {
  FakeServer s(true, [](ServerConfig& c) { c.max_connections = 4; });
  std::vector<int> fds;
  for (int i = 0; i < 4; ++i) {
    const int fd = connect_raw(s.port, 4);
    ASSERT_GE(fd, 0);
    send_raw(fd, "GET /health HTTP/1.1\r\nHost: x\r\n");  // half a request: holds its slot
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const int extra = connect_raw(s.port, 4);
  ASSERT_GE(extra, 0);
  const auto t0 = Clock::now();
  const std::string r = recv_raw(extra);
  ::close(extra);
  EXPECT_EQ(raw_status(r), 503) << r;
  EXPECT_LT(since(t0), 1.0);
  EXPECT_EQ(raw_json_body(r)["error"]["code"], "too_many_connections") << r;
  // A health check over the bound is still answered; any other request over it is not.
  const std::pair<const char*, int> asks[] = {
      {"GET /health HTTP/1.1\r\nHost: x\r\n\r\n", 200},
      {"HEAD /health HTTP/1.1\r\nHost: x\r\n\r\n", 200},
      {"GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n", 503},
      {"GET /v1/models HTTP/1.1\r\nHost: x\r\n\r\n", 503}};
  for (const auto& [ask, status] : asks) {
    const int fd = connect_raw(s.port, 4);
    ASSERT_GE(fd, 0);
    send_raw(fd, ask);
    const std::string answer = recv_raw(fd);
    ::close(fd);
    EXPECT_EQ(raw_status(answer), status) << ask << answer;
  }
  // One that stalls in its headers is cut off after a second (the header timeout is 10 s).
  const int stall = connect_raw(s.port, 4);
  ASSERT_GE(stall, 0);
  send_raw(stall, "GET /health HTTP/1.1\r\nHost: x\r\n");
  const auto t1 = Clock::now();
  recv_raw(stall);
  ::close(stall);
  EXPECT_LT(since(t1), 2.5);
  for (int fd : fds) ::close(fd);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  auto h = s.client()->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

TEST(ServerLimits, ChatDefaultMaxTokens) {
  FakeServer s(true, [](ServerConfig& c) { c.default_chat_max_tokens = 20; });
  auto r = s.post("/v1/chat/completions", R"({"model": "fake", "ignore_eos": true,
                  "messages": [{"role": "user", "content": "go on"}]})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["usage"]["completion_tokens"], 20);
  EXPECT_EQ(j["choices"][0]["finish_reason"], "length");
  // Completions keep OpenAI's 16.
  r = s.post("/v1/completions", R"({"model": "fake", "prompt": "x", "ignore_eos": true})");
  ASSERT_TRUE(r);
  EXPECT_EQ(json::parse(r->body)["usage"]["completion_tokens"], 16);
}

TEST(ServerLimits, BadConfigIsRefused) {
  auto engine = std::make_unique<AsyncEngine>(
      std::make_unique<Engine>(std::make_unique<fakes::FakeModel>(64), [] {
        EngineConfig ec;
        ec.kv_cache_tokens = 256;
        ec.log_startup = false;
        return ec;
      }()));
  TextCodec codec{[](const std::string& t) { return fakes::fake_encode(t); }, fake_chat_ids, {}};
  for (auto bad : std::vector<std::function<void(ServerConfig&)>>{
           [](ServerConfig& c) { c.max_connections = 0; },
           [](ServerConfig& c) { c.header_timeout_s = 0; },
           [](ServerConfig& c) { c.io_timeout_s = -1; },
           [](ServerConfig& c) { c.default_chat_max_tokens = 0; },
           [](ServerConfig& c) { c.max_header_bytes = 100; }}) {
    ServerConfig c;
    c.port = 0;
    bad(c);
    EXPECT_THROW(Server(*engine, codec, c), Error);
  }
  engine->stop();
}

}  // namespace
