// libFuzzer target: encode and decode of arbitrary bytes with every pre-tokenizer, and with a
// SentencePiece vocabulary.
//
// Input: byte 0 picks the tokenizer and the flags, the rest is the text. Checked properties
// (std::abort on a violation, which the fuzzer reports):
//   - every id is inside the vocabulary;
//   - decode(encode(text)) == text (every byte has a token, so nothing may be lost; SentencePiece:
//     for text without U+2581, which decodes as a space, without special tokens parsed, each of
//     which puts a space before the text after it, and without BOS);
//   - StreamDecoder gives the same text for valid UTF-8 (SentencePiece: after the space encode
//     put before it), and valid UTF-8 always;
//   - decoding the input read as int32 ids either succeeds or raises pagedattn::Error.
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <vector>

#include "fuzz_util.h"
#include "pagedattn/error.h"
#include "pagedattn/tokenizer.h"

using namespace pagedattn;

namespace {

const std::array<Tokenizer, 4>& tokenizers() {
  static const std::array<Tokenizer, 4> t = {
      fuzz::make_tokenizer(PreTokenizer::gpt2), fuzz::make_tokenizer(PreTokenizer::smollm),
      fuzz::make_tokenizer(PreTokenizer::llama3), fuzz::make_tokenizer(PreTokenizer::qwen2)};
  return t;
}

bool valid_utf8(const std::string& s) {
  for (size_t i = 0; i < s.size();) {
    const uint8_t c = uint8_t(s[i]);
    size_t n = c < 0x80 ? 1 : (c >> 5) == 6 ? 2 : (c >> 4) == 14 ? 3 : (c >> 3) == 30 ? 4 : 0;
    if (n == 0 || i + n > s.size()) return false;
    uint32_t cp = n == 1 ? c : n == 2 ? (c & 0x1F) : n == 3 ? (c & 0x0F) : (c & 0x07);
    for (size_t k = 1; k < n; ++k) {
      if ((uint8_t(s[i + k]) & 0xC0) != 0x80) return false;
      cp = (cp << 6) | (uint8_t(s[i + k]) & 0x3F);
    }
    static constexpr uint32_t kMin[] = {0, 0, 0x80, 0x800, 0x10000};
    if (cp < kMin[n] || cp > 0x10FFFF || (cp >= 0xD800 && cp <= 0xDFFF)) return false;
    i += n;
  }
  return true;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  static const Tokenizer spm = fuzz::make_sentencepiece_tokenizer();
  const Tokenizer& tok = data[0] & 32 ? spm : tokenizers()[data[0] & 3];
  const bool add_special = data[0] & 4, parse_special = data[0] & 8;
  const std::string text(reinterpret_cast<const char*>(data + 1), size - 1);

  const std::vector<int32_t> ids = tok.encode(text, add_special, parse_special);
  for (int32_t id : ids)
    if (id < 0 || id >= tok.vocab_size()) PA_FUZZ_FINDING();
  const bool exact = !tok.sentencepiece() || (!parse_special && !add_special &&
                                               text.find("\xE2\x96\x81") == std::string::npos);
  if (exact && tok.decode(ids) != text) PA_FUZZ_FINDING();

  StreamDecoder sd(tok);
  std::string streamed;
  for (int32_t id : ids) streamed += sd.push(id);
  streamed += sd.flush();
  if (!valid_utf8(streamed)) PA_FUZZ_FINDING();
  const std::string shown = tok.sentencepiece() && !text.empty() ? " " + text : text;
  if (exact && valid_utf8(text) && streamed != shown) PA_FUZZ_FINDING();

  std::vector<int32_t> raw((size - 1) / 4);
  if (!raw.empty()) std::memcpy(raw.data(), data + 1, raw.size() * 4);
  try {
    tok.decode(raw, data[0] & 16);
    StreamDecoder sd2(tok, data[0] & 16);
    for (int32_t id : raw) sd2.push(id);
  } catch (const Error&) {
  }
  return 0;
}
