// The server's connection loop, socket stream and task queue (see http_guard.h).
#include "http_guard.h"

#include <arpa/inet.h>
#include <netinet/in.h>
#include <poll.h>
#include <sys/socket.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <deque>
#include <functional>
#include <string>
#include <thread>
#include <vector>

namespace pagedattn {

namespace {

using Clock = std::chrono::steady_clock;

int ms_until(Clock::time_point t) {
  const auto d = std::chrono::duration_cast<std::chrono::milliseconds>(t - Clock::now()).count();
  return int(std::clamp<int64_t>(d, 0, 1 << 30));
}

int to_ms(double s) { return int(std::clamp(s * 1000.0, 0.0, double(1 << 30))); }

// poll() one socket for events; > 0 when ready, 0 on timeout, < 0 on error (EINTR retried).
int poll_one(int sock, short events, int timeout_ms) {
  const auto until = Clock::now() + std::chrono::milliseconds(timeout_ms);
  for (;;) {
    pollfd p{sock, events, 0};
    const int r = ::poll(&p, 1, ms_until(until));
    if (r < 0 && errno == EINTR) continue;
    if (r > 0 && (p.revents & (POLLERR | POLLNVAL))) return -1;
    return r;
  }
}

// The peer has closed or reset its end: readable with nothing to read, or an error pending (a
// reset socket polls as POLLERR, which poll_one reports as < 0).
bool peer_closed(int sock) {
  const int r = poll_one(sock, POLLIN, 0);
  if (r < 0) return true;
  if (r == 0) return false;
  char c;
  const ssize_t n = ::recv(sock, &c, 1, MSG_PEEK | MSG_DONTWAIT);
  return n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK && errno != EINTR);
}

void address_of(int sock, bool peer, std::string& ip, int& port) {
  sockaddr_storage a{};
  socklen_t len = sizeof(a);
  const int r = peer ? ::getpeername(sock, reinterpret_cast<sockaddr*>(&a), &len)
                     : ::getsockname(sock, reinterpret_cast<sockaddr*>(&a), &len);
  if (r != 0) return;
  char buf[INET6_ADDRSTRLEN] = {};
  if (a.ss_family == AF_INET) {
    const auto* in = reinterpret_cast<const sockaddr_in*>(&a);
    ::inet_ntop(AF_INET, &in->sin_addr, buf, sizeof(buf));
    port = ntohs(in->sin_port);
  } else if (a.ss_family == AF_INET6) {
    const auto* in = reinterpret_cast<const sockaddr_in6*>(&a);
    ::inet_ntop(AF_INET6, &in->sin6_addr, buf, sizeof(buf));
    port = ntohs(in->sin6_port);
  }
  ip = buf;
}

// A whole response the connection layer sends itself (the parser never saw the request), with an
// OpenAI error object; `status` is the status line's code and text, `headers` extra header lines.
// The message names only numbers and fixed words: no JSON escaping needed.
std::string raw_error_response(const std::string& status, const std::string& headers,
                               const std::string& message, const std::string& type,
                               const std::string& code) {
  const std::string body = R"({"error":{"message":")" + message + R"(","type":")" + type +
                           R"(","param":null,"code":")" + code + R"("}})";
  return "HTTP/1.1 " + status + "\r\nContent-Type: application/json\r\n" + headers +
         "Connection: close\r\nContent-Length: " + std::to_string(body.size()) + "\r\n\r\n" +
         body;
}

// The 431 for a request whose line and headers pass `limit` bytes.
std::string header_too_large_response(size_t limit) {
  return raw_error_response(
      "431 Request Header Fields Too Large", "",
      "the request line and headers are larger than " + std::to_string(limit) + " bytes",
      "invalid_request_error", "headers_too_large");
}

// A socket stream whose reads stop at a deadline as well as at a per-read timeout, and, while a
// request's line and headers are read, past a byte limit.
class GuardedStream : public httplib::Stream {
 public:
  GuardedStream(int sock, int io_timeout_ms) : sock_(sock), io_ms_(io_timeout_ms) {}

  void set_deadline(Clock::time_point t) { deadline_ = t; }
  bool has_buffered() const { return off_ < size_; }
  // From here the parser may read `limit` more bytes (the request line and headers); one more
  // read answers 431 itself and refuses every later write, so the parser's own answer (none
  // inside the request line, a 400 inside the headers) never goes out. end_header_limit():
  // unlimited again (the body has its own limit).
  void set_header_limit(size_t limit) { header_limit_ = header_left_ = limit; }
  void end_header_limit() { header_left_ = kUnlimited; }

  bool is_readable() const override {
    if (has_buffered()) return true;
    const int wait = std::min(io_ms_, ms_until(deadline_));
    return wait > 0 && poll_one(sock_, POLLIN, wait) > 0;
  }
  bool is_writable() const override {
    return poll_one(sock_, POLLOUT, io_ms_) > 0 && !peer_closed(sock_);
  }
  ssize_t read(char* ptr, size_t size) override {
    if (header_left_ == 0) {
      refuse_header();
      return -1;
    }
    if (!has_buffered()) {
      if (!is_readable()) return -1;
      ssize_t n;
      do {
        n = ::recv(sock_, buf_, sizeof(buf_), 0);
      } while (n < 0 && errno == EINTR);
      if (n <= 0) return n;
      off_ = 0;
      size_ = size_t(n);
    }
    const size_t k = std::min({size, size_ - off_, header_left_});
    std::memcpy(ptr, buf_ + off_, k);
    off_ += k;
    if (header_left_ != kUnlimited) header_left_ -= k;
    return ssize_t(k);
  }
  ssize_t write(const char* ptr, size_t size) override {
    if (refused_ || !is_writable()) return -1;
    ssize_t n;
    do {
      n = ::send(sock_, ptr, size, MSG_NOSIGNAL);
    } while (n < 0 && errno == EINTR);
    return n;
  }
  void get_remote_ip_and_port(std::string& ip, int& port) const override {
    address_of(sock_, true, ip, port);
  }
  void get_local_ip_and_port(std::string& ip, int& port) const override {
    address_of(sock_, false, ip, port);
  }
  socket_t socket() const override { return sock_; }
  bool refused() const { return refused_; }

 private:
  static constexpr size_t kUnlimited = SIZE_MAX;

  void refuse_header() {
    if (refused_) return;
    refused_ = true;
    const std::string res = header_too_large_response(header_limit_);
    (void)::send(sock_, res.data(), res.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  }

  int sock_;
  int io_ms_;
  size_t header_limit_ = kUnlimited, header_left_ = kUnlimited;
  bool refused_ = false;
  Clock::time_point deadline_ = Clock::time_point::max();
  char buf_[16 * 1024];
  size_t off_ = 0, size_ = 0;
};

thread_local int tl_socket = -1;     // the connection the calling thread serves
thread_local bool tl_close = false;  // close it after this response

// Sends what is left (best effort), then lets the client read it before the socket closes: a close
// with unread input resets the connection, and a reset can destroy the response in flight (a 413
// sent before the body was read).
void lingering_close(int sock) {
  ::shutdown(sock, SHUT_WR);
  const auto until = Clock::now() + std::chrono::seconds(1);
  char buf[16 * 1024];
  size_t drained = 0;
  while (drained < (size_t(4) << 20) &&
         poll_one(sock, POLLIN, std::min(200, ms_until(until))) > 0) {
    const ssize_t n = ::recv(sock, buf, sizeof(buf), MSG_DONTWAIT);
    if (n <= 0) break;
    drained += size_t(n);
  }
  ::close(sock);
}

void reject_busy(int sock) {
  static const std::string res = raw_error_response(
      "503 Service Unavailable", "Retry-After: 1\r\n",
      "the server has too many open connections; retry later", "server_error",
      "too_many_connections");
  (void)::send(sock, res.data(), res.size(), MSG_NOSIGNAL | MSG_DONTWAIT);
  lingering_close(sock);
}

// Whether a connection over the bound asks for GET (or HEAD) /health, from its first bytes, peeked
// at for at most kHealthPeekMs: health checks are answered while stalled connections fill the
// bound, anything else over it gets the 503.
bool asks_for_health(int sock) {
  constexpr int kHealthPeekMs = 250;
  static const std::string kAsks[] = {"GET /health", "HEAD /health"};
  const auto until = Clock::now() + std::chrono::milliseconds(kHealthPeekMs);
  for (;;) {
    char buf[16];
    const ssize_t n = ::recv(sock, buf, sizeof(buf), MSG_PEEK | MSG_DONTWAIT);
    if (n == 0 || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK)) return false;
    bool prefix = n < 0;  // nothing yet
    if (n > 0) {
      const std::string got(buf, size_t(n));
      for (const std::string& a : kAsks) {
        if (got.size() > a.size() && got.compare(0, a.size(), a) == 0)
          return got[a.size()] == ' ' || got[a.size()] == '?';
        if (got.size() <= a.size() && a.compare(0, got.size(), got) == 0) prefix = true;
      }
    }
    if (!prefix || ms_until(until) <= 0) return false;
    // More bytes may come: wait for the first, or a little for the rest (a peek leaves the bytes
    // there, so a poll would return at once).
    if (n < 0) {
      if (poll_one(sock, POLLIN, ms_until(until)) <= 0) return false;
    } else {
      std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
  }
}

struct QueueState {
  std::mutex mu;
  std::condition_variable cv, done_cv;
  std::deque<std::function<void()>> jobs;
  int threads = 0, idle = 0, max_threads = 0;
  bool shutdown = false;
};

void worker(std::shared_ptr<QueueState> s) {
  std::unique_lock<std::mutex> lk(s->mu);
  for (;;) {
    ++s->idle;
    // NOTE: an idle thread lingers a while for the next connection, then exits: the thread count
    // follows the load instead of staying at its peak.
    const bool got = s->cv.wait_for(lk, std::chrono::seconds(30),
                                    [&] { return s->shutdown || !s->jobs.empty(); });
    --s->idle;
    if (s->jobs.empty() && (s->shutdown || !got)) break;
    if (s->jobs.empty()) continue;
    std::function<void()> job = std::move(s->jobs.front());
    s->jobs.pop_front();
    lk.unlock();
    job();
    lk.lock();
  }
  if (--s->threads == 0) s->done_cv.notify_all();
}

class ThreadPerTaskQueue : public httplib::TaskQueue {
 public:
  explicit ThreadPerTaskQueue(int max_threads) : s_(std::make_shared<QueueState>()) {
    s_->max_threads = std::max(1, max_threads);
  }
  ~ThreadPerTaskQueue() override { shutdown(); }

  void enqueue(std::function<void()> fn) override {
    std::lock_guard<std::mutex> lk(s_->mu);
    s_->jobs.push_back(std::move(fn));
    if (s_->idle >= int(s_->jobs.size()) || s_->threads >= s_->max_threads) {
      s_->cv.notify_one();
      return;
    }
    ++s_->threads;
    std::thread(worker, s_).detach();
  }
  void shutdown() override {
    std::unique_lock<std::mutex> lk(s_->mu);
    s_->shutdown = true;
    s_->cv.notify_all();
    s_->done_cv.wait(lk, [&] { return s_->threads == 0; });
  }

 private:
  std::shared_ptr<QueueState> s_;
};

}  // namespace

httplib::TaskQueue* new_thread_per_task_queue(int max_threads) {
  return new ThreadPerTaskQueue(max_threads);
}

GuardedHttpServer::GuardedHttpServer(const HttpLimits& limits) : limits_(limits) {
  // NOTE: a few threads beyond the connection bound answer the connections over it with a 503.
  const int threads = limits_.max_connections + 16;
  new_task_queue = [threads] { return new_thread_per_task_queue(threads); };
}

GuardedHttpServer::~GuardedHttpServer() = default;

bool GuardedHttpServer::client_gone() { return tl_socket >= 0 && peer_closed(tl_socket); }

void GuardedHttpServer::close_after_response(httplib::Response& res) {
  tl_close = true;
  res.set_header("Connection", "close");
}

bool GuardedHttpServer::track(socket_t sock) {
  std::lock_guard<std::mutex> lk(mu_);
  if (int(sockets_.size()) >= limits_.max_connections) return false;
  sockets_.insert(sock);
  open_ = int(sockets_.size());
  return true;
}

void GuardedHttpServer::untrack(socket_t sock) {
  std::lock_guard<std::mutex> lk(mu_);
  sockets_.erase(sock);
  open_ = int(sockets_.size());
}

void GuardedHttpServer::widen_backlog() {
  // NOTE: listen() again on a listening socket changes its backlog (Linux).
  if (svr_sock_ != INVALID_SOCKET) ::listen(svr_sock_, std::max(limits_.max_connections, 128));
}

void GuardedHttpServer::shutdown_connections() {
  std::lock_guard<std::mutex> lk(mu_);
  for (socket_t s : sockets_) ::shutdown(s, SHUT_RDWR);
}

bool GuardedHttpServer::process_and_close_socket(socket_t sock) {
  // Over the bound, one health check is still answered (on one of the threads past the bound).
  const bool tracked = track(sock);
  if (!tracked && !asks_for_health(sock)) {
    reject_busy(sock);
    return false;
  }
  GuardedStream strm(sock, to_ms(limits_.io_timeout_s));
  tl_socket = sock;
  bool ret = false;
  for (size_t left = tracked ? keep_alive_max_count_ : 1; left > 0 && svr_sock_ != INVALID_SOCKET;
       --left) {
    // A request must start within the idle timeout (a pipelined one may be buffered already).
    if (!strm.has_buffered() &&
        (poll_one(sock, POLLIN, to_ms(limits_.idle_timeout_s)) <= 0 || peer_closed(sock)))
      break;
    // A health check over the bound has a second for its headers: the threads past the bound
    // also answer the other connections over it.
    const int header_ms = tracked ? to_ms(limits_.header_timeout_s)
                                  : std::min(to_ms(limits_.header_timeout_s), 1000);
    strm.set_deadline(Clock::now() + std::chrono::milliseconds(header_ms));
    strm.set_header_limit(limits_.max_header_bytes);
    bool closed = false;
    ret = process_request(strm, left == 1, closed, [&](httplib::Request&) {
      strm.end_header_limit();
      strm.set_deadline(Clock::now() + std::chrono::milliseconds(to_ms(limits_.body_timeout_s)));
    });
    strm.end_header_limit();
    strm.set_deadline(Clock::time_point::max());
    if (!ret || closed || tl_close || strm.refused()) break;
  }
  tl_socket = -1;
  tl_close = false;
  // Untracked before the close: shutdown_connections() never touches a closed (reused) number.
  if (tracked) untrack(sock);
  lingering_close(sock);
  return ret;
}

}  // namespace pagedattn
