// libFuzzer target: chat-template detection and rendering, and the rendered text tokenized.
//
// Input: NUL-separated fields: a Jinja template, then role/content pairs; byte 0 of the template
// field picks the family and add_generation_prompt. Bad roles (and mistral's alternation) must
// raise pagedattn::Error. Checked: each message's content appears in the ChatML rendering, and the
// family detected from a template is one of the three.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>
#include <vector>

#include "fuzz_util.h"
#include "pagedattn/chat_template.h"
#include "pagedattn/error.h"
#include "pagedattn/tokenizer.h"

using namespace pagedattn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const Tokenizer tok = fuzz::make_tokenizer(PreTokenizer::smollm);
  const uint8_t mode = data[0];
  std::vector<std::string> fields(1);
  for (size_t i = 1; i < size; ++i) {
    if (data[i] == 0)
      fields.emplace_back();
    else
      fields.back() += char(data[i]);
  }
  const std::string& tmpl = fields[0];
  std::vector<ChatMessage> msgs;
  for (size_t i = 1; i + 1 < fields.size(); i += 2) msgs.push_back({fields[i], fields[i + 1]});

  const ChatFamily detected = detect_chat_family(tmpl, (mode & 16) ? "mistral" : "llama");
  if (chat_family_name(detected) == "?") PA_FUZZ_FINDING();
  const std::string system = chatml_default_system(tmpl);
  const ChatFamily family = ChatFamily((mode & 3) % 3);
  const bool gen = mode & 4;
  try {
    const std::string text = apply_chat_template(family, msgs, gen, system);
    if (family == ChatFamily::chatml)
      for (const ChatMessage& m : msgs)
        if (text.find(m.content) == std::string::npos) PA_FUZZ_FINDING();
    for (int32_t id : tok.encode(text, false, true))
      if (id < 0 || id >= tok.vocab_size()) PA_FUZZ_FINDING();
  } catch (const Error&) {
  }
  try {
    apply_chat_template(tok, msgs, gen);
  } catch (const Error&) {
  }
  return 0;
}
