// An in-process server over the fake model and the byte-level fake tokenizer, on an ephemeral
// loopback port, with raw-socket helpers for clients that misbehave.
#pragma once

#include <arpa/inet.h>
#include <gtest/gtest.h>
#include <httplib.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <chrono>
#include <csignal>
#include <functional>
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <thread>
#include <vector>

#include "engine/fake_model.h"
#include "pagedattn/server.h"

namespace pagedattn::testing_server {

using nlohmann::json;

inline std::vector<int32_t> fake_chat_ids(const std::vector<ChatMessage>& msgs) {
  std::string text;
  for (const ChatMessage& m : msgs) text += "<" + m.role + ">" + m.content + "\n";
  return fakes::fake_encode(text + "<assistant>");
}

class FakeServer {
 public:
  static constexpr int32_t kVocab = 128;
  static constexpr int32_t kMaxLen = 512;

  // configure: adjusts the server's config (the fixture sets host, port, model name, body limit).
  explicit FakeServer(bool prefix_cache, const std::function<void(ServerConfig&)>& configure = {}) {
    std::signal(SIGPIPE, SIG_IGN);
    // Token 0 is the end of sequence: never chosen unless a test sets fake->eos_every.
    auto model = std::make_unique<fakes::FakeModel>(kVocab, std::vector<int32_t>{0}, kMaxLen);
    model->step_delay = std::chrono::microseconds(500);
    fake = model.get();
    EngineConfig ec;
    ec.kv_cache_tokens = 2048;
    ec.page_size = 16;
    ec.max_num_batched_tokens = 256;
    ec.enable_prefix_cache = prefix_cache;
    ec.log_startup = false;
    engine = std::make_unique<AsyncEngine>(
        std::make_unique<Engine>(std::move(model), ec, fakes::fake_decode));
    TextCodec codec;
    codec.encode = [](const std::string& t) { return fakes::fake_encode(t); };
    codec.encode_chat = fake_chat_ids;
    codec.decode = fakes::fake_decode;
    ServerConfig sc;
    sc.host = "127.0.0.1";
    sc.port = 0;
    sc.model_name = "fake";
    sc.max_body_bytes = 64 * 1024;
    if (configure) configure(sc);
    server = std::make_unique<Server>(*engine, codec, sc);
    port = server->start();
  }
  ~FakeServer() {
    engine->stop();
    server->stop();
  }

  std::unique_ptr<httplib::Client> client(double read_timeout_s = 20) const {
    auto c = std::make_unique<httplib::Client>("127.0.0.1", port);
    c->set_connection_timeout(5, 0);
    c->set_read_timeout(std::chrono::milliseconds(int64_t(read_timeout_s * 1000)));
    c->set_write_timeout(5, 0);
    return c;
  }
  httplib::Result post(const std::string& path, const std::string& body) const {
    return client()->Post(path.c_str(), body, "application/json");
  }
  // A metric's value from /metrics (-1 when absent).
  double metric(const std::string& name, const httplib::Headers& headers = {}) const {
    auto r = client()->Get("/metrics", headers);
    if (!r || r->status != 200) return -1;
    const std::string& b = r->body;
    const size_t at = b.find("\n" + name + "{");
    if (at == std::string::npos) return -1;
    return std::stod(b.substr(b.find("} ", at) + 2));
  }
  // Waits (bounded) until no page is used and no request is active.
  bool pages_released(const httplib::Headers& headers = {}) const {
    for (int i = 0; i < 200; ++i) {
      if (metric("pagedattn_kv_pages_used", headers) == 0 &&
          metric("pagedattn_num_requests_active", headers) == 0)
        return true;
      std::this_thread::sleep_for(std::chrono::milliseconds(25));
    }
    return false;
  }
  std::string oracle_text(const std::vector<int32_t>& prompt, int32_t n) const {
    return fakes::fake_decode(fake->greedy_oracle(prompt, n));
  }

  fakes::FakeModel* fake = nullptr;
  std::unique_ptr<AsyncEngine> engine;
  std::unique_ptr<Server> server;
  int port = 0;
};

// A blocking loopback socket to the server (-1 on failure); reads time out after timeout_s.
inline int connect_raw(int port, double timeout_s = 5) {
  const int fd = ::socket(AF_INET, SOCK_STREAM, 0);
  if (fd < 0) return -1;
  sockaddr_in a{};
  a.sin_family = AF_INET;
  a.sin_port = htons(uint16_t(port));
  a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
  timeval tv{};
  tv.tv_sec = time_t(timeout_s);
  tv.tv_usec = suseconds_t((timeout_s - double(tv.tv_sec)) * 1e6);
  ::setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
  ::setsockopt(fd, SOL_SOCKET, SO_SNDTIMEO, &tv, sizeof(tv));
  if (::connect(fd, reinterpret_cast<sockaddr*>(&a), sizeof(a)) != 0) {
    ::close(fd);
    return -1;
  }
  return fd;
}

// Sends what it can (the server may stop reading and close): true when all of it went.
inline bool send_raw(int fd, const std::string& s) {
  size_t off = 0;
  while (off < s.size()) {
    const ssize_t n = ::send(fd, s.data() + off, s.size() - off, MSG_NOSIGNAL);
    if (n <= 0) return false;
    off += size_t(n);
  }
  return true;
}

// Everything the server sends until it closes or goes quiet for the socket's read timeout.
inline std::string recv_raw(int fd) {
  std::string out;
  char buf[4096];
  for (;;) {
    const ssize_t n = ::recv(fd, buf, sizeof(buf), 0);
    if (n <= 0) break;
    out.append(buf, size_t(n));
  }
  return out;
}

// The status code of a raw HTTP response (0 when there is none).
inline int raw_status(const std::string& response) {
  if (response.rfind("HTTP/1.1 ", 0) != 0 || response.size() < 12) return 0;
  return std::stoi(response.substr(9, 3));
}

inline json raw_json_body(const std::string& response) {
  const size_t at = response.find("\r\n\r\n");
  if (at == std::string::npos) return json();
  return json::parse(response.substr(at + 4), nullptr, false);
}

}  // namespace pagedattn::testing_server
