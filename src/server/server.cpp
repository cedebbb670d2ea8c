// The HTTP side of the OpenAI-compatible server: routes, streaming, errors.
#include "pagedattn/server.h"

#include <httplib.h>

#include <sys/socket.h>

#include <algorithm>
#include <cerrno>
#include <cmath>
#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <optional>
#include <string_view>
#include <thread>

#include "http_guard.h"
#include "openai_api.h"
#include "pagedattn/error.h"

namespace pagedattn {

using api::ApiError;
using nlohmann::json;

namespace {

// How often a non-streamed request checks whether its client is still there.
constexpr int kDisconnectPollMs = 50;

// Outputs of one request, handed from the engine's loop thread to the HTTP thread.
struct Pending {
  std::mutex mu;
  std::condition_variable cv;
  std::deque<RequestOutput> outs;
  bool done = false;
};

void send_error(httplib::Response& res, const ApiError& e) {
  res.status = e.status;
  res.set_content(api::dump(api::error_body(e)), "application/json");
}

const char* openai_finish(FinishReason r) {
  switch (r) {
    case FinishReason::stop:
      return "stop";
    case FinishReason::length:
      return "length";
    case FinishReason::cancelled:
      // NOTE: OpenAI has no value for a request ended by the server (shutdown, a failed step);
      // "length" (cut before its natural end) is one every client accepts.
      return "length";
    case FinishReason::none:
      break;
  }
  return nullptr;
}

json usage_json(const RequestOutput& o) {
  return json{{"prompt_tokens", o.prompt_tokens},
              {"completion_tokens", o.completion_tokens},
              {"total_tokens", o.prompt_tokens + o.completion_tokens},
              {"prompt_tokens_details", {{"cached_tokens", o.cached_tokens}}}};
}

json finish_json(FinishReason r) {
  const char* f = openai_finish(r);
  return f ? json(f) : json(nullptr);
}

// A token as the logprobs objects name it: its text alone (vLLM's "token_id:N" without a decoder).
std::string token_text(const TextCodec& codec, int32_t token) {
  return codec.decode ? codec.decode({token}) : "token_id:" + std::to_string(token);
}

// JSON has no -inf: OpenAI reports a token of no probability as -9999.
double logprob_json(double lp) { return std::isfinite(lp) ? lp : -9999.0; }

json token_bytes_json(const std::string& t) {
  json b = json::array();
  for (unsigned char c : t) b.push_back(int(c));
  return b;
}

// The logprobs object of a choice (or of a stream chunk) for tokens lp: chat's
// {"content": [{token, logprob, bytes, top_logprobs}]}, or completions' parallel lists, whose
// text_offset counts from `offset` (the characters of the choice before these tokens).
json logprobs_json(const std::vector<TokenLogprobs>& lp, bool chat, const TextCodec& codec,
                   size_t& offset) {
  if (chat) {
    json content = json::array();
    for (const TokenLogprobs& t : lp) {
      const std::string s = token_text(codec, t.token);
      json top = json::array();
      for (const auto& [id, v] : t.top) {
        const std::string ts = token_text(codec, id);
        top.push_back(
            {{"token", ts}, {"logprob", logprob_json(v)}, {"bytes", token_bytes_json(ts)}});
      }
      content.push_back({{"token", s},
                         {"logprob", logprob_json(t.logprob)},
                         {"bytes", token_bytes_json(s)},
                         {"top_logprobs", std::move(top)}});
    }
    return json{{"content", std::move(content)}, {"refusal", nullptr}};
  }
  json tokens = json::array(), token_lps = json::array(), tops = json::array(),
       offsets = json::array();
  for (const TokenLogprobs& t : lp) {
    const std::string s = token_text(codec, t.token);
    tokens.push_back(s);
    token_lps.push_back(logprob_json(t.logprob));
    json top = json::object();
    for (const auto& [id, v] : t.top) top[token_text(codec, id)] = logprob_json(v);
    tops.push_back(std::move(top));
    offsets.push_back(offset);
    offset += s.size();
  }
  return json{{"tokens", std::move(tokens)},
              {"token_logprobs", std::move(token_lps)},
              {"top_logprobs", std::move(tops)},
              {"text_offset", std::move(offsets)}};
}

}  // namespace

struct Server::Impl {
  AsyncEngine& engine;
  TextCodec codec;
  ServerConfig config;
  GuardedHttpServer http;
  std::thread thread;
  std::time_t started = std::time(nullptr);
  // Streamed responses not yet ended (their last event and [DONE] unsent): stop() waits for them.
  std::mutex streams_mu;
  std::condition_variable streams_cv;
  int open_streams = 0;

  Impl(AsyncEngine& e, TextCodec c, ServerConfig cfg)
      : engine(e), codec(std::move(c)), config(std::move(cfg)), http(limits(config)) {}

  static HttpLimits limits(const ServerConfig& c) {
    HttpLimits l;
    l.max_connections = c.max_connections;
    l.idle_timeout_s = c.idle_timeout_s;
    l.header_timeout_s = c.header_timeout_s;
    l.body_timeout_s = c.body_timeout_s;
    l.io_timeout_s = c.io_timeout_s;
    l.max_header_bytes = c.max_header_bytes;
    return l;
  }
  void routes();
  httplib::Server::HandlerResponse guard(const httplib::Request& req, httplib::Response& res);
  bool read_body(const httplib::Request& req, httplib::Response& res,
                 const httplib::ContentReader& reader, std::string& body);
  void handle_generate(const httplib::Request& req, httplib::Response& res,
                       const httplib::ContentReader& reader, bool chat);
  void respond_whole(httplib::Response& res, const api::ParsedRequest& p,
                     const std::vector<RequestId>& ids,
                     const std::vector<std::shared_ptr<Pending>>& sts, const std::string& rid);
  void respond_stream(httplib::Response& res, const api::ParsedRequest& p, RequestId id,
                      const std::shared_ptr<Pending>& st, const std::string& rid);
};

namespace {

// The routes and the methods each takes.
struct Route {
  const char* path;  // exact, or a prefix ending in '/' for /v1/models/{id}
  const char* method;
};
constexpr Route kRoutes[] = {{"/health", "GET"},          {"/metrics", "GET"},
                             {"/v1/models", "GET"},       {"/v1/models/", "GET"},
                             {"/v1/completions", "POST"}, {"/v1/chat/completions", "POST"}};

const Route* find_route(const std::string& path) {
  for (const Route& r : kRoutes) {
    const std::string_view p = r.path;
    if (p.back() == '/' ? (path.size() > p.size() && path.compare(0, p.size(), p) == 0) : path == p)
      return &r;
  }
  return nullptr;
}

bool has_body(const httplib::Request& req) {
  return req.has_header("Transfer-Encoding") ||
         (req.has_header("Content-Length") && req.get_header_value("Content-Length") != "0");
}

// A Content-Length value as RFC 9110 writes it (1*DIGIT), saturating past 2^63; -1 when it is not
// one. httplib reads the digits a value starts with (none: 0) and wraps a minus sign: "abc" framed
// an empty body and its bytes were parsed as the next request.
int64_t content_length(const std::string& v) {
  if (v.empty() || v.find_first_not_of("0123456789") != std::string::npos) return -1;
  int64_t n = 0;
  for (const char c : v) n = n > (INT64_MAX - 9) / 10 ? INT64_MAX : n * 10 + (c - '0');
  return n;
}

// Equal strings, in time that depends on their lengths only.
bool same_secret(const std::string& a, const std::string& b) {
  unsigned char diff = a.size() == b.size() ? 0 : 1;
  const size_t n = std::max(a.size(), b.size());
  for (size_t i = 0; i < n; ++i) {
    const unsigned char x = i < a.size() ? static_cast<unsigned char>(a[i]) : 0;
    const unsigned char y = i < b.size() ? static_cast<unsigned char>(b[i]) : 0;
    diff |= static_cast<unsigned char>(x ^ y);
  }
  return diff == 0;
}

}  // namespace

// Before any body is read: unknown routes (404), wrong methods (405), bodies where none belongs,
// and the API key (401). A refused request's body is never read; its connection closes after the
// answer.
httplib::Server::HandlerResponse Server::Impl::guard(const httplib::Request& req,
                                                     httplib::Response& res) {
  using HR = httplib::Server::HandlerResponse;
  const Route* route = find_route(req.path);
  const std::string method = req.method == "HEAD" ? "GET" : req.method;
  std::optional<ApiError> err;
  // Framing that a proxy in front could read otherwise than httplib does (request smuggling):
  // both a length and a transfer coding, or Content-Lengths that differ, are refused; a chunked
  // body's end is only as sure as httplib's parser (which takes a malformed chunk terminator for
  // the end of the body), so its connection closes after the answer.
  bool lengths_differ = false;
  for (size_t i = 1; i < req.get_header_value_count("Content-Length"); ++i)
    lengths_differ |= req.get_header_value("Content-Length", i) !=
                      req.get_header_value("Content-Length", 0);
  if (req.has_header("Transfer-Encoding")) GuardedHttpServer::close_after_response(res);
  const bool has_length = req.has_header("Content-Length");
  const int64_t length = has_length ? content_length(req.get_header_value("Content-Length")) : 0;
  if (req.has_header("Transfer-Encoding") && has_length) {
    err = ApiError(400, "the request has both Content-Length and Transfer-Encoding", "",
                   "invalid_body");
  } else if (lengths_differ) {
    err = ApiError(400, "the request has Content-Length headers that differ", "", "invalid_body");
  } else if (length < 0) {
    err = ApiError(400,
                   "the request's Content-Length " +
                       api::quote(req.get_header_value("Content-Length")) +
                       " is not a number of bytes",
                   "", "invalid_body");
  } else if (!route) {
    err = ApiError(404, "no route " + req.method + " " + req.path, "", "not_found");
  } else if (method != route->method) {
    err = ApiError(
        405,
        "method " + req.method + " is not allowed on " + req.path + " (use " + route->method + ")",
        "", "method_not_allowed");
    res.set_header("Allow", route->method);
  } else if (std::string_view(route->method) == "GET" && has_body(req)) {
    err = ApiError(400, req.method + " " + req.path + " takes no request body", "", "invalid_body");
  } else if (!config.api_key.empty() && req.path != "/health" &&
             !(req.path == "/metrics" && config.metrics_without_key)) {
    const std::string auth = req.get_header_value("Authorization");
    const std::string kBearer = "Bearer ";
    if (auth.empty()) {
      err = ApiError(401,
                     "You didn't provide an API key. You need to provide your API key in an "
                     "Authorization header using Bearer auth (i.e. Authorization: Bearer YOUR_KEY)",
                     "", "invalid_api_key");
    } else if (auth.compare(0, kBearer.size(), kBearer) != 0 ||
               !same_secret(auth.substr(kBearer.size()), config.api_key)) {
      err = ApiError(401, "Incorrect API key provided", "", "invalid_api_key");
    }
  }
  // A declared length past the limit is refused before any of the body is read (httplib would
  // first read and drop that many bytes, waiting io_timeout for those that never come).
  if (!err && uint64_t(length) > config.max_body_bytes)
    err = ApiError(413,
                   "the request body is larger than " + std::to_string(config.max_body_bytes) +
                       " bytes",
                   "", "body_too_large");
  if (!err) return HR::Unhandled;
  if (has_body(req)) GuardedHttpServer::close_after_response(res);
  send_error(res, *err);
  return HR::Handled;
}

// Reads the body, stopping at max_body_bytes however it is framed (false: res holds the error).
bool Server::Impl::read_body(const httplib::Request& req, httplib::Response& res,
                             const httplib::ContentReader& reader, std::string& body) {
  if (req.is_multipart_form_data()) {
    GuardedHttpServer::close_after_response(res);
    send_error(res, ApiError(415,
                             "the request body must be JSON (application/json), not "
                             "multipart/form-data",
                             "", "unsupported_media_type"));
    return false;
  }
  bool too_large = false;
  const size_t limit = config.max_body_bytes;
  const bool ok = reader([&](const char* data, size_t n) {
    if (body.size() + n > limit) {
      too_large = true;
      return false;
    }
    body.append(data, n);
    return true;
  });
  if (ok) return true;
  GuardedHttpServer::close_after_response(res);
  if (too_large || res.status == 413) {
    send_error(res,
               ApiError(413, "the request body is larger than " + std::to_string(limit) + " bytes",
                        "", "body_too_large"));
  } else {
    send_error(res, ApiError(400,
                             "the request body could not be read (malformed chunked "
                             "encoding or compression, or the client stopped sending)",
                             "", "invalid_body"));
  }
  return false;
}

void Server::Impl::routes() {
  http.set_pre_routing_handler(
      [this](const httplib::Request& req, httplib::Response& res) { return guard(req, res); });
  http.Get("/health", [this](const httplib::Request&, httplib::Response& res) {
    // NOTE: a runner that can no longer run (a tensor-parallel rank has died) makes the server
    // unhealthy, so a load balancer or supervisor takes it out of rotation.
    const std::string why = engine.engine().model().health();
    if (why.empty()) {
      res.set_content("{\"status\":\"ok\"}", "application/json");
    } else {
      res.status = 503;
      res.set_content(api::dump(json{{"status", "error"}, {"error", why}}), "application/json");
    }
  });
  auto model_card = [this] {
    return json{{"id", config.model_name},
                {"object", "model"},
                {"created", int64_t(started)},
                {"owned_by", "pagedattn"},
                {"max_model_len", engine.engine().max_model_len()},
                {"vocab_size", engine.engine().model().config().vocab_size}};
  };
  http.Get("/v1/models", [model_card](const httplib::Request&, httplib::Response& res) {
    res.set_content(api::dump(json{{"object", "list"}, {"data", json::array({model_card()})}}),
                    "application/json");
  });
  http.Get(R"(/v1/models/(.+))",
           [this, model_card](const httplib::Request& req, httplib::Response& res) {
             const std::string id = req.matches[1];
             if (id != config.model_name) {
               send_error(res, ApiError(404,
                                        "The model " + api::quote(id) +
                                            " does not exist; this server serves '" +
                                            config.model_name + "'",
                                        "model", "model_not_found"));
               return;
             }
             res.set_content(api::dump(model_card()), "application/json");
           });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(engine.metrics(), config.model_name),
                    "text/plain; version=0.0.4");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res,
                                      const httplib::ContentReader& reader) {
    handle_generate(req, res, reader, false);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res,
                                           const httplib::ContentReader& reader) {
    handle_generate(req, res, reader, true);
  });
  // Every 4xx/5xx without a body of its own (what httplib answers itself) gets an OpenAI-style
  // error body that says what is wrong.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                     httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    // NOTE: what httplib refuses itself leaves the stream in an unknown place: close after it.
    GuardedHttpServer::close_after_response(res);
    std::string msg, code = "invalid_request";
    switch (res.status) {
      case 400:  // bodies are read by the handlers: this is the request line or the headers
        msg = "malformed HTTP request: the request line or headers could not be parsed";
        break;
      case 413:
        msg = "the request body is larger than " + std::to_string(config.max_body_bytes) + " bytes";
        code = "body_too_large";
        break;
      case 414:
        msg = "the request URI is too long";
        code = "uri_too_long";
        break;
      case 416:
        msg = "the Range header is malformed or cannot be satisfied";
        code = "range_not_satisfiable";
        break;
      case 404:
        msg = "no route " + req.method + " " + req.path;
        code = "not_found";
        break;
      default:
        msg = "HTTP error " + std::to_string(res.status) + " on " + req.method + " " + req.path;
        code = res.status >= 500 ? "server_error" : "invalid_request";
    }
    send_error(res, ApiError(res.status, msg, "", code,
                             res.status >= 500 ? "server_error" : "invalid_request_error"));
    return httplib::Server::HandlerResponse::Handled;
  }));
  http.set_exception_handler(
      [](const httplib::Request&, httplib::Response& res, std::exception_ptr ep) {
        std::string msg = "internal error";
        try {
          if (ep) std::rethrow_exception(ep);
        } catch (const std::exception& e) {
          msg = e.what();
        } catch (...) {
        }
        send_error(res, ApiError(500, msg, "", "internal_error", "server_error"));
      });
}

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res,
                                   const httplib::ContentReader& reader, bool chat) {
  std::string body;
  if (!read_body(req, res, reader, body)) return;
  api::ParsedRequest p;
  try {
    p = api::parse_request(body, chat, config, codec, engine.engine());
  } catch (const ApiError& e) {
    send_error(res, e);
    return;
  } catch (const std::exception& e) {  // a tokenizer failure, say
    send_error(res, ApiError(400, e.what(), chat ? "messages" : "prompt", "invalid_value"));
    return;
  }
  std::vector<std::shared_ptr<Pending>> sts;
  std::vector<RequestId> ids;
  for (size_t k = 0; k < p.prompts.size(); ++k) {
    Request r = p.req;
    r.prompt = p.prompts[k];
    auto st = std::make_shared<Pending>();
    try {
      ids.push_back(engine.submit(std::move(r), [st](const RequestOutput& o) {
        std::lock_guard<std::mutex> lk(st->mu);
        st->outs.push_back(o);
        if (o.finished) st->done = true;
        st->cv.notify_all();
      }));
    } catch (const RequestError& e) {  // the engine refused it: nothing queued
      for (RequestId id : ids) engine.cancel(id);
      send_error(res, api::request_error(e, chat));
      return;
    } catch (const Error& e) {
      for (RequestId id : ids) engine.cancel(id);
      send_error(res, ApiError(503, e.what(), "", "unavailable", "server_error"));
      return;
    }
    sts.push_back(std::move(st));
  }
  const std::string rid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(ids[0]);
  if (p.stream)
    respond_stream(res, p, ids[0], sts[0], rid);
  else
    respond_whole(res, p, ids, sts, rid);
}

void Server::Impl::respond_whole(httplib::Response& res, const api::ParsedRequest& p,
                                 const std::vector<RequestId>& ids,
                                 const std::vector<std::shared_ptr<Pending>>& sts,
                                 const std::string& rid) {
  // Wait for every prompt's request; a client that goes away cancels them (pages freed at once).
  bool gone = false;
  for (const auto& st : sts) {
    std::unique_lock<std::mutex> lk(st->mu);
    while (!st->done) {
      if (st->cv.wait_for(lk, std::chrono::milliseconds(kDisconnectPollMs),
                          [&] { return st->done; }))
        break;
      if (!gone && GuardedHttpServer::client_gone()) {
        gone = true;
        lk.unlock();
        for (RequestId id : ids) engine.cancel(id);
        lk.lock();
      }
    }
  }
  if (gone) return;  // nobody to answer
  const size_t n = size_t(p.req.n);
  std::vector<std::string> text(sts.size() * n);
  std::vector<std::vector<TokenLogprobs>> logprobs(sts.size() * n);
  std::vector<FinishReason> finish(sts.size() * n, FinishReason::none);
  int64_t prompt_tokens = 0, completion_tokens = 0, cached_tokens = 0;
  for (size_t k = 0; k < sts.size(); ++k) {
    std::lock_guard<std::mutex> lk(sts[k]->mu);
    for (const RequestOutput& o : sts[k]->outs) {
      if (!o.error.empty()) {
        send_error(res, ApiError(503, o.error, "", "unavailable", "server_error"));
        return;
      }
      for (const SequenceOutput& s : o.seqs) {
        text[k * n + size_t(s.index)] += s.new_text;
        auto& lp = logprobs[k * n + size_t(s.index)];
        lp.insert(lp.end(), s.logprobs.begin(), s.logprobs.end());
        if (s.finish != FinishReason::none) finish[k * n + size_t(s.index)] = s.finish;
      }
    }
    const RequestOutput& last = sts[k]->outs.back();
    prompt_tokens += last.prompt_tokens;
    completion_tokens += last.completion_tokens;
    cached_tokens += last.cached_tokens;
  }
  json choices = json::array();
  for (size_t i = 0; i < text.size(); ++i) {
    json c = {{"index", i}, {"finish_reason", finish_json(finish[i])}, {"logprobs", nullptr}};
    size_t offset = 0;
    if (p.req.sampling.logprobs >= 0)
      c["logprobs"] = logprobs_json(logprobs[i], p.chat, codec, offset);
    if (p.chat)
      c["message"] = {{"role", "assistant"}, {"content", text[i]}};
    else
      c["text"] = (p.echo ? p.echo_text[i / n] : std::string()) + text[i];
    choices.push_back(std::move(c));
  }
  json body = {{"id", rid},
               {"object", p.chat ? "chat.completion" : "text_completion"},
               {"created", int64_t(std::time(nullptr))},
               {"model", config.model_name},
               {"choices", std::move(choices)},
               {"usage",
                {{"prompt_tokens", prompt_tokens},
                 {"completion_tokens", completion_tokens},
                 {"total_tokens", prompt_tokens + completion_tokens},
                 {"prompt_tokens_details", {{"cached_tokens", cached_tokens}}}}}};
  res.set_content(api::dump(body), "application/json");
}

void Server::Impl::respond_stream(httplib::Response& res, const api::ParsedRequest& p, RequestId id,
                                  const std::shared_ptr<Pending>& st, const std::string& rid) {
  struct StreamState {
    bool opening_sent = false;
    bool finished = false;
    std::vector<size_t> text_offset;  // completions' logprobs: characters so far, per choice
  };
  auto ss = std::make_shared<StreamState>();
  const bool chat = p.chat, include_usage = p.include_usage;
  const int32_t n = p.req.n;
  const std::string echo = p.echo ? p.echo_text[0] : std::string();
  const bool with_logprobs = p.req.sampling.logprobs >= 0;
  ss->text_offset.assign(size_t(n), 0);
  const TextCodec* codec_ptr = &codec;
  const std::string model = config.model_name;
  const int64_t created = int64_t(std::time(nullptr));
  auto chunk = [=](json choices) {
    json c = {{"id", rid},
              {"object", chat ? "chat.completion.chunk" : "text_completion"},
              {"created", created},
              {"model", model},
              {"choices", std::move(choices)}};
    return c;
  };
  auto provider = [=](size_t, httplib::DataSink& sink) -> bool {
    std::deque<RequestOutput> outs;
    {
      std::unique_lock<std::mutex> lk(st->mu);
      st->cv.wait_for(lk, std::chrono::milliseconds(200), [&] { return !st->outs.empty(); });
      outs.swap(st->outs);
    }
    auto write = [&](const json& j) {
      const std::string s = "data: " + api::dump(j) + "\n\n";
      return sink.write(s.data(), s.size());
    };
    if (chat && !ss->opening_sent) {
      json choices = json::array();
      for (int32_t i = 0; i < n; ++i)
        choices.push_back({{"index", i},
                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                           {"logprobs", nullptr},
                           {"finish_reason", nullptr}});
      if (!write(chunk(choices))) return false;
      ss->opening_sent = true;
    }
    if (!chat && !echo.empty() && !ss->opening_sent) {
      for (int32_t i = 0; i < n; ++i) {
        json c = {{"index", i}, {"text", echo}, {"logprobs", nullptr}, {"finish_reason", nullptr}};
        if (!write(chunk(json::array({c})))) return false;
      }
      ss->opening_sent = true;
    }
    for (const RequestOutput& o : outs) {
      if (!o.error.empty()) {
        if (!write(api::error_body(o.error, "server_error", "", "unavailable"))) return false;
      }
      for (const SequenceOutput& s : o.seqs) {
        if (s.new_text.empty() && s.finish == FinishReason::none && s.logprobs.empty()) continue;
        json c = {{"index", s.index}, {"finish_reason", finish_json(s.finish)}};
        if (chat) {
          c["delta"] = s.new_text.empty() ? json::object() : json{{"content", s.new_text}};
        } else {
          c["text"] = s.new_text;
        }
        c["logprobs"] = nullptr;
        if (with_logprobs)
          c["logprobs"] = logprobs_json(s.logprobs, chat, *codec_ptr,
                                        ss->text_offset[size_t(s.index)]);
        if (!write(chunk(json::array({c})))) return false;
      }
      if (o.finished) {
        ss->finished = true;
        if (include_usage) {
          json u = chunk(json::array());
          u["usage"] = usage_json(o);
          if (!write(u)) return false;
        }
        const std::string done = "data: [DONE]\n\n";
        if (!sink.write(done.data(), done.size())) return false;
        sink.done();
        return true;
      }
    }
    return true;
  };
  AsyncEngine* engine_ptr = &engine;
  Impl* self = this;
  {
    std::lock_guard<std::mutex> lk(streams_mu);
    ++open_streams;
  }
  auto release = [st, ss, id, engine_ptr, self](bool) {
    // The client went away (or the stream ended early): stop generating and free the pages now.
    bool done;
    {
      std::lock_guard<std::mutex> lk(st->mu);
      done = st->done;
    }
    if (!done) engine_ptr->cancel(id);
    std::lock_guard<std::mutex> lk(self->streams_mu);
    if (--self->open_streams == 0) self->streams_cv.notify_all();
  };
  res.set_header("Cache-Control", "no-cache");
  res.set_chunked_content_provider("text/event-stream", provider, release);
}

Server::Server(AsyncEngine& engine, TextCodec codec, ServerConfig config)
    : impl_(std::make_unique<Impl>(engine, std::move(codec), std::move(config))) {
  PA_CHECK(impl_->codec.encode && impl_->codec.encode_chat, "Server: codec lacks encode functions");
  PA_CHECK(impl_->config.port >= 0 && impl_->config.port <= 65535, "Server: port ",
           impl_->config.port, " is outside [0, 65535]");
  const ServerConfig& c = impl_->config;
  PA_CHECK(c.max_connections >= 1, "Server: max_connections must be >= 1, got ", c.max_connections);
  PA_CHECK(c.max_body_bytes >= 1, "Server: max_body_bytes must be >= 1");
  PA_CHECK(c.max_header_bytes >= 1024, "Server: max_header_bytes must be >= 1024, got ",
           c.max_header_bytes);
  for (double t : {c.idle_timeout_s, c.header_timeout_s, c.body_timeout_s, c.io_timeout_s})
    PA_CHECK(t > 0 && t <= 86400, "Server: timeouts must be in (0, 86400] seconds, got ", t);
  PA_CHECK(c.default_chat_max_tokens >= 1, "Server: default_chat_max_tokens must be >= 1, got ",
           c.default_chat_max_tokens);
  impl_->http.set_payload_max_length(c.max_body_bytes);
  // SO_REUSEADDR only: httplib's default also sets SO_REUSEPORT, with which a second server on
  // the same port started without an error and took half of the first one's connections.
  impl_->http.set_socket_options([](socket_t sock) {
    int yes = 1;
    ::setsockopt(sock, SOL_SOCKET, SO_REUSEADDR, &yes, sizeof(yes));
  });
  impl_->routes();
}

Server::~Server() { stop(); }

int Server::start() {
  PA_CHECK(!impl_->thread.joinable(), "Server::start: already started");
  const ServerConfig& c = impl_->config;
  int port = c.port;
  errno = 0;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(c.host);
  } else if (!impl_->http.bind_to_port(c.host, port)) {
    port = -1;
  }
  PA_CHECK(port > 0, "Server::start: cannot listen on ", c.host, ":", c.port,
           errno == EADDRINUSE ? " (the address is in use: another server on that port?)" : "");
  impl_->http.widen_backlog();
  port_ = port;
  impl_->thread = std::thread([this] { impl_->http.listen_after_bind(); });
  return port_;
}

void Server::stop() {
  if (impl_->thread.joinable()) {
    // NOTE: once stopped, httplib ends a chunked response where it is, without its last event or
    // [DONE] (and often without the terminating chunk): let open streams end first.
    {
      std::unique_lock<std::mutex> lk(impl_->streams_mu);
      impl_->streams_cv.wait_for(lk, std::chrono::seconds(kStopWaitSeconds),
                                 [this] { return impl_->open_streams == 0; });
    }
    impl_->http.stop();
    impl_->http.shutdown_connections();
    impl_->thread.join();
  }
}

}  // namespace pagedattn
