// The HTTP connection layer under the OpenAI routes: cpp-httplib's request parsing and routing,
// with this server's own connection handling around it, which bounds what a client can hold.
//
//   - a thread per connection, created on demand: a stalled or slow connection holds its own thread
//     only, never one that /health needs;
//   - at most max_connections connections at once: one more is answered 503 and closed at once;
//   - deadlines: a new or kept-alive connection must start a request within idle_timeout; the
//     request line and headers must arrive within header_timeout of its first byte, and the body
//     within body_timeout of the end of the headers (a client trickling a byte at a time is cut off
//     too); each read and write waits at most io_timeout;
//   - the request line and headers together stop at max_header_bytes with a 431 (cpp-httplib 0.11
//     bounds each header line, not their number: a client could fill memory for header_timeout).
//
// NOTE: cpp-httplib 0.11 (Debian 12) reads every request on a pool of a fixed size with a per-read
// timeout only: ~70 half-sent requests held all 64 workers. It lets a subclass replace its
// per-connection loop (process_and_close_socket) and keeps the parser (process_request), so the
// loop, the socket stream and the task queue are ours, and the parser is theirs.
#pragma once

#include <httplib.h>

#include <atomic>
#include <chrono>
#include <cstddef>
#include <memory>
#include <mutex>
#include <set>

namespace pagedattn {

struct HttpLimits {
  int max_connections = 512;
  double idle_timeout_s = 5;     // waiting for a request to start
  double header_timeout_s = 10;  // first byte of a request -> end of its headers
  double body_timeout_s = 30;    // end of headers -> end of body
  double io_timeout_s = 10;      // one read or write making no progress
  size_t max_header_bytes = 64 * 1024;  // request line and headers, together
};

class GuardedHttpServer : public httplib::Server {
 public:
  explicit GuardedHttpServer(const HttpLimits& limits);
  ~GuardedHttpServer() override;

  // Whether the client of the calling handler's connection has gone (closed or reset its end).
  // False outside a handler.
  static bool client_gone();
  // Closes the calling handler's connection once its response is sent (a body left unread would
  // otherwise be parsed as the next request).
  static void close_after_response(httplib::Response& res);
  // After bind: a listen backlog of max_connections (httplib's is 5: a burst of connections waits
  // for SYN retransmits, seconds).
  void widen_backlog();
  // Shuts down every open connection (stop(): stalled ones end at once, not at their timeout).
  void shutdown_connections();
  int open_connections() const { return open_.load(); }

 private:
  bool process_and_close_socket(socket_t sock) override;
  bool track(socket_t sock);
  void untrack(socket_t sock);

  HttpLimits limits_;
  std::atomic<int> open_{0};
  std::mutex mu_;
  std::set<socket_t> sockets_;  // open connections (guarded by mu_)
};

// A task queue that runs each task on a thread of its own, reusing idle threads; at most
// max_threads at once (later tasks wait for one to come free).
httplib::TaskQueue* new_thread_per_task_queue(int max_threads);

}  // namespace pagedattn
