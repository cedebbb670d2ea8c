// Pre-tokenizer splits of the byte-level BPE families, written by hand over code points (each
// matcher below mirrors one alternative of the family's regex, tried in the regex's order), plus
// UTF-8 helpers and GPT-2's byte-to-unicode alphabet.
#include <array>

#include "pagedattn/error.h"
#include "tokenizer_internal.h"

namespace pagedattn {

constexpr uint32_t kInvalid = 0xFFFFFFFFu;

uint32_t utf8_decode(std::string_view s, size_t i, size_t& len) {
  const auto b = [&](size_t k) { return uint8_t(s[k]); };
  const uint8_t c = b(i);
  len = 1;
  if (c < 0x80) return c;
  size_t n;
  uint32_t cp, min;
  if (c >= 0xC2 && c <= 0xDF) n = 2, cp = c & 0x1F, min = 0x80;
  else if (c >= 0xE0 && c <= 0xEF) n = 3, cp = c & 0x0F, min = 0x800;
  else if (c >= 0xF0 && c <= 0xF4) n = 4, cp = c & 0x07, min = 0x10000;
  else return kInvalid;
  if (i + n > s.size()) return kInvalid;
  for (size_t k = 1; k < n; ++k) {
    if ((b(i + k) & 0xC0) != 0x80) return kInvalid;
    cp = (cp << 6) | (b(i + k) & 0x3F);
  }
  if (cp < min || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return kInvalid;
  len = n;
  return cp;
}

void utf8_append(std::string& out, uint32_t cp) {
  if (cp < 0x80) {
    out += char(cp);
  } else if (cp < 0x800) {
    out += char(0xC0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3F));
  } else if (cp < 0x10000) {
    out += char(0xE0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  } else {
    out += char(0xF0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3F));
    out += char(0x80 | ((cp >> 6) & 0x3F));
    out += char(0x80 | (cp & 0x3F));
  }
}

bool unicode_is_space(uint32_t cp) {
  if (cp <= 0x20) return cp == 0x20 || (cp >= 0x09 && cp <= 0x0D);
  switch (cp) {
    case 0x85: case 0xA0: case 0x1680: case 0x2028: case 0x2029: case 0x202F: case 0x205F:
    case 0x3000:
      return true;
  }
  return cp >= 0x2000 && cp <= 0x200A;
}

namespace {

struct ByteAlphabet {
  std::array<uint32_t, 256> to_cp{};
  std::array<int16_t, 324> to_byte{};  // code points 0..323 cover the whole alphabet
  ByteAlphabet() {
    to_byte.fill(-1);
    uint32_t extra = 256;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      to_cp[b] = printable ? uint32_t(b) : extra++;
      to_byte[to_cp[b]] = int16_t(b);
    }
  }
};
const ByteAlphabet& alphabet() {
  static const ByteAlphabet a;
  return a;
}

// The text as code points with byte offsets: cps[k] starts at off[k]; off[n] = text.size().
struct CodePoints {
  std::vector<uint32_t> cps;
  std::vector<size_t> off;
  explicit CodePoints(std::string_view s) {
    for (size_t i = 0; i < s.size();) {
      size_t len;
      cps.push_back(utf8_decode(s, i, len));
      off.push_back(i);
      i += len;
    }
    off.push_back(s.size());
  }
};

bool is_l(uint32_t c) { return c != kInvalid && unicode_is_letter(c); }
bool is_n(uint32_t c) { return c != kInvalid && unicode_is_number(c); }
bool is_s(uint32_t c) { return c != kInvalid && unicode_is_space(c); }
bool is_other(uint32_t c) { return !is_s(c) && !is_l(c) && !is_n(c); }
bool is_nl(uint32_t c) { return c == '\r' || c == '\n'; }

// 's 't 're 've 'm 'll 'd at i (case-insensitive when ci); returns the end or i.
size_t match_contraction(const std::vector<uint32_t>& c, size_t i, size_t n, bool ci) {
  if (c[i] != '\'' || i + 1 >= n) return i;
  auto low = [&](size_t k) { return k < n ? (ci && c[k] >= 'A' && c[k] <= 'Z' ? c[k] + 32 : c[k]) : 0u; };
  const uint32_t a = low(i + 1), b = low(i + 2);
  if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
  if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l')) return i + 3;
  return i;
}

template <class Pred>
size_t run(const std::vector<uint32_t>& c, size_t k, size_t n, Pred p) {
  while (k < n && p(c[k])) ++k;
  return k;
}

// \s+(?!\S) then \s+ at a whitespace position i: the run, less its last character when a
// non-space follows and the run is longer than one.
size_t match_space(const std::vector<uint32_t>& c, size_t i, size_t n) {
  const size_t j = run(c, i, n, is_s);
  return (j < n && j - i >= 2) ? j - 1 : j;
}

// 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
size_t match_gpt2(const std::vector<uint32_t>& c, size_t i, size_t n) {
  if (size_t e = match_contraction(c, i, n, false); e > i) return e;
  const size_t k = (c[i] == ' ' && i + 1 < n) ? i + 1 : i;
  if (is_l(c[k])) return run(c, k, n, is_l);
  if (is_n(c[k])) return run(c, k, n, is_n);
  if (is_other(c[k])) return run(c, k, n, is_other);
  return match_space(c, i, n);
}

// (?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,max_digits}|
//  ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+
size_t match_llama3(const std::vector<uint32_t>& c, size_t i, size_t n, size_t max_digits) {
  if (size_t e = match_contraction(c, i, n, true); e > i) return e;
  if (is_l(c[i])) return run(c, i, n, is_l);
  if (!is_nl(c[i]) && !is_n(c[i]) && i + 1 < n && is_l(c[i + 1])) return run(c, i + 1, n, is_l);
  if (is_n(c[i])) {
    size_t j = i;
    while (j < n && j - i < max_digits && is_n(c[j])) ++j;
    return j;
  }
  const size_t k = (c[i] == ' ' && i + 1 < n) ? i + 1 : i;
  if (is_other(c[k])) return run(c, run(c, k, n, is_other), n, is_nl);
  if (is_s(c[i])) {
    const size_t j = run(c, i, n, is_s);
    for (size_t q = j; q > i; --q)
      if (is_nl(c[q - 1])) return q;
    return match_space(c, i, n);
  }
  return i + 1;
}

}  // namespace

uint32_t byte_to_unicode(uint8_t b) { return alphabet().to_cp[b]; }

int unicode_to_byte(uint32_t cp) { return cp < 324 ? alphabet().to_byte[cp] : -1; }

PreTokenizer parse_pre_tokenizer(std::string_view name) {
  if (name == "gpt2" || name == "default" || name == "gpt-2") return PreTokenizer::gpt2;
  if (name == "smollm" || name == "starcoder" || name == "refact") return PreTokenizer::smollm;
  if (name == "llama-bpe" || name == "llama3" || name == "llama-v3" || name == "dbrx" ||
      name == "smaug-bpe")
    return PreTokenizer::llama3;
  if (name == "qwen2" || name == "qwen3") return PreTokenizer::qwen2;
  fail("parse_pre_tokenizer: unsupported pre-tokenizer '", name,
       "' (supported: gpt2, smollm, llama-bpe, qwen2)");
}

std::vector<std::string_view> pre_tokenize(PreTokenizer pre, std::string_view text) {
  const CodePoints cp(text);
  const auto& c = cp.cps;
  const size_t n = c.size();
  std::vector<std::string_view> out;
  auto emit = [&](size_t a, size_t b) { out.push_back(text.substr(cp.off[a], cp.off[b] - cp.off[a])); };
  // Matches [begin, end) piece by piece; smollm first isolates every digit.
  auto split = [&](size_t begin, size_t end) {
    for (size_t i = begin; i < end;) {
      size_t j;
      switch (pre) {
        case PreTokenizer::llama3: j = match_llama3(c, i, end, 3); break;
        case PreTokenizer::qwen2: j = match_llama3(c, i, end, 1); break;
        default: j = match_gpt2(c, i, end); break;
      }
      if (j <= i) j = i + 1;
      emit(i, j);
      i = j;
    }
  };
  if (pre != PreTokenizer::smollm) {
    split(0, n);
    return out;
  }
  size_t start = 0;
  for (size_t i = 0; i < n; ++i) {
    if (!is_n(c[i])) continue;
    split(start, i);
    emit(i, i + 1);
    start = i + 1;
  }
  split(start, n);
  return out;
}

}  // namespace pagedattn
