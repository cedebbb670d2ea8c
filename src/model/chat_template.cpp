// Chat templates of the supported families, rendered by hand. Each renderer reproduces what the
// family's reference Jinja template produces for system/user/assistant turns.
#include "pagedattn/chat_template.h"

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

// <|im_start|>{role}\n{content}<|im_end|>\n per message; a default system turn first when the
// template has one and the conversation starts without a system message.
std::string render_chatml(const std::vector<ChatMessage>& messages, bool gen,
                          std::string_view default_system) {
  std::string out;
  if (!default_system.empty() && (messages.empty() || messages[0].role != "system"))
    out.append("<|im_start|>system\n").append(default_system).append("<|im_end|>\n");
  for (const auto& m : messages)
    out.append("<|im_start|>").append(m.role).append("\n").append(m.content).append("<|im_end|>\n");
  if (gen) out += "<|im_start|>assistant\n";
  return out;
}

std::string_view trim(std::string_view s) {
  const char* ws = " \t\n\r\f\v";
  const size_t a = s.find_first_not_of(ws);
  if (a == std::string_view::npos) return {};
  return s.substr(a, s.find_last_not_of(ws) - a + 1);
}

// Llama 3: contents are trimmed, as the reference template does.
std::string render_llama3(const std::vector<ChatMessage>& messages, bool gen) {
  std::string out = "<|begin_of_text|>";
  for (const auto& m : messages)
    out.append("<|start_header_id|>")
        .append(m.role)
        .append("<|end_header_id|>\n\n")
        .append(trim(m.content))
        .append("<|eot_id|>");
  if (gen) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
  return out;
}

// Mistral Instruct: <s>[INST] {user} [/INST]{assistant}</s>; a leading system message is put
// before the first user message, separated by a blank line.
std::string render_mistral(const std::vector<ChatMessage>& messages) {
  size_t first = 0;
  std::string system;
  if (!messages.empty() && messages[0].role == "system") {
    system = messages[0].content;
    first = 1;
  }
  std::string out = "<s>";
  for (size_t i = first; i < messages.size(); ++i) {
    const ChatMessage& m = messages[i];
    const bool want_user = (i - first) % 2 == 0;
    PA_CHECK(m.role == (want_user ? "user" : "assistant"), "apply_chat_template: messages[", i,
             "].role '", m.role, "': mistral needs user and assistant turns to alternate");
    if (want_user) {
      out += "[INST] ";
      if (i == first && !system.empty()) out.append(system).append("\n\n");
      out.append(m.content).append(" [/INST]");
    } else {
      out.append(m.content).append("</s>");
    }
  }
  return out;
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
  check_roles(messages);
  switch (family) {
    case ChatFamily::chatml: return render_chatml(messages, add_generation_prompt, default_system);
    case ChatFamily::llama3: return render_llama3(messages, add_generation_prompt);
    case ChatFamily::mistral: return render_mistral(messages);
  }
  fail("apply_chat_template: unknown family");
}

std::string apply_chat_template(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt) {
  const ChatFamily f = detect_chat_family(tok);
  return apply_chat_template(f, messages, add_generation_prompt,
                             f == ChatFamily::chatml ? chatml_default_system(tok.chat_template()) : "");
}

}  // namespace pagedattn
