// The HTTP side of the OpenAI-compatible server: routes, streaming, errors.
#include "pagedattn/server.h"

#include <httplib.h>

#include <chrono>
#include <condition_variable>
#include <ctime>
#include <deque>
#include <mutex>
#include <thread>

#include "openai_api.h"
#include "pagedattn/error.h"

namespace pagedattn {

using api::ApiError;
using nlohmann::json;

namespace {

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
      return "abort";
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

}  // namespace

struct Server::Impl {
  AsyncEngine& engine;
  TextCodec codec;
  ServerConfig config;
  httplib::Server http;
  std::thread thread;
  std::time_t started = std::time(nullptr);
  // Streamed responses not yet ended (their last event and [DONE] unsent): stop() waits for them.
  std::mutex streams_mu;
  std::condition_variable streams_cv;
  int open_streams = 0;

  Impl(AsyncEngine& e, TextCodec c, ServerConfig cfg)
      : engine(e), codec(std::move(c)), config(std::move(cfg)) {}

  void routes();
  void handle_generate(const httplib::Request& req, httplib::Response& res, bool chat);
  void respond_whole(httplib::Response& res, const api::ParsedRequest& p, RequestId id,
                     const std::shared_ptr<Pending>& st, const std::string& rid);
  void respond_stream(httplib::Response& res, const api::ParsedRequest& p, RequestId id,
                      const std::shared_ptr<Pending>& st, const std::string& rid);
};

void Server::Impl::routes() {
  http.Get("/health", [](const httplib::Request&, httplib::Response& res) {
    res.set_content("{\"status\":\"ok\"}", "application/json");
  });
  http.Get("/v1/models", [this](const httplib::Request&, httplib::Response& res) {
    json m = {{"id", config.model_name},
              {"object", "model"},
              {"created", int64_t(started)},
              {"owned_by", "pagedattn"},
              {"max_model_len", engine.engine().max_model_len()},
              {"vocab_size", engine.engine().model().config().vocab_size}};
    res.set_content(api::dump(json{{"object", "list"}, {"data", json::array({m})}}),
                    "application/json");
  });
  http.Get("/metrics", [this](const httplib::Request&, httplib::Response& res) {
    res.set_content(prometheus_text(engine.metrics(), config.model_name),
                    "text/plain; version=0.0.4");
  });
  http.Post("/v1/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, false);
  });
  http.Post("/v1/chat/completions", [this](const httplib::Request& req, httplib::Response& res) {
    handle_generate(req, res, true);
  });
  // Every 4xx/5xx without a body of its own (unknown route, wrong method, body too large) gets an
  // OpenAI-style error body.
  http.set_error_handler(httplib::Server::HandlerWithResponse([this](const httplib::Request& req,
                                                                     httplib::Response& res) {
    if (!res.body.empty()) return httplib::Server::HandlerResponse::Unhandled;
    std::string msg, code;
    if (res.status == 413) {
      msg = "the request body is larger than " + std::to_string(config.max_body_bytes) + " bytes";
      code = "body_too_large";
    } else if (res.status == 404) {
      msg = "no route " + req.method + " " + req.path;
      code = "not_found";
    } else if (res.status == 405) {
      msg = "method " + req.method + " is not allowed on " + req.path;
      code = "method_not_allowed";
    } else {
      msg = "HTTP error " + std::to_string(res.status);
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

void Server::Impl::handle_generate(const httplib::Request& req, httplib::Response& res, bool chat) {
  api::ParsedRequest p;
  try {
    p = api::parse_request(req.body, chat, config, codec, engine.engine());
  } catch (const ApiError& e) {
    send_error(res, e);
    return;
  } catch (const std::exception& e) {  // a tokenizer failure, say
    send_error(res, ApiError(400, e.what(), chat ? "messages" : "prompt", "invalid_value"));
    return;
  }
  auto st = std::make_shared<Pending>();
  RequestId id = 0;
  try {
    id = engine.submit(std::move(p.req), [st](const RequestOutput& o) {
      std::lock_guard<std::mutex> lk(st->mu);
      st->outs.push_back(o);
      if (o.finished) st->done = true;
      st->cv.notify_all();
    });
  } catch (const Error& e) {
    send_error(res, ApiError(503, e.what(), "", "unavailable", "server_error"));
    return;
  }
  const std::string rid = (chat ? "chatcmpl-" : "cmpl-") + std::to_string(id);
  if (p.stream)
    respond_stream(res, p, id, st, rid);
  else
    respond_whole(res, p, id, st, rid);
}

void Server::Impl::respond_whole(httplib::Response& res, const api::ParsedRequest& p, RequestId,
                                 const std::shared_ptr<Pending>& st, const std::string& rid) {
  std::vector<std::string> text(size_t(p.req.n));
  std::vector<FinishReason> finish(size_t(p.req.n), FinishReason::none);
  RequestOutput last;
  {
    std::unique_lock<std::mutex> lk(st->mu);
    st->cv.wait(lk, [&] { return st->done; });
    for (const RequestOutput& o : st->outs) {
      for (const SequenceOutput& s : o.seqs) {
        text[size_t(s.index)] += s.new_text;
        if (s.finish != FinishReason::none) finish[size_t(s.index)] = s.finish;
      }
      last = o;
    }
  }
  if (!last.error.empty()) {
    send_error(res, ApiError(503, last.error, "", "unavailable", "server_error"));
    return;
  }
  json choices = json::array();
  for (int32_t i = 0; i < p.req.n; ++i) {
    json c = {
        {"index", i}, {"finish_reason", finish_json(finish[size_t(i)])}, {"logprobs", nullptr}};
    if (p.chat)
      c["message"] = {{"role", "assistant"}, {"content", text[size_t(i)]}};
    else
      c["text"] = text[size_t(i)];
    choices.push_back(std::move(c));
  }
  json body = {{"id", rid},
               {"object", p.chat ? "chat.completion" : "text_completion"},
               {"created", int64_t(std::time(nullptr))},
               {"model", config.model_name},
               {"choices", std::move(choices)},
               {"usage", usage_json(last)}};
  res.set_content(api::dump(body), "application/json");
}

void Server::Impl::respond_stream(httplib::Response& res, const api::ParsedRequest& p, RequestId id,
                                  const std::shared_ptr<Pending>& st, const std::string& rid) {
  struct StreamState {
    bool role_sent = false;
    bool finished = false;
  };
  auto ss = std::make_shared<StreamState>();
  const bool chat = p.chat, include_usage = p.include_usage;
  const int32_t n = p.req.n;
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
    if (chat && !ss->role_sent) {
      json choices = json::array();
      for (int32_t i = 0; i < n; ++i)
        choices.push_back({{"index", i},
                           {"delta", {{"role", "assistant"}, {"content", ""}}},
                           {"finish_reason", nullptr}});
      if (!write(chunk(choices))) return false;
      ss->role_sent = true;
    }
    for (const RequestOutput& o : outs) {
      if (!o.error.empty()) {
        if (!write(api::error_body(o.error, "server_error", "", "unavailable"))) return false;
      }
      for (const SequenceOutput& s : o.seqs) {
        if (s.new_text.empty() && s.finish == FinishReason::none) continue;
        json c = {{"index", s.index}, {"finish_reason", finish_json(s.finish)}};
        if (chat) {
          c["delta"] = s.new_text.empty() ? json::object() : json{{"content", s.new_text}};
        } else {
          c["text"] = s.new_text;
          c["logprobs"] = nullptr;
        }
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
  PA_CHECK(impl_->config.num_threads >= 1, "Server: num_threads must be >= 1");
  const int threads = impl_->config.num_threads;
  impl_->http.new_task_queue = [threads] { return new httplib::ThreadPool(size_t(threads)); };
  impl_->http.set_payload_max_length(impl_->config.max_body_bytes);
  impl_->http.set_read_timeout(30, 0);
  impl_->http.set_write_timeout(30, 0);
  impl_->routes();
}

Server::~Server() { stop(); }

int Server::start() {
  PA_CHECK(!impl_->thread.joinable(), "Server::start: already started");
  const ServerConfig& c = impl_->config;
  int port = c.port;
  if (port == 0) {
    port = impl_->http.bind_to_any_port(c.host);
  } else if (!impl_->http.bind_to_port(c.host, port)) {
    port = -1;
  }
  PA_CHECK(port > 0, "Server::start: cannot listen on ", c.host, ":", c.port);
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
    impl_->thread.join();
  }
}

}  // namespace pagedattn
