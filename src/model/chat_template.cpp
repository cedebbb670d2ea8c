// Chat templates of the supported families, rendered by hand. Each renderer reproduces what the
// family's reference Jinja template produces for system/user/assistant turns.
#include "pagedattn/chat_template.h"

#include <string>
#include <utility>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn {

namespace {

void check_roles(const std::vector<ChatMessage>& messages) {
  for (size_t i = 0; i < messages.size(); ++i) {
    const std::string& r = messages[i].role;
    PA_CHECK(r == "system" || r == "user" || r == "assistant", "apply_chat_template: messages[", i,
             "].role '", r, "' is not system, user or assistant");
  }
}

// A rendered conversation: its text, and which byte ranges of it the template wrote as control
// tokens (everything else is text: message contents, role names, separators).
struct Rendered {
  std::string text;
  std::vector<std::pair<size_t, size_t>> controls;  // [begin, end) byte ranges, ascending

  Rendered& control(std::string_view s) {
    controls.emplace_back(text.size(), text.size() + s.size());
    text.append(s);
    return *this;
  }
  Rendered& plain(std::string_view s) {
    text.append(s);
    return *this;
  }
};

// <|im_start|>{role}\n{content}<|im_end|>\n per message; a default system turn first when the
// template has one and the conversation starts without a system message.
void render_chatml(Rendered& out, const std::vector<ChatMessage>& messages, bool gen,
                   std::string_view default_system) {
  if (!default_system.empty() && (messages.empty() || messages[0].role != "system"))
    out.control("<|im_start|>").plain("system\n").plain(default_system).control("<|im_end|>").plain("\n");
  for (const auto& m : messages)
    out.control("<|im_start|>").plain(m.role).plain("\n").plain(m.content).control("<|im_end|>").plain("\n");
  if (gen) out.control("<|im_start|>").plain("assistant\n");
}

std::string_view trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

// Llama 3: contents are trimmed, as the reference template does.
void render_llama3(Rendered& out, const std::vector<ChatMessage>& messages, bool gen) {
  out.control("<|begin_of_text|>");
  for (const auto& m : messages)
    out.control("<|start_header_id|>")
        .plain(m.role)
        .control("<|end_header_id|>")
        .plain("\n\n")
        .plain(trim(m.content))
        .control("<|eot_id|>");
  if (gen) out.control("<|start_header_id|>").plain("assistant").control("<|end_header_id|>").plain("\n\n");
}

// Mistral Instruct: <s>[INST] {user} [/INST]{assistant}</s>; a leading system message is put
// before the first user message, separated by a blank line.
void render_mistral(Rendered& out, const std::vector<ChatMessage>& messages) {
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  out.control("<s>");
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool want_user = (i - first) % 2 == 0;
    PA_CHECK(m.role == (want_user ? "user" : "assistant"), "apply_chat_template: messages[", i,
             "].role '", m.role, "': mistral needs user and assistant turns to alternate");
    if (want_user) {
      out.control("[INST]").plain(" ");
      if (i == first && !system.empty()) out.plain(system).plain("\n\n");
      out.plain(m.content).plain(" ").control("[/INST]");
    } else {
      out.plain(m.content).control("</s>");
    }
  }
}

Rendered render(ChatFamily family, const std::vector<ChatMessage>& messages,
                bool add_generation_prompt, std::string_view default_system) {
  check_roles(messages);
  Rendered out;
  switch (family) {
    case ChatFamily::chatml:
      render_chatml(out, messages, add_generation_prompt, default_system);
      return out;
    case ChatFamily::llama3:
      render_llama3(out, messages, add_generation_prompt);
      return out;
    case ChatFamily::mistral:
      render_mistral(out, messages);
      return out;
  }
  fail("apply_chat_template: unknown family");
}

Rendered render(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                bool add_generation_prompt) {
  const ChatFamily f = detect_chat_family(tok);
  return render(f, messages, add_generation_prompt,
                f == ChatFamily::chatml ? chatml_default_system(tok.chat_template()) : "");
}

}  // namespace

std::string_view chat_family_name(ChatFamily f) {
  switch (f) {
    case ChatFamily::chatml: return "chatml";
    case ChatFamily::llama3: return "llama3";
    case ChatFamily::mistral: return "mistral";
  }
  return "?";
}

ChatFamily parse_chat_family(std::string_view name) {
  if (name == "chatml") return ChatFamily::chatml;
  if (name == "llama3") return ChatFamily::llama3;
  if (name == "mistral") return ChatFamily::mistral;
  fail("parse_chat_family: unknown family '", name, "' (chatml, llama3, mistral)");
}

ChatFamily detect_chat_family(std::string_view tmpl, std::string_view architecture) {
  if (tmpl.find("<|im_start|>") != std::string_view::npos) return ChatFamily::chatml;
  if (tmpl.find("<|start_header_id|>") != std::string_view::npos) return ChatFamily::llama3;
  if (tmpl.find("[INST]") != std::string_view::npos) return ChatFamily::mistral;
  if (architecture == "mistral") return ChatFamily::mistral;
  return ChatFamily::chatml;  // llama (SmolLM2), qwen2, qwen3
}

ChatFamily detect_chat_family(const Tokenizer& tok) {
  if (!tok.chat_template().empty()) return detect_chat_family(tok.chat_template(), "");
  if (tok.token_id("<|im_start|>") >= 0) return ChatFamily::chatml;
  if (tok.token_id("<|start_header_id|>") >= 0) return ChatFamily::llama3;
  if (tok.token_id("[INST]") >= 0) return ChatFamily::mistral;
  // SentencePiece vocabularies of the family (Llama 2, Mistral v0.1/v0.2) hold [INST] as text.
  if (tok.sentencepiece()) return ChatFamily::mistral;
  return ChatFamily::chatml;
}

std::string chatml_default_system(std::string_view tmpl) {
  // A template with a default system prompt writes it as one literal, e.g. (SmolLM2, Qwen2.5)
  //   {{ '<|im_start|>system\nYou are a helpful AI assistant ...<|im_end|>\n' }}
  // whereas the turn of a real system message is built from message['content'] (quotes, braces).
  const std::string_view open = "<|im_start|>system";
  for (size_t a = tmpl.find(open); a != std::string_view::npos; a = tmpl.find(open, a + 1)) {
    size_t p = a + open.size();
    if (tmpl.substr(p, 1) == "\n") p += 1;
    else if (tmpl.substr(p, 2) == "\\n") p += 2;
    else continue;
    const size_t e = tmpl.find("<|im_end|>", p);
    if (e == std::string_view::npos) break;
    const std::string_view body = tmpl.substr(p, e - p);
    if (body.empty() || body.find_first_of("'\"{}") != std::string_view::npos) continue;
    std::string out;
    for (size_t i = 0; i < body.size(); ++i) {
      if (body[i] == '\\' && i + 1 < body.size() && body[i + 1] == 'n') {
        out += '\n';
        ++i;
      } else {
        out += body[i];
      }
    }
    return out;
  }
  return "";
}

std::string apply_chat_template(ChatFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::string_view default_system) {
  return render(family, messages, add_generation_prompt, default_system).text;
}

std::string apply_chat_template(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  return render(tok, messages, add_generation_prompt).text;
}

std::vector<int32_t> encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt) {
  const Rendered r = render(tok, messages, add_generation_prompt);
  std::vector<int32_t> ids;
  // NOTE: the text between two control tokens is encoded as one piece, as encoding the whole
  // rendered text with parse_special would: the ids differ from that only where a message spells a
  // control token. A control marker the vocabulary does not hold as a special token ("[INST]" in
  // older Mistral vocabularies) is ordinary text there, and stays text here.
  size_t text_begin = 0;
  auto flush_text = [&](size_t end) {
    if (end > text_begin) {
      const auto t = tok.encode(std::string_view(r.text).substr(text_begin, end - text_begin),
                                false, false);
      ids.insert(ids.end(), t.begin(), t.end());
    }
  };
  for (const auto& [b, e] : r.controls) {
    const std::string_view marker = std::string_view(r.text).substr(b, e - b);
    const std::vector<int32_t> as_special = tok.encode(marker, false, true);
    if (as_special.size() != 1 || as_special == tok.encode(marker, false, false))
      continue;  // not split out by the vocabulary: stays part of the text around it
    flush_text(b);
    ids.push_back(as_special[0]);
    text_begin = e;
  }
  flush_text(r.text.size());
  return ids;
}

}  // namespace pagedattn
