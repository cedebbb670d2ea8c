// The OpenAI request format: parsing and checking request bodies, and the JSON of errors.
#pragma once

#include <nlohmann/json.hpp>
#include <stdexcept>
#include <string>

#include "pagedattn/engine.h"
#include "pagedattn/server.h"

namespace pagedattn::api {

// An error the client caused (or a server error) with its HTTP status and OpenAI error fields.
struct ApiError : std::runtime_error {
  int status;
  std::string type, param, code;
  ApiError(int status, std::string message, std::string param = "", std::string code = "",
           std::string type = "invalid_request_error")
      : std::runtime_error(std::move(message)),
        status(status),
        type(std::move(type)),
        param(std::move(param)),
        code(std::move(code)) {}
};

// {"error": {"message", "type", "param", "code"}} (param and code null when empty).
nlohmann::json error_body(const std::string& message, const std::string& type,
                          const std::string& param, const std::string& code);
inline nlohmann::json error_body(const ApiError& e) {
  return error_body(e.what(), e.type, e.param, e.code);
}
// JSON text with invalid UTF-8 replaced (never throws on model output).
std::string dump(const nlohmann::json& j);
// A client's text quoted in an error message: at most 64 bytes of it, in single quotes.
std::string quote(const std::string& text);

struct ParsedRequest {
  bool chat = false;
  bool stream = false;
  bool include_usage = false;  // stream_options.include_usage
  Request req;                 // every setting; its prompt is prompts[0]
  // /v1/completions takes a list of prompts (OpenAI's batch): one request each, with req's
  // settings; choice k * n + i is sequence i of prompt k.
  std::vector<std::vector<int32_t>> prompts;
  bool echo = false;                   // completions: the prompt's text before each choice's
  std::vector<std::string> echo_text;  // [prompts.size()] with echo
};

// The most prompts one /v1/completions request may list.
constexpr size_t kMaxPrompts = 64;

// Parses a /v1/completions (chat = false) or /v1/chat/completions body: JSON types, ranges and what
// the API itself refuses. Throws ApiError naming the field at fault; nothing is submitted. The
// request's own checks (its prompt fitting the context and the KV cache, ...) are the engine's, at
// submit (Engine::validate's RequestError, answered with request_error).
ParsedRequest parse_request(const std::string& body, bool chat, const ServerConfig& config,
                            const TextCodec& codec, const Engine& engine);
// The 400 for a request the engine refused (chat requests name their prompt "messages").
ApiError request_error(const RequestError& e, bool chat);

}  // namespace pagedattn::api
