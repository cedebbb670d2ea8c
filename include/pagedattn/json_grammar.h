// JSON as a pushdown automaton over bytes: which texts are prefixes of a JSON text whose top level
// is an object (RFC 8259, UTF-8). The sampler's json_object mode drops every candidate token whose
// bytes would leave no such prefix, and ends the sequence once the object is complete, so the
// output always parses (or, cut by max_tokens, is a prefix of a text that does).
//
//   state: a stack of open containers ('o' object, 'a' array) and where the lexer is inside the
//   current token (string, escape, \uXXXX digits, UTF-8 continuation bytes, number part, literal).
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace pagedattn {

class JsonPrefix {
 public:
  // Feeds bytes. Returns false, the state unchanged, when they would leave no valid prefix.
  bool feed(std::string_view bytes);
  // Whether feed(bytes) would succeed (the state is not changed).
  bool accepts(std::string_view bytes) const;
  // The top-level object is closed: the text is a whole JSON text (nothing may follow).
  bool complete() const { return where_ == Where::done; }
  int depth() const { return int(stack_.size()); }

 private:
  enum class Where : uint8_t {
    start,           // before the top-level '{'
    key_or_close,    // after '{': a key or '}'
    key,             // after ',' in an object: a key
    colon,           // after a key
    value,           // after ':' or ',' in an array: a value
    value_or_close,  // after '[': a value or ']'
    after_value,     // ',' or the closing bracket of the innermost container
    string,          // inside a string (key or value)
    escape,          // after a backslash
    unicode,         // inside \uXXXX (hex_left digits to come)
    low_backslash,   // after a high surrogate \uD8xx: its low half's backslash
    low_u,           // ... and its 'u'
    utf8,            // inside a multi-byte UTF-8 character (cont_left bytes to come)
    number,          // inside a number (num says where)
    literal,         // inside true / false / null (lit_rest to come)
    done,            // the top-level object is closed
  };
  enum class Num : uint8_t { minus, zero, integer, dot, fraction, exp, exp_sign, exponent };

  bool step(unsigned char c);
  bool begin_value(unsigned char c);
  bool close(unsigned char c);
  void end_value();

  Where where_ = Where::start;
  bool string_is_key_ = false;
  Num num_ = Num::integer;
  uint8_t hex_left_ = 0;
  uint32_t hex_value_ = 0;
  bool want_low_ = false;  // the \uXXXX being read must be a low surrogate
  uint8_t cont_left_ = 0;
  unsigned char cont_lo_ = 0x80, cont_hi_ = 0xBF;  // the next continuation byte's range
  const char* lit_rest_ = nullptr;
  std::string stack_;
};

// Sets to -inf the logits of tokens that the prefix cannot take next: bytes that break it, tokens
// with no bytes (special tokens, end of sequence) while the object is open. token_bytes: [vocab].
// Returns how many tokens remain.
int64_t mask_json_logits(const JsonPrefix& prefix, const std::vector<std::string>& token_bytes,
                         std::span<float> logits);

}  // namespace pagedattn
