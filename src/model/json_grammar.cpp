// The JSON prefix automaton (see json_grammar.h): one byte at a time, rejecting a byte as soon as
// no JSON text (top level an object) can continue the text with it.
#include "pagedattn/json_grammar.h"

#include <cmath>
#include <limits>

#include "pagedattn/error.h"

namespace pagedattn {

namespace {

bool is_ws(unsigned char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r'; }
bool is_digit(unsigned char c) { return c >= '0' && c <= '9'; }
int hex_digit(unsigned char c) {
  if (c >= '0' && c <= '9') return c - '0';
  if (c >= 'a' && c <= 'f') return c - 'a' + 10;
  if (c >= 'A' && c <= 'F') return c - 'A' + 10;
  return -1;
}

}  // namespace

void JsonPrefix::end_value() { where_ = stack_.empty() ? Where::done : Where::after_value; }

bool JsonPrefix::close(unsigned char c) {
  if (stack_.empty() || stack_.back() != (c == '}' ? 'o' : 'a')) return false;
  stack_.pop_back();
  end_value();
  return true;
}

bool JsonPrefix::begin_value(unsigned char c) {
  switch (c) {
    case '"':
      where_ = Where::string;
      string_is_key_ = false;
      return true;
    case '{':
      stack_.push_back('o');
      where_ = Where::key_or_close;
      return true;
    case '[':
      stack_.push_back('a');
      where_ = Where::value_or_close;
      return true;
    case '-':
      where_ = Where::number;
      num_ = Num::minus;
      return true;
    case 't':
      lit_rest_ = "rue";
      where_ = Where::literal;
      return true;
    case 'f':
      lit_rest_ = "alse";
      where_ = Where::literal;
      return true;
    case 'n':
      lit_rest_ = "ull";
      where_ = Where::literal;
      return true;
    default:
      if (!is_digit(c)) return false;
      where_ = Where::number;
      num_ = c == '0' ? Num::zero : Num::integer;
      return true;
  }
}

bool JsonPrefix::step(unsigned char c) {
  switch (where_) {
    case Where::start:
      if (is_ws(c)) return true;
      if (c != '{') return false;
      stack_.push_back('o');
      where_ = Where::key_or_close;
      return true;
    case Where::key_or_close:
    case Where::key:
      if (is_ws(c)) return true;
      if (c == '}' && where_ == Where::key_or_close) return close(c);
      if (c != '"') return false;
      where_ = Where::string;
      string_is_key_ = true;
      return true;
    case Where::colon:
      if (is_ws(c)) return true;
      if (c != ':') return false;
      where_ = Where::value;
      return true;
    case Where::value:
      return is_ws(c) || begin_value(c);
    case Where::value_or_close:
      if (is_ws(c)) return true;
      if (c == ']') return close(c);
      return begin_value(c);
    case Where::after_value:
      if (is_ws(c)) return true;
      if (c == ',') {
        where_ = stack_.back() == 'o' ? Where::key : Where::value;
        return true;
      }
      return (c == '}' || c == ']') && close(c);
    case Where::string:
      if (c == '"') {
        if (string_is_key_)
          where_ = Where::colon;
        else
          end_value();
        return true;
      }
      if (c == '\\') {
        where_ = Where::escape;
        return true;
      }
      if (c < 0x20) return false;  // control characters must be escaped
      if (c < 0x80) return true;
      // A UTF-8 lead byte and the range of the byte after it (no overlong forms, no surrogates,
      // nothing above U+10FFFF).
      cont_lo_ = 0x80;
      cont_hi_ = 0xBF;
      if (c >= 0xC2 && c <= 0xDF) {
        cont_left_ = 1;
      } else if (c >= 0xE0 && c <= 0xEF) {
        cont_left_ = 2;
        if (c == 0xE0) cont_lo_ = 0xA0;
        if (c == 0xED) cont_hi_ = 0x9F;
      } else if (c >= 0xF0 && c <= 0xF4) {
        cont_left_ = 3;
        if (c == 0xF0) cont_lo_ = 0x90;
        if (c == 0xF4) cont_hi_ = 0x8F;
      } else {
        return false;
      }
      where_ = Where::utf8;
      return true;
    case Where::utf8:
      if (c < cont_lo_ || c > cont_hi_) return false;
      cont_lo_ = 0x80;
      cont_hi_ = 0xBF;
      if (--cont_left_ == 0) where_ = Where::string;
      return true;
    case Where::escape:
      if (c == 'u') {
        where_ = Where::unicode;
        hex_left_ = 4;
        hex_value_ = 0;
        return true;
      }
      if (c == '"' || c == '\\' || c == '/' || c == 'b' || c == 'f' || c == 'n' || c == 'r' ||
          c == 't') {
        where_ = Where::string;
        return true;
      }
      return false;
    case Where::unicode: {
      const int h = hex_digit(c);
      if (h < 0) return false;
      const int index = 4 - hex_left_;
      hex_value_ = hex_value_ * 16 + uint32_t(h);
      // A low surrogate (DC00-DFFF) only right after a high one, and right after a high one only
      // a low one: decided by the first two digits.
      if (want_low_ && ((index == 0 && h != 0xD) || (index == 1 && h < 0xC))) return false;
      if (!want_low_ && index == 1 && hex_value_ >= 0xDC && hex_value_ <= 0xDF) return false;
      if (--hex_left_ > 0) return true;
      if (!want_low_ && hex_value_ >= 0xD800 && hex_value_ <= 0xDBFF) {
        want_low_ = true;
        where_ = Where::low_backslash;
      } else {
        want_low_ = false;
        where_ = Where::string;
      }
      return true;
    }
    case Where::low_backslash:
      if (c != '\\') return false;
      where_ = Where::low_u;
      return true;
    case Where::low_u:
      if (c != 'u') return false;
      where_ = Where::unicode;
      hex_left_ = 4;
      hex_value_ = 0;
      return true;
    case Where::number:
      switch (num_) {
        case Num::minus:
          if (!is_digit(c)) return false;
          num_ = c == '0' ? Num::zero : Num::integer;
          return true;
        case Num::dot:
          if (!is_digit(c)) return false;
          num_ = Num::fraction;
          return true;
        case Num::exp:
          if (c == '+' || c == '-') {
            num_ = Num::exp_sign;
            return true;
          }
          [[fallthrough]];
        case Num::exp_sign:
          if (!is_digit(c)) return false;
          num_ = Num::exponent;
          return true;
        case Num::integer:
        case Num::fraction:
        case Num::exponent:
          if (is_digit(c)) return true;
          [[fallthrough]];
        case Num::zero:
          if (c == '.' && (num_ == Num::zero || num_ == Num::integer)) {
            num_ = Num::dot;
            return true;
          }
          if ((c == 'e' || c == 'E') && num_ != Num::exponent) {
            num_ = Num::exp;
            return true;
          }
          // The number ended; the byte belongs to what follows it.
          end_value();
          return step(c);
      }
      return false;
    case Where::literal:
      if (c != static_cast<unsigned char>(*lit_rest_)) return false;
      if (*++lit_rest_ == '\0') end_value();
      return true;
    case Where::done:
      return is_ws(c);
  }
  return false;
}

bool JsonPrefix::feed(std::string_view bytes) {
  JsonPrefix next = *this;
  for (char c : bytes)
    if (!next.step(static_cast<unsigned char>(c))) return false;
  *this = std::move(next);
  return true;
}

bool JsonPrefix::accepts(std::string_view bytes) const {
  JsonPrefix next = *this;
  for (char c : bytes)
    if (!next.step(static_cast<unsigned char>(c))) return false;
  return true;
}

int64_t mask_json_logits(const JsonPrefix& prefix, const std::vector<std::string>& token_bytes,
                         std::span<float> logits) {
  PA_CHECK(token_bytes.size() == logits.size(), "mask_json_logits: ", token_bytes.size(),
           " token byte strings for ", logits.size(), " logits");
  constexpr float kNegInf = -std::numeric_limits<float>::infinity();
  int64_t kept = 0;
  for (size_t t = 0; t < logits.size(); ++t) {
    if (logits[t] == kNegInf) continue;
    const std::string& b = token_bytes[t];
    if (b.empty() || !prefix.accepts(b)) {
      logits[t] = kNegInf;
    } else {
      ++kept;
    }
  }
  return kept;
}

}  // namespace pagedattn
