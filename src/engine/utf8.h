// UTF-8 helpers for streamed text: never hand out half a character.
#pragma once

#include <cstddef>
#include <string>

namespace pagedattn {

// Length of the longest prefix of s that does not end inside an incomplete
// UTF-8 character. Invalid bytes count as complete (they are replaced later,
// never held back forever).
inline size_t utf8_complete_prefix(const std::string &s) {
  const size_t n = s.size();
  for (size_t back = 1; back <= 4 && back <= n; ++back) {
    const unsigned char c = static_cast<unsigned char>(s[n - back]);
    if ((c & 0xC0) == 0x80) continue;  // a continuation byte: look further back
    size_t need = 1;
    if ((c & 0xE0) == 0xC0)
      need = 2;
    else if ((c & 0xF0) == 0xE0)
      need = 3;
    else if ((c & 0xF8) == 0xF0)
      need = 4;
    return need > back ? n - back : n;
  }
  return n;
}

// s with every invalid or incomplete sequence replaced by U+FFFD.
std::string utf8_sanitize(const std::string &s);

}  // namespace pagedattn
