// libFuzzer target: the server's request parser (api::parse_request), called directly: a JSON body
// to a checked Request, over an engine of the fake model and a byte-level BPE tokenizer with the
// ChatML template (what `serve` wires up). Input: byte 0 picks completions or chat, the rest is the
// body. Bad input must raise api::ApiError (a 4xx the client can read); any other exception, a
// crash or a sanitizer report is a finding. An accepted request must be one the engine accepts.
#include <cstdint>
#include <cstdlib>
#include <memory>
#include <string>

#include "engine/fake_model.h"
#include "fuzz_util.h"
#include "openai_api.h"
#include "pagedattn/chat_template.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"

using namespace pagedattn;

namespace {

struct Fixture {
  Tokenizer tok = fuzz::make_tokenizer(PreTokenizer::smollm);
  std::unique_ptr<Engine> engine;
  TextCodec codec;
  ServerConfig config;
  Fixture() {
    EngineConfig ec;
    ec.kv_cache_tokens = 1024;
    ec.page_size = 16;
    ec.log_startup = false;
    engine = std::make_unique<Engine>(
        std::make_unique<fakes::FakeModel>(tok.vocab_size(), std::vector<int32_t>{tok.eos_id()},
                                           512),
        ec, [this](const std::vector<int32_t>& ids) { return tok.decode(ids); });
    codec.encode = [this](const std::string& t) { return tok.encode(t, true, false); };
    codec.encode_chat = [this](const std::vector<ChatMessage>& m) {
      return tok.encode(apply_chat_template(tok, m, true), false, true);
    };
    config.model_name = "fuzz";
  }
};

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static Fixture* fx = new Fixture();  // NOTE: lives for the process (libFuzzer never returns)
  const bool chat = data[0] & 1;
  const std::string body(reinterpret_cast<const char*>(data + 1), size - 1);
  try {
    const api::ParsedRequest p = api::parse_request(body, chat, fx->config, fx->codec, *fx->engine);
    if (p.req.prompt.empty() || p.req.max_tokens < 1) PA_FUZZ_FINDING();
    for (const std::vector<int32_t>& ids : p.prompts) {  // what submit checks, prompt by prompt
      Request r = p.req;
      r.prompt = ids;
      fx->engine->validate(r);
    }
  } catch (const api::ApiError& e) {
    if (e.status < 400 || e.status >= 500) PA_FUZZ_FINDING();  // a client error is a 4xx
  } catch (const RequestError& e) {
    if (api::request_error(e, chat).status != 400) PA_FUZZ_FINDING();  // the engine's refusal
  }
  return 0;
}
