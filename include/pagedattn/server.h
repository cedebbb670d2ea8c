// The OpenAI-compatible HTTP server over an AsyncEngine.
//
//   POST /v1/completions, /v1/chat/completions (stream: server-sent events ending in [DONE])
//   GET  /v1/models (with max_model_len and vocab_size), /v1/models/{id}, /health, /metrics
// Bad input gets an OpenAI-style error {"error": {"message", "type", "param", "code"}} with a 4xx
// status and a message naming the field (a wrong method on a known route: 405). A client that
// disconnects, streamed or not, cancels its request (pages freed at once). Hostile clients are
// bounded by ServerConfig's limits: body size, connections, and deadlines for each phase.
// /v1/completions also takes best_of (the n best of best_of samples by cumulative logprob) and
// use_beam_search with beam_width (else best_of, else n) and length_penalty; neither streams. Both
// take vLLM's extensions ignore_eos (generate max_tokens tokens past any end-of-sequence token) and
// cache_salt (prefix-cache pages shared only by requests with the same salt).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "pagedattn/async_engine.h"
#include "pagedattn/chat_template.h"

namespace pagedattn {

// The server's view of a tokenizer.
struct TextCodec {
  // Prompt text -> ids (BOS added where the vocabulary asks for it).
  std::function<std::vector<int32_t>(const std::string&)> encode;
  // Conversation -> ids, with the assistant's generation prompt (throws Error for a bad role). The
  // messages' text must be tokenized as text: only the template inserts control tokens.
  std::function<std::vector<int32_t>(const std::vector<ChatMessage>&)> encode_chat;
  // Ids -> text (for echo of a token-id prompt; echo of one is refused without it).
  std::function<std::string(const std::vector<int32_t>&)> decode;
};

struct ServerConfig {
  std::string host = "127.0.0.1";
  int port = 8000;                     // 0: any free port (see Server::port())
  std::string model_name = "default";  // the id served by /v1/models and required in requests
  // Every body, however framed (Content-Length, chunked, or none), stops here with a 413.
  size_t max_body_bytes = 1 << 20;
  // A request's line and headers together stop here with a 431.
  size_t max_header_bytes = 64 * 1024;
  // Connections served at once (each on a thread of its own); one more gets a 503 and is closed.
  int max_connections = 512;
  double idle_timeout_s = 5;     // a new or kept-alive connection must start a request by then
  double header_timeout_s = 10;  // request line and headers, from their first byte
  double body_timeout_s = 30;    // the body, from the end of the headers
  double io_timeout_s = 10;      // one read or write making no progress
  // Non-empty: every route but /health needs "Authorization: Bearer <api_key>" (401 otherwise).
  std::string api_key;
  bool metrics_without_key = false;  // with api_key: /metrics stays open (for a scraper)
  // Chat's max_tokens when the request gives none (at most what the context leaves); completions
  // default to 16 as OpenAI's do.
  int32_t default_chat_max_tokens = 1024;
  int32_t max_stop_strings = 4;
};

class Server {
 public:
  Server(AsyncEngine& engine, TextCodec codec, ServerConfig config);
  ~Server();
  Server(const Server&) = delete;
  Server& operator=(const Server&) = delete;

  // Binds the socket (throws Error naming host and port when it cannot) and serves on a background
  // thread. Returns the bound port.
  int start();
  // Waits up to kStopWaitSeconds for the open streams to send their last events and [DONE] (stop
  // the engine first, which ends every request), then stops accepting and joins the serving thread.
  void stop();
  static constexpr int kStopWaitSeconds = 5;
  int port() const { return port_; }

 private:
  struct Impl;
  std::unique_ptr<Impl> impl_;
  int port_ = 0;
};

// The Prometheus text of a metrics snapshot.
std::string prometheus_text(const EngineMetrics& m, const std::string& model_name);

}  // namespace pagedattn
