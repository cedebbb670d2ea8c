// Internals shared by the tokenizer's translation units: Unicode classes, UTF-8 and the
// pre-tokenizer split.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "pagedattn/tokenizer.h"

namespace pagedattn {

// General categories L* and N* (tables generated from unicodedata).
bool unicode_is_letter(uint32_t cp);
bool unicode_is_number(uint32_t cp);
// The White_Space property (what \s matches in the tokenizers' regex engine).
bool unicode_is_space(uint32_t cp);

// Decodes the code point at s[i]; len is its length in bytes. An invalid or truncated sequence
// yields one byte with cp = 0xFFFFFFFF (a code point of no class).
uint32_t utf8_decode(std::string_view s, size_t i, size_t& len);
void utf8_append(std::string& out, uint32_t cp);

// Splits text into pre-tokens (views into text) by the family's regex.
std::vector<std::string_view> pre_tokenize(PreTokenizer pre, std::string_view text);

// GPT-2's byte-to-unicode alphabet: byte b -> a code point (printable bytes map to themselves).
uint32_t byte_to_unicode(uint8_t b);
// The inverse; -1 for a code point outside the alphabet.
int unicode_to_byte(uint32_t cp);

}  // namespace pagedattn
