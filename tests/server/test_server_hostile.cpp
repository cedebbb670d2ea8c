// The server against clients that misbehave: bodies past the limit however framed, connections
// that stall, clients that leave before their answer, wrong methods, malformed HTTP.
#include <gtest/gtest.h>

#include <chrono>
#include <functional>
#include <string>
#include <thread>
#include <vector>

#include "server_fixture.h"

using namespace pagedattn;
using namespace pagedattn::testing_server;

namespace {

std::string chunked(const std::string& body, size_t chunk) {
  std::string out;
  char size[32];
  for (size_t i = 0; i < body.size(); i += chunk) {
    const size_t n = std::min(chunk, body.size() - i);
    std::snprintf(size, sizeof(size), "%zx\r\n", n);
    out += size + body.substr(i, n) + "\r\n";
  }
  return out + "0\r\n\r\n";
}

std::string big_completion_body(size_t bytes) {
  return json{{"model", "fake"}, {"prompt", std::string(bytes, 'a')}, {"max_tokens", 1}}.dump();
}

// A response's error message (empty when it has none).
std::string error_message(const std::string& raw) {
  const json j = raw_json_body(raw);
  if (!j.is_object() || !j.contains("error")) return "";
  return j["error"]["message"].get<std::string>();
}

class HostileTest : public ::testing::TestWithParam<bool> {};

TEST_P(HostileTest, ChunkedBodyStopsAtTheLimitWith413) {
  FakeServer s(GetParam());
  const int fd = connect_raw(s.port);
  ASSERT_GE(fd, 0);
  send_raw(fd,
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Transfer-Encoding: chunked\r\n\r\n" +
               chunked(big_completion_body(256 * 1024), 4096));
  const std::string r = recv_raw(fd);
  ::close(fd);
  EXPECT_EQ(raw_status(r), 413) << r.substr(0, 300);
  EXPECT_NE(error_message(r).find("larger than 65536 bytes"), std::string::npos) << r;
  // A small chunked body is read and answered.
  const int fd2 = connect_raw(s.port);
  ASSERT_GE(fd2, 0);
  send_raw(fd2,
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Connection: close\r\nTransfer-Encoding: chunked\r\n\r\n" +
               chunked(R"({"model": "fake", "prompt": "chunks", "max_tokens": 3})", 7));
  const std::string r2 = recv_raw(fd2);
  ::close(fd2);
  EXPECT_EQ(raw_status(r2), 200) << r2;
  EXPECT_TRUE(s.pages_released());
}

TEST_P(HostileTest, BodyWithoutLengthStopsAtTheLimitWith413) {
  FakeServer s(GetParam());
  const int fd = connect_raw(s.port);
  ASSERT_GE(fd, 0);
  send_raw(fd,
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
           "Connection: close\r\n\r\n" +
               big_completion_body(256 * 1024));
  ::shutdown(fd, SHUT_WR);
  const std::string r = recv_raw(fd);
  ::close(fd);
  EXPECT_EQ(raw_status(r), 413) << r.substr(0, 300);
  EXPECT_TRUE(s.pages_released());
}

// A request with a body to a route that takes none, or an unknown route: refused before the body
// is read, however large, and the connection closes.
TEST_P(HostileTest, BodiesWhereNoneBelongsAreNotRead) {
  FakeServer s(GetParam());
  for (const char* head : {"POST /v1/nothing HTTP/1.1", "GET /health HTTP/1.1"}) {
    const int fd = connect_raw(s.port);
    ASSERT_GE(fd, 0);
    send_raw(fd, std::string(head) + "\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n" +
                     chunked(std::string(512 * 1024, 'z'), 8192));
    const std::string r = recv_raw(fd);
    ::close(fd);
    EXPECT_GE(raw_status(r), 400) << head << ": " << r.substr(0, 300);
    EXPECT_LT(raw_status(r), 500) << head;
    EXPECT_NE(raw_status(r), 413) << head;
  }
  auto h = s.client()->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
}

// Connections that send half a request and wait hold their own threads, not /health's: it answers
// at once with more of them open than the old fixed pool of 64 workers, and with generation
// running.
TEST_P(HostileTest, StalledConnectionsLeaveHealthAnswering) {
  FakeServer s(GetParam());
  s.fake->step_delay = std::chrono::milliseconds(5);
  std::thread gen([&] {
    s.post("/v1/completions",
           R"({"model": "fake", "prompt": "busy", "max_tokens": 200, "ignore_eos": true})");
  });
  std::vector<int> fds;
  for (int i = 0; i < 80; ++i) {
    const int fd = connect_raw(s.port);
    ASSERT_GE(fd, 0);
    send_raw(fd, i % 2 ? "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 100\r\n\r\n{"
                       : "GET /health HTTP/1.1\r\nHost: x\r\n");
    fds.push_back(fd);
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(200));
  const auto t0 = std::chrono::steady_clock::now();
  auto h = s.client(3.0)->Get("/health");
  EXPECT_TRUE(h) << "no answer from /health with 80 stalled connections";
  if (h) EXPECT_EQ(h->status, 200);
  EXPECT_LT(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), 2.0);
  for (int fd : fds) ::close(fd);
  gen.join();
  EXPECT_TRUE(s.pages_released());
}

// The request of 400 tokens (8 s) sent at t0 is cancelled within 3 s of it (the count of
// cancelled requests past `before`), its pages and batch slot freed.
void expect_cancelled_soon(FakeServer& s, double before,
                           std::chrono::steady_clock::time_point t0) {
  bool seen = false;
  while (std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3)) {
    if (s.metric("pagedattn_request_cancelled_total") >= before + 1) {
      seen = true;
      break;
    }
    std::this_thread::sleep_for(std::chrono::milliseconds(20));
  }
  EXPECT_TRUE(seen) << "the abandoned request was not cancelled within 3 s";
  EXPECT_EQ(s.metric("pagedattn_num_requests_active"), 0);
  EXPECT_EQ(s.metric("pagedattn_kv_pages_used"), 0);
  EXPECT_LT(s.metric("pagedattn_generation_tokens_total"), 300);
}

// A client that gives up on a non-streamed request cancels it: its pages and batch slot are freed
// soon after, not when the generation would have ended.
TEST_P(HostileTest, NonStreamedRequestIsCancelledWhenTheClientLeaves) {
  FakeServer s(GetParam());
  s.fake->step_delay = std::chrono::milliseconds(20);  // 400 tokens: 8 s
  const double cancelled = s.metric("pagedattn_request_cancelled_total");
  const auto t0 = std::chrono::steady_clock::now();
  auto r = s.client(0.4)->Post(
      "/v1/completions",
      R"({"model": "fake", "prompt": "long", "max_tokens": 400, "ignore_eos": true})",
      "application/json");
  EXPECT_FALSE(r);  // the client timed out and closed its connection
  expect_cancelled_soon(s, cancelled, t0);
}

// The same when the client resets its connection (a close with SO_LINGER 0: the server's socket
// then polls as an error, not as readable with nothing to read).
TEST_P(HostileTest, NonStreamedRequestIsCancelledWhenTheClientResets) {
  FakeServer s(GetParam());
  s.fake->step_delay = std::chrono::milliseconds(20);  // 400 tokens: 8 s
  const double cancelled = s.metric("pagedattn_request_cancelled_total");
  const int fd = connect_raw(s.port);
  ASSERT_GE(fd, 0);
  const std::string body =
      R"({"model": "fake", "prompt": "long", "max_tokens": 400, "ignore_eos": true})";
  send_raw(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
               "Content-Length: " +
                   std::to_string(body.size()) + "\r\n\r\n" + body);
  const auto t0 = std::chrono::steady_clock::now();
  while (s.metric("pagedattn_num_requests_active") < 1 &&
         std::chrono::steady_clock::now() - t0 < std::chrono::seconds(3))
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
  ASSERT_EQ(s.metric("pagedattn_num_requests_active"), 1);
  const linger reset{1, 0};
  ASSERT_EQ(::setsockopt(fd, SOL_SOCKET, SO_LINGER, &reset, sizeof(reset)), 0);
  ::close(fd);
  expect_cancelled_soon(s, cancelled, t0);
}

// Framing a proxy could read otherwise (request smuggling): bytes after a malformed chunk are
// never served as a request of their own, and both lengths or two different lengths are a 400.
TEST_P(HostileTest, AmbiguousFramingIsNeverReadAsAnotherRequest) {
  FakeServer s(GetParam());
  const std::string completions = "POST /v1/completions HTTP/1.1\r\nHost: x\r\n";
  const std::string smuggled = "GET /v1/models HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n";
  const std::string body = R"({"model": "fake", "prompt": "hi", "max_tokens": 1})";
  const std::string len = "Content-Length: " + std::to_string(body.size()) + "\r\n";
  const std::vector<std::string> requests = {
      completions + "Transfer-Encoding: chunked\r\n\r\n3\r\nabcX\r\n" + smuggled,
      completions + len + "Transfer-Encoding: chunked\r\n\r\n" + body + smuggled,
      completions + len + "Content-Length: 5\r\n\r\n" + body + smuggled,
      // Lengths that are not 1*DIGIT (httplib read "abc" as 0, "1e3" as 1, "-5" wrapped).
      completions + "Content-Length: abc\r\n\r\n" + smuggled,
      completions + "Content-Length: +0\r\n\r\n" + smuggled,
      completions + "Content-Length: 0x10\r\n\r\n" + smuggled,
      completions + "Content-Length: 1e3\r\n\r\n" + smuggled,
      completions + "Content-Length: -5\r\n\r\n" + smuggled,
  };
  for (const std::string& raw : requests) {
    const int fd = connect_raw(s.port);
    ASSERT_GE(fd, 0);
    send_raw(fd, raw);
    const std::string r = recv_raw(fd);  // until the server closes
    ::close(fd);
    EXPECT_EQ(raw_status(r), 400) << r.substr(0, 300);
    EXPECT_EQ(r.find("\"object\":\"list\""), std::string::npos)
        << "the smuggled request ran: " << r;
    EXPECT_EQ(r.find("HTTP/1.1 ", 1), std::string::npos) << "a second response: " << r;
  }
  // Equal lengths twice, and a well-formed chunked body, are fine.
  for (const std::string& raw :
       {completions + len + len + "Connection: close\r\n\r\n" + body,
        completions + "Transfer-Encoding: chunked\r\n\r\n" + chunked(body, 7)}) {
    const int fd = connect_raw(s.port);
    ASSERT_GE(fd, 0);
    send_raw(fd, raw);
    const std::string r = recv_raw(fd);
    ::close(fd);
    EXPECT_EQ(raw_status(r), 200) << r.substr(0, 300);
  }
  EXPECT_TRUE(s.pages_released());
}

// A declared Content-Length past the limit is a 413 at once, before any of the body is sent (not
// after io_timeout, waiting for a body the client will not send before its answer).
TEST_P(HostileTest, DeclaredLengthPastTheLimitIs413AtOnce) {
  FakeServer s(GetParam(), [](ServerConfig& c) { c.io_timeout_s = 30; });
  for (const std::string length : {"65537", "1000000000000", "99999999999999999999999"}) {
    const int fd = connect_raw(s.port, 10);
    ASSERT_GE(fd, 0);
    const auto t0 = std::chrono::steady_clock::now();
    send_raw(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nContent-Type: application/json\r\n"
                 "Content-Length: " + length + "\r\n\r\n{\"model\"");
    const std::string r = recv_raw(fd);
    ::close(fd);
    EXPECT_EQ(raw_status(r), 413) << length << ": " << r.substr(0, 300);
    EXPECT_NE(error_message(r).find("larger than 65536 bytes"), std::string::npos) << r;
    EXPECT_LT(std::chrono::steady_clock::now() - t0, std::chrono::seconds(5)) << length;
  }
  // The limit itself is fine: a body of exactly 65536 bytes is read (and is bad JSON here).
  const int fd = connect_raw(s.port);
  ASSERT_GE(fd, 0);
  send_raw(fd, "POST /v1/completions HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
               "Content-Length: 65536\r\n\r\n" + std::string(65536, ' '));
  const std::string r = recv_raw(fd);
  ::close(fd);
  EXPECT_EQ(raw_status(r), 400) << r.substr(0, 300);
  EXPECT_TRUE(s.pages_released());
}

// A second server on a port that one already listens on fails to start, saying why (with
// SO_REUSEPORT it started, and the kernel split the connections between the two).
TEST(HostilePort, ASecondServerOnTheSamePortFailsToStart) {
  FakeServer first(false);
  try {
    FakeServer second(false, [&](ServerConfig& c) { c.port = first.port; });
    ADD_FAILURE() << "a second server started on port " << first.port;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("in use"), std::string::npos) << e.what();
  }
  auto r = first.client()->Get("/health");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 200);
}

TEST_P(HostileTest, WrongMethodOnAKnownRouteIs405) {
  FakeServer s(GetParam());
  auto c = s.client();
  const std::vector<std::function<httplib::Result()>> calls = {
      [&] { return c->Get("/v1/completions"); }, [&] { return c->Get("/v1/chat/completions"); },
      [&] { return c->Post("/health", "", "text/plain"); }, [&] { return c->Delete("/v1/models"); },
      [&] { return c->Put("/v1/models/fake", "", "text/plain"); }};
  for (const auto& call : calls) {
    const httplib::Result r = call();
    ASSERT_TRUE(r);
    EXPECT_EQ(r->status, 405) << r->body;
    const json j = json::parse(r->body, nullptr, false);
    ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
    EXPECT_NE(j["error"]["message"].get<std::string>().find("not allowed"), std::string::npos);
    EXPECT_FALSE(r->get_header_value("Allow").empty());
  }
  auto nf = c->Get("/v1/nothing");
  ASSERT_TRUE(nf);
  EXPECT_EQ(nf->status, 404);
}

TEST_P(HostileTest, ModelsRetrieve) {
  FakeServer s(GetParam());
  auto r = s.client()->Get("/v1/models/fake");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  const json j = json::parse(r->body);
  EXPECT_EQ(j["id"], "fake");
  EXPECT_EQ(j["object"], "model");
  EXPECT_TRUE(j["created"].is_number_integer());
  EXPECT_EQ(j["owned_by"], "pagedattn");
  r = s.client()->Get("/v1/models/gpt-9");
  ASSERT_TRUE(r);
  EXPECT_EQ(r->status, 404) << r->body;
  EXPECT_EQ(json::parse(r->body)["error"]["code"], "model_not_found");
}

// What the HTTP layer refuses itself says what is wrong, in OpenAI's error format.
TEST_P(HostileTest, HttpLayerErrorsSayWhatIsWrong) {
  FakeServer s(GetParam());
  const int fd = connect_raw(s.port);
  ASSERT_GE(fd, 0);
  send_raw(fd, "THIS IS NOT HTTP\r\n\r\n");
  const std::string r = recv_raw(fd);
  ::close(fd);
  EXPECT_EQ(raw_status(r), 400) << r;
  EXPECT_NE(error_message(r).find("malformed"), std::string::npos) << r;
  // A broken chunked encoding.
  const int fd2 = connect_raw(s.port);
  ASSERT_GE(fd2, 0);
  send_raw(fd2,
           "POST /v1/completions HTTP/1.1\r\nHost: x\r\nTransfer-Encoding: chunked\r\n\r\n"
           "zz\r\nhello\r\n0\r\n\r\n");
  const std::string r2 = recv_raw(fd2);
  ::close(fd2);
  EXPECT_EQ(raw_status(r2), 400) << r2;
  EXPECT_NE(error_message(r2).find("body could not be read"), std::string::npos) << r2;
}

// `count` header lines of `width` bytes each ("X-Pad-<i>: aaa...").
std::string pad_headers(int count, size_t width) {
  std::string out;
  for (int i = 0; i < count; ++i) {
    std::string line = "X-Pad-" + std::to_string(i) + ": ";
    line += std::string(width > line.size() + 2 ? width - line.size() - 2 : 1, 'a');
    out += line + "\r\n";
  }
  return out;
}

// The request line and headers together stop at max_header_bytes with a 431 in OpenAI's format
// (cpp-httplib bounds each header line only): however many lines, or one long request line. Just
// under the limit is served; the connection is closed after the 431; the server goes on.
TEST_P(HostileTest, HeadersStopAtTheLimitWith431) {
  FakeServer s(GetParam());  // the default limit, 65536 bytes
  auto raw = [&](const std::string& request) {
    const int fd = connect_raw(s.port);
    EXPECT_GE(fd, 0);
    if (fd < 0) return std::string();
    send_raw(fd, request);
    std::string r = recv_raw(fd);
    ::close(fd);
    return r;
  };
  // 2000 header lines of 100 bytes (200 KB), each far under the per-line bound.
  std::string r = raw("GET /health HTTP/1.1\r\nHost: x\r\n" + pad_headers(2000, 100) + "\r\n");
  EXPECT_EQ(raw_status(r), 431) << r.substr(0, 300);
  EXPECT_NE(error_message(r).find("larger than 65536 bytes"), std::string::npos) << r;
  EXPECT_NE(r.find("\"code\":\"headers_too_large\""), std::string::npos) << r;
  // One request line of 100 KB (the parser alone would close without an answer).
  r = raw("GET /" + std::string(100 * 1024, 'a') + " HTTP/1.1\r\nHost: x\r\n\r\n");
  EXPECT_EQ(raw_status(r), 431) << r.substr(0, 300);
  // 40 KB of headers: served.
  r = raw("GET /health HTTP/1.1\r\nHost: x\r\nConnection: close\r\n" + pad_headers(40, 1000) +
          "\r\n");
  EXPECT_EQ(raw_status(r), 200) << r.substr(0, 300);
  // A request on a kept-alive connection gets the whole limit again.
  const int fd = connect_raw(s.port);
  ASSERT_GE(fd, 0);
  const std::string one = "GET /health HTTP/1.1\r\nHost: x\r\n" + pad_headers(40, 1000) + "\r\n";
  send_raw(fd, one + one.substr(0, one.size() - 2) + "Connection: close\r\n\r\n");
  r = recv_raw(fd);
  ::close(fd);
  EXPECT_EQ(raw_status(r), 200) << r.substr(0, 300);
  EXPECT_NE(r.find("HTTP/1.1 200", r.find("\r\n\r\n")), std::string::npos)
      << "the second request was not served: " << r.substr(0, 600);
  auto h = s.client()->Get("/health");
  ASSERT_TRUE(h);
  EXPECT_EQ(h->status, 200);
  EXPECT_TRUE(s.pages_released());
}

// The limit is the server's setting.
TEST(HostileHeaders, LimitFollowsTheConfig) {
  FakeServer s(false, [](ServerConfig& c) { c.max_header_bytes = 4096; });
  const int fd = connect_raw(s.port);
  ASSERT_GE(fd, 0);
  send_raw(fd, "GET /health HTTP/1.1\r\nHost: x\r\n" + pad_headers(10, 500) + "\r\n");
  const std::string r = recv_raw(fd);
  ::close(fd);
  EXPECT_EQ(raw_status(r), 431) << r.substr(0, 300);
  EXPECT_NE(error_message(r).find("larger than 4096 bytes"), std::string::npos) << r;
}

// finish_reason is one of OpenAI's values, also for a request the server ends (shutdown).
TEST_P(HostileTest, CancelledStreamEndsWithAnOpenAiFinishReason) {
  FakeServer s(GetParam());
  s.fake->step_delay = std::chrono::milliseconds(10);
  std::string body;
  std::thread t([&] {
    auto r = s.post("/v1/completions", R"({"model": "fake", "prompt": "x", "max_tokens": 400,
                                           "ignore_eos": true, "stream": true})");
    if (r) body = r->body;
  });
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  s.engine->stop();  // ends every request as cancelled
  t.join();
  std::string finish;
  for (size_t at = body.find("\"finish_reason\":\""); at != std::string::npos;
       at = body.find("\"finish_reason\":\"", at + 1))
    finish = body.substr(at + 17, body.find('"', at + 17) - at - 17);
  EXPECT_TRUE(finish == "stop" || finish == "length") << "finish_reason '" << finish << "'";
  EXPECT_EQ(body.find("abort"), std::string::npos);
}

TEST_P(HostileTest, PrefixCacheQueriesCountOnlyWithTheCacheOn) {
  FakeServer s(GetParam());
  auto r = s.post("/v1/completions", R"({"model": "fake", "prompt": "count me", "max_tokens": 2})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200);
  const double queries = s.metric("pagedattn_prefix_cache_queries_total");
  if (GetParam())
    EXPECT_GT(queries, 0);
  else
    EXPECT_EQ(queries, 0);
}

INSTANTIATE_TEST_SUITE_P(PrefixCache, HostileTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "on" : "off";
                         });

}  // namespace
