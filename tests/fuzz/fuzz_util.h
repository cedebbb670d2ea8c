// Helpers shared by the libFuzzer targets: an input as a file path (the readers take paths), and a
// small byte-level BPE tokenizer built from parts (every byte, a few merges, ChatML's specials).
#pragma once

#include <sys/mman.h>
#include <unistd.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "pagedattn/model_file.h"
#include "pagedattn/tokenizer.h"

namespace pagedattn::fuzz {

// A property of the code under test does not hold: say where, and abort (the fuzzer saves the
// input; the replay fails).
[[noreturn]] inline void finding(const char* file, int line) {
  std::fprintf(stderr, "fuzz finding: property at %s:%d does not hold\n", file, line);
  std::abort();
}
#define PA_FUZZ_FINDING() ::pagedattn::fuzz::finding(__FILE__, __LINE__)

// The bytes in an anonymous in-memory file, reachable by path while the object lives.
class MemFile {
 public:
  MemFile(const uint8_t* data, size_t size) {
    fd_ = memfd_create("pagedattn-fuzz", MFD_CLOEXEC);
    if (fd_ < 0) {
      std::perror("memfd_create");
      std::abort();  // the harness, not the code under test
    }
    for (size_t done = 0; done < size;) {
      const ssize_t n = ::write(fd_, data + done, size - done);
      if (n <= 0) std::abort();
      done += size_t(n);
    }
    path_ = "/proc/self/fd/" + std::to_string(fd_);
  }
  ~MemFile() { ::close(fd_); }
  MemFile(const MemFile&) = delete;
  MemFile& operator=(const MemFile&) = delete;
  const std::string& path() const { return path_; }

 private:
  int fd_ = -1;
  std::string path_;
};

// GPT-2's byte-to-unicode alphabet, as UTF-8 (the vocabulary strings of byte-level BPE).
inline std::string byte_token(uint8_t b) {
  auto printable = [](int c) {
    return (c >= 33 && c <= 126) || (c >= 161 && c <= 172) || c >= 174;
  };
  int cp = b;
  if (!printable(b)) {
    int n = 0;
    for (int c = 0; c < b; ++c) n += !printable(c);
    cp = 256 + n;
  }
  std::string s;
  if (cp < 0x80) {
    s += char(cp);
  } else {
    s += char(0xC0 | (cp >> 6));
    s += char(0x80 | (cp & 0x3F));
  }
  return s;
}

// 256 byte tokens, merged tokens for a few common pairs, then the ChatML specials (control).
inline Tokenizer make_tokenizer(PreTokenizer pre) {
  std::vector<std::string> vocab;
  std::vector<TokenType> types;
  for (int b = 0; b < 256; ++b) vocab.push_back(byte_token(uint8_t(b)));
  const std::string sp = byte_token(' ');  // "Ġ"
  const std::vector<std::pair<std::string, std::string>> pairs = {
      {sp, "t"},
      {"h", "e"},
      {sp + "t", "he"},
      {"i", "n"},
      {"in", "g"},
      {sp, "a"},
      {"e", "r"},
      {sp, sp},
      {"1", "2"},
      {"12", "3"},
      {byte_token('\n'), byte_token('\n')}};
  std::vector<std::string> merges;
  for (const auto& [a, b] : pairs) {
    merges.push_back(a + " " + b);
    vocab.push_back(a + b);
  }
  types.assign(vocab.size(), TokenType::normal);
  for (const char* s : {"<|endoftext|>", "<|im_start|>", "<|im_end|>"}) {
    vocab.push_back(s);
    types.push_back(TokenType::control);
  }
  const int32_t eos = int32_t(vocab.size()) - 1;
  return Tokenizer::from_parts(vocab, merges, types, pre, eos - 2, eos, false,
                               "{{ '<|im_start|>system\\nYou are a fuzzer.<|im_end|>\\n' }}");
}

// A small SentencePiece BPE vocabulary: <unk>, <s>, </s>, the 256 byte tokens and a few pieces
// (spaces as U+2581), scores falling with the id.
inline Tokenizer make_sentencepiece_tokenizer() {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>"};
  std::vector<TokenType> types = {TokenType::unknown, TokenType::control, TokenType::control};
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    pieces.push_back(name);
    types.push_back(TokenType::byte);
  }
  const std::string sp = "\xE2\x96\x81";
  for (const std::string& p : {sp, sp + "t", std::string("he"), sp + "the", std::string("in"),
                               std::string("ing"), sp + "a", std::string("er"), sp + sp,
                               std::string("1"), std::string("2"), std::string("12"),
                               std::string("\xC3\xA9"), std::string("\xE6\x97\xA5"),
                               std::string("t"), std::string("h"), std::string("e"),
                               std::string("i"), std::string("n"), std::string("g"),
                               std::string("a"), std::string("r")}) {
    pieces.push_back(p);
    types.push_back(TokenType::normal);
  }
  std::vector<float> scores(pieces.size());
  for (size_t i = 0; i < scores.size(); ++i) scores[i] = -float(i);
  return Tokenizer::from_sentencepiece(pieces, scores, types, 1, 2, true, true);
}

// What an accepted model configuration must be for the runtime to use it: positive dimensions,
// query heads a multiple of KV heads, finite positive RoPE and norm constants, real token ids.
inline bool config_is_usable(const ModelConfig& c) {
  const RopeScaling& rs = c.rope_scaling;
  bool ok = c.vocab_size > 0 && c.hidden_size > 0 && c.intermediate_size > 0 && c.num_layers > 0 &&
            c.num_q_heads > 0 && c.num_kv_heads > 0 && c.head_dim > 0 &&
            c.num_q_heads % c.num_kv_heads == 0 && c.max_position_embeddings > 0 &&
            std::isfinite(c.rope_theta) && c.rope_theta > 0 && std::isfinite(c.rms_norm_eps) &&
            c.rms_norm_eps >= 0 && std::isfinite(rs.factor) && std::isfinite(rs.low_freq_factor) &&
            std::isfinite(rs.high_freq_factor) && c.sliding_window >= 0 && c.bos_token_id >= -1;
  for (int32_t e : c.eos_token_ids) ok = ok && e >= 0;
  return ok;
}

}  // namespace pagedattn::fuzz
