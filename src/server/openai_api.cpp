// Parsing and checking OpenAI completion and chat-completion request bodies.
#include "openai_api.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <limits>
#include <utility>

#include "pagedattn/error.h"

namespace pagedattn::api {

using nlohmann::json;

json error_body(const std::string& message, const std::string& type, const std::string& param,
                const std::string& code) {
  json e = {{"message", message}, {"type", type}};
  e["param"] = param.empty() ? json(nullptr) : json(param);
  e["code"] = code.empty() ? json(nullptr) : json(code);
  return json{{"error", e}};
}

std::string dump(const json& j) { return j.dump(-1, ' ', false, json::error_handler_t::replace); }

std::string quote(const std::string& text) {
  constexpr size_t kMax = 64;
  // At most kMax bytes, cut where a character starts; control bytes written as \xNN (a NUL
  // would end the message where it is read as a C string).
  size_t end = std::min(text.size(), kMax);
  if (end < text.size())
    while (end > 0 && (uint8_t(text[end]) & 0xc0) == 0x80) --end;
  std::string out = "'";
  for (size_t i = 0; i < end; ++i) {
    const uint8_t c = uint8_t(text[i]);
    if (c < 0x20 || c == 0x7f) {
      char esc[8];
      std::snprintf(esc, sizeof(esc), "\\x%02x", c);
      out += esc;
    } else {
      out += char(c);
    }
  }
  return out + (end < text.size() ? "...'" : "'");
}

namespace {

// Request bodies nest at most this deep (arrays and objects): the parser itself loops, but
// printing or walking a value recurses, and a body of 1 MiB can nest 500k levels.
constexpr int kMaxJsonDepth = 64;

// Whether the body's arrays and objects, counted outside strings, nest deeper than `limit`.
bool nests_deeper_than(const std::string& body, int limit) {
  int depth = 0;
  bool in_string = false, escaped = false;
  for (const char c : body) {
    if (in_string) {
      if (escaped)
        escaped = false;
      else if (c == '\\')
        escaped = true;
      else if (c == '"')
        in_string = false;
    } else if (c == '"') {
      in_string = true;
    } else if (c == '[' || c == '{') {
      if (++depth > limit) return true;
    } else if (c == ']' || c == '}') {
      --depth;
    }
  }
  return false;
}

// A client's value named in an error message: a number as written, anything else by its type.
std::string describe(const json& v) {
  if (v.is_number()) return dump(v);
  if (v.is_string()) return "the string " + quote(v.get<std::string>());
  return std::string(v.is_array() ? "an " : "a ") + v.type_name();
}

const json* field(const json& j, const char* name) {
  auto it = j.find(name);
  if (it == j.end() || it->is_null()) return nullptr;
  return &*it;
}

int64_t get_int(const json& j, const char* name, int64_t def, int64_t lo, int64_t hi) {
  const json* v = field(j, name);
  if (!v) return def;
  if (v->is_number_float() && std::isfinite(v->get<double>()) &&
      std::floor(v->get<double>()) == v->get<double>() && std::fabs(v->get<double>()) >= 9.2e18)
    throw ApiError(400,
                   std::string(name) + " must be in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "], got " + dump(*v),
                   name, "invalid_value");  // an integer past int64's range (read as a float)
  if (!v->is_number_integer())
    throw ApiError(400, std::string(name) + " must be an integer", name, "invalid_type");
  const int64_t x = v->is_number_unsigned() && v->get<uint64_t>() > uint64_t(INT64_MAX)
                        ? INT64_MAX
                        : v->get<int64_t>();
  if (x < lo || x > hi)
    throw ApiError(400,
                   std::string(name) + " must be in [" + std::to_string(lo) + ", " +
                       std::to_string(hi) + "], got " + dump(*v),
                   name, "invalid_value");
  return x;
}

// A bound as a person writes it: 2, 0.5, -2 (not 2.000000).
std::string bound(double x) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%g", x);
  return buf;
}

double get_number(const json& j, const char* name, double def, double lo, double hi,
                  bool lo_open = false) {
  const json* v = field(j, name);
  if (!v) return def;
  if (!v->is_number())
    throw ApiError(400, std::string(name) + " must be a number", name, "invalid_type");
  const double x = v->get<double>();
  if (!std::isfinite(x) || x < lo || x > hi || (lo_open && x == lo)) {
    throw ApiError(400,
                   std::string(name) + " must be in " + (lo_open ? "(" : "[") + bound(lo) + ", " +
                       bound(hi) + "], got " + dump(*v),
                   name, "invalid_value");
  }
  return x;
}

// get_number for a parameter kept in single precision: a value inside an open lower bound that
// single precision would round onto the bound (1e-300 for top_p) becomes the nearest float inside.
float get_float(const json& j, const char* name, double def, double lo, double hi,
                bool lo_open = false) {
  const double x = get_number(j, name, def, lo, hi, lo_open);
  float f = float(x);
  if (lo_open && double(f) <= lo) f = std::nextafter(float(lo), 1.f);
  return f;
}

bool get_bool(const json& j, const char* name, bool def) {
  const json* v = field(j, name);
  if (!v) return def;
  if (!v->is_boolean())
    throw ApiError(400, std::string(name) + " must be a boolean", name, "invalid_type");
  return v->get<bool>();
}

// Token ids of an array, each in the vocabulary (`what` names them in the error, `param` is the
// field).
std::vector<int32_t> token_ids(const json& p, int32_t vocab,
                               const std::string& what = "prompt token ids",
                               const char* param = "prompt") {
  std::vector<int32_t> ids;
  for (const json& t : p) {
    if (!t.is_number_integer() || t.get<int64_t>() < 0 || t.get<int64_t>() >= vocab)
      throw ApiError(400, what + " must be integers in [0, " + std::to_string(vocab) + ")", param,
                     "invalid_value");
    ids.push_back(int32_t(t.get<int64_t>()));
  }
  return ids;
}

// The prompts of a /v1/completions body: a string, an array of token ids, or a list of either.
// With echo, each one's text too.
void completion_prompts(const json& j, const TextCodec& codec, int32_t vocab, ParsedRequest& p) {
  const json* v = field(j, "prompt");
  if (!v) throw ApiError(400, "prompt is required", "prompt", "missing_field");
  const char* kShape =
      "prompt must be a string, an array of token ids, or a list of strings or of token-id arrays";
  std::vector<const json*> items;
  if (v->is_string() || (v->is_array() && !v->empty() && (*v)[0].is_number())) {
    items.push_back(v);
  } else if (v->is_array() && !v->empty()) {
    if (v->size() > kMaxPrompts)
      throw ApiError(400,
                     "prompt lists at most " + std::to_string(kMaxPrompts) + " prompts, got " +
                         std::to_string(v->size()),
                     "prompt", "invalid_value");
    for (const json& e : *v) {
      if (!e.is_string() && !(e.is_array() && !e.empty()))
        throw ApiError(400, kShape, "prompt", "invalid_type");
      items.push_back(&e);
    }
  } else {
    throw ApiError(400, kShape, "prompt", "invalid_type");
  }
  for (const json* e : items) {
    if (e->is_string()) {
      p.prompts.push_back(codec.encode(e->get<std::string>()));
      if (p.echo) p.echo_text.push_back(e->get<std::string>());
    } else {
      p.prompts.push_back(token_ids(*e, vocab));
      if (p.echo) {
        if (!codec.decode)
          throw ApiError(400, "echo of a token-id prompt needs a tokenizer", "echo", "unsupported");
        p.echo_text.push_back(codec.decode(p.prompts.back()));
      }
    }
  }
}

std::vector<int32_t> chat_prompt(const json& j, const TextCodec& codec) {
  const json* m = field(j, "messages");
  if (!m) throw ApiError(400, "messages is required", "messages", "missing_field");
  if (!m->is_array() || m->empty())
    throw ApiError(400, "messages must be a non-empty array", "messages", "invalid_type");
  std::vector<ChatMessage> msgs;
  for (size_t i = 0; i < m->size(); ++i) {
    const json& e = (*m)[i];
    const std::string at = "messages[" + std::to_string(i) + "]";
    if (!e.is_object()) throw ApiError(400, at + " must be an object", "messages", "invalid_type");
    const json* role = field(e, "role");
    if (!role || !role->is_string())
      throw ApiError(400, at + ".role must be a string", "messages", "invalid_type");
    const std::string r = role->get<std::string>();
    if (r != "system" && r != "user" && r != "assistant" && r != "developer")
      throw ApiError(400,
                     at + ".role " + quote(r) + " is not one of system, developer, user, assistant",
                     "messages", "invalid_value");
    const json* content = field(e, "content");
    std::string text;
    if (content && content->is_string()) {
      text = content->get<std::string>();
    } else if (content && content->is_array()) {
      for (const json& part : *content) {
        // NOTE: not part.value("type", ""): it throws nlohmann's type_error for a non-string.
        if (!part.is_object() || !part.contains("type") || part["type"] != "text" ||
            !part.contains("text") || !part["text"].is_string())
          throw ApiError(400, at + ".content parts must be {\"type\": \"text\", \"text\": string}",
                         "messages", "invalid_type");
        text += part["text"].get<std::string>();
      }
    } else {
      throw ApiError(400, at + ".content must be a string or an array of text parts", "messages",
                     "invalid_type");
    }
    msgs.push_back({r == "developer" ? "system" : r, text});
  }
  try {
    return codec.encode_chat(msgs);
  } catch (const Error& e) {
    throw ApiError(400, std::string("messages: ") + e.what(), "messages", "invalid_value");
  }
}

// Parameters that would change the output and that this server does not implement: a 400 naming
// each, never silently ignored. Parameters that change nothing here are type-checked only.
void check_unsupported(const json& j, bool chat) {
  auto refuse = [](const std::string& name, const std::string& why) {
    throw ApiError(400, name + " is not supported by this server" + why, name, "unsupported");
  };
  for (const char* name : {"tools", "functions", "audio", "prediction", "web_search_options"})
    if (field(j, name)) refuse(name, "");
  for (const char* name : {"tool_choice", "function_call"})
    if (const json* v = field(j, name); v && !(v->is_string() && v->get<std::string>() == "none"))
      refuse(name, " (only \"none\")");
  if (const json* v = field(j, "suffix"); v && !(v->is_string() && v->get<std::string>().empty()))
    refuse("suffix", "");
  if (const json* v = field(j, "modalities")) {
    if (!v->is_array())
      throw ApiError(400, "modalities must be an array of strings", "modalities", "invalid_type");
    for (const json& m : *v) {
      if (!m.is_string())
        throw ApiError(400, "modalities must be an array of strings", "modalities", "invalid_type");
      if (m.get<std::string>() != "text") refuse("modalities", " (only [\"text\"])");
    }
  }
  if (chat && field(j, "echo")) refuse("echo", " for chat completions (use /v1/completions)");
  // vLLM's extra parameters that would change the output (those it shares with this server, e.g.
  // top_k, min_p, ignore_eos, stop_token_ids, use_beam_search, are implemented).
  for (const char* name : {"guided_json", "guided_regex", "guided_choice", "guided_grammar",
                           "structured_outputs", "allowed_token_ids", "bad_words",
                           "prompt_logprobs", "truncate_prompt_tokens", "logits_processors"})
    if (field(j, name)) refuse(name, "");
  if (const json* v = field(j, "min_tokens");
      v && !(v->is_number_integer() && v->get<int64_t>() == 0))
    refuse("min_tokens", " (only 0)");
  if (const json* v = field(j, "include_stop_str_in_output");
      v && !(v->is_boolean() && !v->get<bool>()))
    refuse("include_stop_str_in_output", " (only false)");
  for (const char* name : {"skip_special_tokens", "spaces_between_special_tokens"})
    if (const json* v = field(j, name); v && !(v->is_boolean() && v->get<bool>()))
      refuse(name, " (only true)");
  // Accepted, and nothing to do here: still the right type.
  if (const json* v = field(j, "user"); v && !v->is_string())
    throw ApiError(400, "user must be a string", "user", "invalid_type");
  if (const json* v = field(j, "metadata"); v && !v->is_object())
    throw ApiError(400, "metadata must be an object", "metadata", "invalid_type");
  get_bool(j, "store", false);
  get_bool(j, "parallel_tool_calls", true);
  if (const json* v = field(j, "service_tier"); v && !v->is_string())
    throw ApiError(400, "service_tier must be a string", "service_tier", "invalid_type");
}

// logprobs and top_logprobs, typed and ranged as OpenAI does: how many alternatives each generated
// token reports (-1: no logprobs). Chat: logprobs a boolean, top_logprobs 0..20; completions:
// logprobs the number, 0..5.
int32_t parse_logprobs(const json& j, bool chat) {
  int32_t wanted = -1;
  if (field(j, "logprobs")) {
    if (chat)
      wanted = get_bool(j, "logprobs", false) ? 0 : -1;
    else
      wanted = int32_t(get_int(j, "logprobs", 0, 0, 5));
  }
  if (field(j, "top_logprobs")) {
    if (!chat)
      throw ApiError(400,
                     "top_logprobs is a chat completions field; completions take logprobs as "
                     "the number of alternatives",
                     "top_logprobs", "invalid_value");
    const int32_t top = int32_t(get_int(j, "top_logprobs", 0, 0, 20));
    if (wanted < 0)
      throw ApiError(400, "top_logprobs needs logprobs to be true", "top_logprobs",
                     "invalid_value");
    wanted = top;
  }
  return wanted;
}

// OpenAI's logit_bias: {"token id": bias in [-100, 100]}.
std::vector<std::pair<int32_t, float>> logit_bias(const json& j, int32_t vocab) {
  std::vector<std::pair<int32_t, float>> out;
  const json* v = field(j, "logit_bias");
  if (!v) return out;
  if (!v->is_object())
    throw ApiError(400, "logit_bias must be an object mapping token ids to biases", "logit_bias",
                   "invalid_type");
  for (const auto& [key, bias] : v->items()) {
    int64_t id = -1;
    if (!key.empty() && key.size() <= 10 &&
        key.find_first_not_of("0123456789") == std::string::npos)
      id = std::stoll(key);
    if (id < 0 || id >= vocab)
      throw ApiError(400,
                     "logit_bias keys must be token ids in [0, " + std::to_string(vocab) +
                         "), got " + quote(key),
                     "logit_bias", "invalid_value");
    if (!bias.is_number() || !std::isfinite(bias.get<double>()) ||
        std::abs(bias.get<double>()) > 100.0)
      throw ApiError(400, "logit_bias values must be numbers in [-100, 100], got " + describe(bias),
                     "logit_bias", "invalid_value");
    out.emplace_back(int32_t(id), float(bias.get<double>()));
  }
  return out;
}

// response_format: {"type": "text"} or {"type": "json_object"} (json_schema is not implemented).
bool json_object_format(const json& j) {
  const json* v = field(j, "response_format");
  if (!v) return false;
  if (!v->is_object() || !v->contains("type") || !(*v)["type"].is_string())
    throw ApiError(400, "response_format must be an object with a string type", "response_format",
                   "invalid_type");
  const std::string type = (*v)["type"];
  if (type == "text") return false;
  if (type == "json_object") return true;
  if (type == "json_schema")
    throw ApiError(400,
                   "response_format json_schema is not supported by this server (json_object is)",
                   "response_format", "unsupported");
  throw ApiError(400, "response_format type must be text or json_object, got " + quote(type),
                 "response_format", "invalid_value");
}

}  // namespace

ParsedRequest parse_request(const std::string& body, bool chat, const ServerConfig& config,
                            const TextCodec& codec, const Engine& engine) {
  // NOTE: nlohmann's parser stops at a NUL byte, taking what follows for the end of the input;
  // JSON has no raw NUL anywhere (a string holds it escaped).
  if (body.find('\0') != std::string::npos)
    throw ApiError(400, "the request body is not valid JSON (a NUL byte)", "", "invalid_json");
  if (nests_deeper_than(body, kMaxJsonDepth))
    throw ApiError(400,
                   "the request body nests arrays and objects deeper than " +
                       std::to_string(kMaxJsonDepth) + " levels",
                   "", "invalid_json");
  json j = json::parse(body, nullptr, false);
  if (j.is_discarded())
    throw ApiError(400, "the request body is not valid JSON", "", "invalid_json");
  if (!j.is_object())
    throw ApiError(400, "the request body must be a JSON object", "", "invalid_json");

  const json* model = field(j, "model");
  if (!model) throw ApiError(400, "model is required", "model", "missing_field");
  if (!model->is_string()) throw ApiError(400, "model must be a string", "model", "invalid_type");
  if (model->get<std::string>() != config.model_name)
    throw ApiError(404,
                   "The model " + quote(model->get<std::string>()) +
                       " does not exist; this server serves '" + config.model_name + "'",
                   "model", "model_not_found");

  check_unsupported(j, chat);
  const int32_t logprobs = parse_logprobs(j, chat);
  ParsedRequest p;
  p.chat = chat;
  p.stream = get_bool(j, "stream", false);
  if (const json* so = field(j, "stream_options")) {
    if (!so->is_object())
      throw ApiError(400, "stream_options must be an object", "stream_options", "invalid_type");
    if (!p.stream)
      throw ApiError(400, "stream_options is only allowed when stream is true", "stream_options",
                     "invalid_value");
    p.include_usage = get_bool(*so, "include_usage", false);
  }
  p.echo = !chat && get_bool(j, "echo", false);
  if (p.echo && logprobs >= 0)
    throw ApiError(400, "logprobs with echo (the prompt's log-probabilities) is not supported",
                   "logprobs", "unsupported");
  Request& r = p.req;
  r.sampling.logprobs = logprobs;
  r.n = int32_t(get_int(j, "n", 1, 1, Request::kMaxSequences));
  // best_of: candidates sampled, the n with the highest cumulative logprob returned; with
  // use_beam_search (vLLM's legacy API) it is the beam width unless beam_width is given.
  r.use_beam_search = get_bool(j, "use_beam_search", false);
  const int64_t best_of_max = r.use_beam_search ? Request::kMaxBeamWidth : Request::kMaxSequences;
  r.best_of = int32_t(get_int(j, "best_of", 0, 1, best_of_max));
  if (r.best_of > 0 && r.best_of < r.n)
    throw ApiError(
        400, "best_of must be >= n (" + std::to_string(r.n) + "), got " + std::to_string(r.best_of),
        "best_of", "invalid_value");
  r.beam_width = int32_t(get_int(j, "beam_width", 0, 1, Request::kMaxBeamWidth));
  if (field(j, "beam_width") && !r.use_beam_search)
    throw ApiError(400, "beam_width needs use_beam_search", "beam_width", "invalid_value");
  if (r.use_beam_search && r.width() < r.n)
    throw ApiError(400,
                   "the beam width (" + std::to_string(r.width()) + ") must be >= n (" +
                       std::to_string(r.n) + ")",
                   field(j, "beam_width") ? "beam_width" : "n", "invalid_value");
  r.length_penalty = float(get_number(j, "length_penalty", 1.0, -10.0, 10.0));
  if (p.stream && r.holds_output())
    throw ApiError(400,
                   r.use_beam_search ? "use_beam_search cannot be used with stream"
                                     : "best_of > n cannot be used with stream",
                   r.use_beam_search ? "use_beam_search" : "best_of", "invalid_value");
  r.sampling.temperature = float(get_number(j, "temperature", 1.0, 0.0, 2.0));
  r.sampling.top_p = get_float(j, "top_p", 1.0, 0.0, 1.0, true);
  r.sampling.top_k = int32_t(get_int(j, "top_k", 0, -1, 1 << 30));
  r.sampling.min_p = float(get_number(j, "min_p", 0.0, 0.0, 1.0));
  r.sampling.repetition_penalty = get_float(j, "repetition_penalty", 1.0, 0.0, 10.0, true);
  r.sampling.presence_penalty = float(get_number(j, "presence_penalty", 0.0, -2.0, 2.0));
  r.sampling.frequency_penalty = float(get_number(j, "frequency_penalty", 0.0, -2.0, 2.0));
  const int32_t vocab = engine.model().config().vocab_size;
  r.sampling.logit_bias = logit_bias(j, vocab);
  r.sampling.json_object = json_object_format(j);
  if (r.sampling.json_object && r.holds_output())
    throw ApiError(400, "response_format json_object cannot be used with best_of or beam search",
                   "response_format", "invalid_value");
  if (field(j, "seed")) {
    const int64_t seed = get_int(j, "seed", 0, INT64_MIN, INT64_MAX);
    r.seed = uint64_t(seed);
  }
  r.ignore_eos = get_bool(j, "ignore_eos", false);
  if (const json* salt = field(j, "cache_salt")) {
    if (!salt->is_string() || salt->get<std::string>().empty())
      throw ApiError(400, "cache_salt must be a non-empty string", "cache_salt", "invalid_type");
    r.cache_salt = salt->get<std::string>();
  }
  if (const json* stop = field(j, "stop")) {
    if (stop->is_string()) {
      r.sampling.stop.push_back(stop->get<std::string>());
    } else if (stop->is_array()) {
      for (const json& s : *stop) {
        if (!s.is_string())
          throw ApiError(400, "stop must be a string or an array of strings", "stop",
                         "invalid_type");
        r.sampling.stop.push_back(s.get<std::string>());
      }
    } else {
      throw ApiError(400, "stop must be a string or an array of strings", "stop", "invalid_type");
    }
    if (int32_t(r.sampling.stop.size()) > config.max_stop_strings)
      throw ApiError(400,
                     "stop takes at most " + std::to_string(config.max_stop_strings) + " strings",
                     "stop", "invalid_value");
    for (const std::string& s : r.sampling.stop)
      if (s.empty()) throw ApiError(400, "stop strings must not be empty", "stop", "invalid_value");
  }
  // vLLM's stop_token_ids: generation ends after one of these tokens (not shown).
  if (const json* ids = field(j, "stop_token_ids")) {
    constexpr size_t kMaxStopTokenIds = 1024;
    if (!ids->is_array() || ids->size() > kMaxStopTokenIds)
      throw ApiError(400,
                     "stop_token_ids must be an array of at most " +
                         std::to_string(kMaxStopTokenIds) + " token ids",
                     "stop_token_ids", "invalid_type");
    r.sampling.stop_token_ids = token_ids(*ids, vocab, "stop_token_ids entries", "stop_token_ids");
  }

  if (chat)
    p.prompts.push_back(chat_prompt(j, codec));
  else
    completion_prompts(j, codec, vocab, p);
  if (p.stream && p.prompts.size() > 1)
    throw ApiError(400, "a list of prompts cannot be streamed: send one request per prompt",
                   "prompt", "invalid_value");
  const char* prompt_field = chat ? "messages" : "prompt";
  int64_t len = 0;  // the longest prompt
  for (const std::vector<int32_t>& ids : p.prompts) {
    if (ids.empty())
      throw ApiError(400, std::string(prompt_field) + " is empty", prompt_field, "invalid_value");
    len = std::max(len, int64_t(ids.size()));
  }
  r.prompt = p.prompts[0];
  // NOTE: whether the prompt fits the context and the KV cache is the engine's check
  // (Engine::validate, at submit); the room left decides max_tokens here.
  const int64_t ctx = engine.max_model_len();
  const char* max_name =
      (chat && field(j, "max_completion_tokens")) ? "max_completion_tokens" : "max_tokens";
  const int64_t room = std::max<int64_t>(ctx - len, 1);  // a prompt that fills it is refused
  if (field(j, max_name)) {
    const int64_t mt = get_int(j, max_name, 0, std::numeric_limits<int64_t>::min(), INT64_MAX);
    if (mt <= 0)
      throw ApiError(400, std::string(max_name) + " must be at least 1, got " + std::to_string(mt),
                     max_name, "invalid_value");
    if (len < ctx && mt > room)
      throw ApiError(400,
                     "This model's maximum context length is " + std::to_string(ctx) +
                         " tokens; the prompt has " + std::to_string(len) + " and " + max_name +
                         " asks for " + std::to_string(mt),
                     max_name, "context_length_exceeded");
    r.max_tokens = int32_t(mt);
  } else {
    r.max_tokens = int32_t(std::min<int64_t>(chat ? config.default_chat_max_tokens : 16, room));
  }
  return p;
}

ApiError request_error(const RequestError& e, bool chat) {
  std::string message = e.what();
  const std::string op = "add_request: ";
  if (message.rfind(op, 0) == 0) message.erase(0, op.size());
  const std::string param = chat && e.param() == "prompt" ? "messages" : e.param();
  return ApiError(400, message, param, e.code());
}

}  // namespace pagedattn::api
