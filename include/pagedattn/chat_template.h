// Chat templates of the supported families, rendered by hand (no Jinja engine).
//
//   chatml  (SmolLM2, Qwen2/3): <|im_start|>{role}\n{content}<|im_end|>\n ... <|im_start|>assistant\n
//   llama3  : <|begin_of_text|><|start_header_id|>{role}<|end_header_id|>\n\n{content}<|eot_id|> ...
//   mistral : <s>[INST] {user} [/INST]{assistant}</s>[INST] ... (a system message joins the first
//             user turn, separated by a blank line)
//
// The rendered text carries its own BOS where the family has one. encode_chat() tokenizes a
// conversation for a model: the template's markers become control tokens, the messages' text is
// tokenized as text (a "<|im_end|>" typed by a user stays text and cannot close the turn).
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn {

class Tokenizer;

enum class ChatFamily : uint8_t { chatml, llama3, mistral };
std::string_view chat_family_name(ChatFamily f);
// "chatml", "llama3", "mistral" (throws Error otherwise).
ChatFamily parse_chat_family(std::string_view name);

struct ChatMessage {
  std::string role;  // "system", "user" or "assistant"
  std::string content;
};

// The family of a Jinja chat template by its markers; an empty or unrecognised template falls back
// to the architecture ("llama" with a Llama-3 vocabulary is decided by the tokenizer overload).
ChatFamily detect_chat_family(std::string_view chat_template, std::string_view architecture);
// The family for a tokenizer: its template when it has one, else its special tokens
// (<|im_start|>, <|start_header_id|>, [INST]), else mistral for a SentencePiece vocabulary (Llama
// 2, Mistral v0.1/v0.2), else chatml.
ChatFamily detect_chat_family(const Tokenizer& tok);

// The default system prompt a ChatML template inserts when the conversation has none
// (SmolLM2 and Qwen2.5 templates do), or "" when it inserts none.
std::string chatml_default_system(std::string_view chat_template);

// Renders the conversation. Roles other than system/user/assistant throw Error; mistral also
// requires user and assistant turns to alternate after an optional leading system message.
std::string apply_chat_template(ChatFamily family, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt, std::string_view default_system = "");
// Family and default system prompt taken from the tokenizer's template.
std::string apply_chat_template(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                bool add_generation_prompt);
// The ids of the rendered conversation: control tokens only where the template put them (its
// markers that the vocabulary holds as special tokens), everything else encoded as text. Without
// markers in the messages these equal tok.encode(apply_chat_template(...), false, true).
std::vector<int32_t> encode_chat(const Tokenizer& tok, const std::vector<ChatMessage>& messages,
                                 bool add_generation_prompt);

}  // namespace pagedattn
