#include "utf8.h"

#include <cstdint>

namespace pagedattn {

std::string utf8_sanitize(const std::string &s) {
  static const char kReplacement[] = "\xEF\xBF\xBD";
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const unsigned char c = static_cast<unsigned char>(s[i]);
    size_t need = 0;
    uint32_t min_cp = 0;
    if (c < 0x80)
      need = 1;
    else if ((c & 0xE0) == 0xC0)
      need = 2, min_cp = 0x80;
    else if ((c & 0xF0) == 0xE0)
      need = 3, min_cp = 0x800;
    else if ((c & 0xF8) == 0xF0)
      need = 4, min_cp = 0x10000;
    bool ok = need > 0 && i + need <= s.size();
    uint32_t cp = need == 1 ? c : (c & (0xFF >> (need + 1)));
    for (size_t k = 1; ok && k < need; ++k) {
      const unsigned char d = static_cast<unsigned char>(s[i + k]);
      ok = (d & 0xC0) == 0x80;
      cp = (cp << 6) | (d & 0x3F);
    }
    ok = ok && (need == 1 || cp >= min_cp) && cp <= 0x10FFFF && !(cp >= 0xD800 && cp <= 0xDFFF);
    if (ok) {
      out.append(s, i, need);
      i += need;
    } else {
      out += kReplacement;
      ++i;
    }
  }
  return out;
}

}  // namespace pagedattn
