// Byte-level BPE: special tokens split out, pre-tokenizer split, bytes mapped to GPT-2's alphabet,
// adjacent pairs merged lowest rank first (leftmost first among equal ranks). SentencePiece BPE:
// spaces as U+2581, characters merged highest score first (leftmost first among equal scores),
// byte fallback for what the vocabulary lacks.
#include "pagedattn/tokenizer.h"

#include <algorithm>
#include <cstdio>
#include <queue>

#include "pagedattn/error.h"
#include "tokenizer_internal.h"

namespace pagedattn {

namespace {

uint64_t pair_key(int32_t a, int32_t b) { return (uint64_t(uint32_t(a)) << 32) | uint32_t(b); }

bool is_added(TokenType t) { return t == TokenType::control || t == TokenType::user_defined; }

constexpr std::string_view kSpmSpace = "\xE2\x96\x81";  // U+2581, SentencePiece's space

}  // namespace

Tokenizer Tokenizer::from_sentencepiece(std::vector<std::string> pieces, std::vector<float> scores,
                                        std::vector<TokenType> types, int32_t bos_id,
                                        int32_t eos_id, bool add_bos, bool add_space_prefix,
                                        std::string chat_template) {
  const size_t n = pieces.size();
  if (scores.empty()) scores.assign(n, 0.f);
  PA_CHECK(scores.size() == n, "Tokenizer: scores has ", scores.size(), " entries, pieces ", n);
  Tokenizer t = from_parts(std::move(pieces), {}, std::move(types), PreTokenizer::gpt2, bos_id,
                           eos_id, add_bos, std::move(chat_template));
  t.spm_ = true;
  t.ignore_merges_ = false;
  t.add_space_prefix_ = add_space_prefix;
  t.scores_ = std::move(scores);
  for (int b = 0; b < 256; ++b) {
    char name[8];
    std::snprintf(name, sizeof(name), "<0x%02X>", b);
    t.spm_byte_ids_[size_t(b)] = t.token_id(name);
  }
  return t;
}

Tokenizer Tokenizer::from_parts(std::vector<std::string> vocab, const std::vector<std::string>& merges,
                                std::vector<TokenType> types, PreTokenizer pre, int32_t bos_id,
                                int32_t eos_id, bool add_bos, std::string chat_template) {
  Tokenizer t;
  PA_CHECK(!vocab.empty(), "Tokenizer: vocab is empty");
  if (types.empty()) types.assign(vocab.size(), TokenType::normal);
  PA_CHECK(types.size() == vocab.size(), "Tokenizer: types has ", types.size(), " entries, vocab ",
           vocab.size());
  const int32_t n = int32_t(vocab.size());
  PA_CHECK(bos_id >= -1 && bos_id < n, "Tokenizer: bos_id ", bos_id, " is outside the vocabulary");
  PA_CHECK(eos_id >= -1 && eos_id < n, "Tokenizer: eos_id ", eos_id, " is outside the vocabulary");
  t.vocab_ = std::move(vocab);
  t.types_ = std::move(types);
  t.pre_ = pre;
  t.bos_id_ = bos_id;
  t.eos_id_ = eos_id;
  t.add_bos_ = add_bos;
  t.chat_template_ = std::move(chat_template);
  t.ignore_merges_ = pre == PreTokenizer::llama3;
  t.build_index(merges);
  return t;
}

void Tokenizer::build_index(const std::vector<std::string>& merges) {
  ids_.clear();
  ids_.reserve(vocab_.size());
  special_ids_.clear();
  for (int32_t i = 0; i < int32_t(vocab_.size()); ++i) {
    ids_.emplace(vocab_[size_t(i)], i);  // the first of duplicate strings wins
    if (is_added(types_[size_t(i)]) && !vocab_[size_t(i)].empty()) special_ids_.push_back(i);
    if (types_[size_t(i)] == TokenType::unknown && unk_id_ < 0) unk_id_ = i;
  }
  std::stable_sort(special_ids_.begin(), special_ids_.end(), [&](int32_t a, int32_t b) {
    return vocab_[size_t(a)].size() > vocab_[size_t(b)].size();
  });
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode(uint8_t(b)));
    byte_ids_[size_t(b)] = token_id(s);
  }
  merges_.clear();
  merges_.reserve(merges.size());
  for (size_t r = 0; r < merges.size(); ++r) {
    const std::string& m = merges[r];
    const size_t sp = m.find(' ', 1);
    PA_CHECK(sp != std::string::npos && sp + 1 < m.size(), "Tokenizer: merge ", r, " '", m,
             "' is not two tokens separated by a space");
    const std::string a = m.substr(0, sp), b = m.substr(sp + 1);
    const int32_t ia = token_id(a), ib = token_id(b), iab = token_id(a + b);
    PA_CHECK(ia >= 0 && ib >= 0 && iab >= 0, "Tokenizer: merge ", r, " '", m,
             "' refers to a token that is not in the vocabulary");
    merges_.emplace(pair_key(ia, ib), Merge{int32_t(r), iab});  // the first rank of a pair wins
  }
  eog_ids_.clear();
  if (eos_id_ >= 0) eog_ids_.push_back(eos_id_);
  for (const char* s : {"<|im_end|>", "<|eot_id|>", "<|eom_id|>", "<|endoftext|>", "<|end_of_text|>"}) {
    const int32_t id = token_id(s);
    if (id >= 0 && is_added(types_[size_t(id)]) &&
        std::find(eog_ids_.begin(), eog_ids_.end(), id) == eog_ids_.end())
      eog_ids_.push_back(id);
  }
}

int32_t Tokenizer::token_id(std::string_view text) const {
  auto it = ids_.find(std::string(text));
  return it == ids_.end() ? -1 : it->second;
}

const std::string& Tokenizer::token_text(int32_t id) const {
  PA_CHECK(id >= 0 && id < vocab_size(), "Tokenizer::token_text: id ", id,
           " is outside the vocabulary of ", vocab_size());
  return vocab_[size_t(id)];
}

bool Tokenizer::is_eog(int32_t id) const {
  return std::find(eog_ids_.begin(), eog_ids_.end(), id) != eog_ids_.end();
}

bool Tokenizer::is_special(int32_t id) const {
  return id >= 0 && id < vocab_size() && types_[size_t(id)] == TokenType::control;
}

// BPE over one pre-token. Symbols form a linked list; a min-heap holds candidate pairs ordered by
// (rank, left position); stale entries are skipped when popped.
void Tokenizer::bpe(std::string_view piece, std::vector<int32_t>& out) const {
  std::string mapped;
  for (unsigned char ch : piece) utf8_append(mapped, byte_to_unicode(ch));
  if (ignore_merges_) {
    const int32_t whole = token_id(mapped);
    if (whole >= 0 && types_[size_t(whole)] == TokenType::normal) {
      out.push_back(whole);
      return;
    }
  }
  struct Sym {
    int32_t id, prev, next;
  };
  std::vector<Sym> sym;
  sym.reserve(piece.size());
  for (unsigned char ch : piece) {
    const int32_t id = byte_ids_[ch] >= 0 ? byte_ids_[ch] : unk_id_;
    if (id < 0) continue;  // a byte the vocabulary cannot express and no unknown token
    const int32_t k = int32_t(sym.size());
    sym.push_back({id, k - 1, k + 1});
  }
  if (sym.empty()) return;
  sym.back().next = -1;

  struct Cand {
    int32_t rank, left, a, b;
    bool operator>(const Cand& o) const { return rank != o.rank ? rank > o.rank : left > o.left; }
  };
  std::priority_queue<Cand, std::vector<Cand>, std::greater<Cand>> heap;
  auto push = [&](int32_t l) {
    if (l < 0 || sym[size_t(l)].next < 0) return;
    const int32_t r = sym[size_t(l)].next;
    auto it = merges_.find(pair_key(sym[size_t(l)].id, sym[size_t(r)].id));
    if (it != merges_.end()) heap.push({it->second.rank, l, sym[size_t(l)].id, sym[size_t(r)].id});
  };
  for (int32_t k = 0; k + 1 < int32_t(sym.size()); ++k) push(k);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = sym[size_t(c.left)];
    if (l.id != c.a || l.next < 0 || sym[size_t(l.next)].id != c.b) continue;  // stale
    const int32_t r = l.next;
    l.id = merges_.at(pair_key(c.a, c.b)).merged;
    l.next = sym[size_t(r)].next;
    if (l.next >= 0) sym[size_t(l.next)].prev = c.left;
    sym[size_t(r)].id = -1;
    push(l.prev);
    push(c.left);
  }
  for (int32_t k = 0; k >= 0; k = sym[size_t(k)].next) out.push_back(sym[size_t(k)].id);
}

void Tokenizer::encode_text(std::string_view text, std::vector<int32_t>& out) const {
  for (std::string_view piece : pre_tokenize(pre_, text)) bpe(piece, out);
}

// SentencePiece BPE over one stretch of text between special tokens. Symbols are UTF-8 characters
// (an invalid byte is one of its own) in a linked list; a max-heap holds adjacent pairs whose
// concatenation is a vocabulary piece, ordered by (score, leftmost); stale entries are skipped.
// NOTE: as llama.cpp, pieces of type unused are not formed (sentencepiece forms them, then splits
// them again), and user-defined pieces are split out before, as special tokens.
void Tokenizer::spm_encode(std::string_view text, bool prefix_space,
                           std::vector<int32_t>& out) const {
  if (text.empty()) return;
  std::string s;
  s.reserve(text.size() + 3 * 8);
  if (prefix_space) s += kSpmSpace;
  for (char c : text) {
    if (c == ' ')
      s += kSpmSpace;
    else
      s += c;
  }
  struct Sym {
    int32_t start, len, prev, next;
  };
  std::vector<Sym> sym;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    if (utf8_decode(s, i, len) == 0xFFFFFFFFu) len = 1;
    const int32_t k = int32_t(sym.size());
    sym.push_back({int32_t(i), int32_t(len), k - 1, k + 1});
    i += len;
  }
  sym.back().next = -1;
  auto piece_id = [&](int32_t start, int32_t len) {
    const int32_t id = token_id(std::string_view(s).substr(size_t(start), size_t(len)));
    return id >= 0 && types_[size_t(id)] == TokenType::normal ? id : -1;
  };
  struct Cand {
    float score;
    int32_t left, len;
    bool operator<(const Cand& o) const {
      return score != o.score ? score < o.score : left > o.left;
    }
  };
  std::priority_queue<Cand> heap;
  auto push = [&](int32_t l) {
    if (l < 0 || sym[size_t(l)].next < 0) return;
    const Sym& a = sym[size_t(l)];
    const Sym& b = sym[size_t(a.next)];
    // Metaspace split: a word starts at each U+2581, and merges stay within words.
    if (spm_split_ && s.compare(size_t(b.start), kSpmSpace.size(), kSpmSpace) == 0) return;
    const int32_t len = a.len + b.len;
    if (spm_ranked_) {  // the pair's merge rank, lowest first
      const int32_t ia = piece_id(a.start, a.len), ib = piece_id(b.start, b.len);
      if (ia < 0 || ib < 0) return;
      const auto it = merges_.find(pair_key(ia, ib));
      if (it != merges_.end()) heap.push({-float(it->second.rank), l, len});
      return;
    }
    const int32_t id = piece_id(a.start, len);
    if (id >= 0) heap.push({scores_[size_t(id)], l, len});
  };
  for (int32_t k = 0; k + 1 < int32_t(sym.size()); ++k) push(k);
  while (!heap.empty()) {
    const Cand c = heap.top();
    heap.pop();
    Sym& l = sym[size_t(c.left)];
    if (l.len == 0 || l.next < 0 || l.len + sym[size_t(l.next)].len != c.len) continue;  // stale
    Sym& r = sym[size_t(l.next)];
    l.len = c.len;
    l.next = r.next;
    if (l.next >= 0) sym[size_t(l.next)].prev = c.left;
    r.len = 0;
    push(l.prev);
    push(c.left);
  }
  for (int32_t k = 0; k >= 0; k = sym[size_t(k)].next) {
    const Sym& a = sym[size_t(k)];
    const int32_t id = piece_id(a.start, a.len);
    if (id >= 0) {
      out.push_back(id);
      continue;
    }
    // Byte fallback; without byte tokens, the unknown token for the piece (or nothing).
    bool bytes = true;
    for (int32_t i = 0; i < a.len && bytes; ++i)
      bytes = spm_byte_ids_[uint8_t(s[size_t(a.start + i)])] >= 0;
    if (bytes) {
      for (int32_t i = 0; i < a.len; ++i) out.push_back(spm_byte_ids_[uint8_t(s[size_t(a.start + i)])]);
    } else if (unk_id_ >= 0) {
      out.push_back(unk_id_);
    }
  }
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool add_special,
                                       bool parse_special) const {
  std::vector<int32_t> out;
  if (add_special && add_bos_ && bos_id_ >= 0) out.push_back(bos_id_);
  // A stretch of text between special tokens; SentencePiece puts a space before the first one and
  // before each that follows a special token (as llama.cpp and Hugging Face's legacy Llama
  // tokenizers), or (Metaspace "first") only before a stretch at the start of the text.
  bool after_special = true;
  auto text_part = [&](std::string_view part) {
    if (spm_) {
      bool prefix = add_space_prefix_ && after_special;
      if (spm_prefix_first_ && part.data() != text.data()) prefix = false;
      if (spm_prefix_if_no_space_ && (part.substr(0, 1) == " " || part.substr(0, 3) == kSpmSpace))
        prefix = false;
      spm_encode(part, prefix, out);
      if (!part.empty()) after_special = false;
    } else {
      encode_text(part, out);
    }
  };
  if (!parse_special || special_ids_.empty()) {
    text_part(text);
    return out;
  }
  // Leftmost-longest match of the added tokens; the text between them goes through BPE.
  size_t start = 0;
  for (size_t i = 0; i < text.size();) {
    int32_t hit = -1;
    for (int32_t id : special_ids_) {
      const std::string& s = vocab_[size_t(id)];
      if (s[0] == text[i] && text.compare(i, s.size(), s) == 0) {
        hit = id;
        break;
      }
    }
    if (hit < 0) {
      ++i;
      continue;
    }
    text_part(text.substr(start, i - start));
    out.push_back(hit);
    after_special = true;
    i += vocab_[size_t(hit)].size();
    start = i;
  }
  text_part(text.substr(start));
  return out;
}

std::string Tokenizer::token_to_piece(int32_t id) const {
  const std::string& s = token_text(id);
  if (is_added(types_[size_t(id)])) return s;
  if (spm_) {
    unsigned b = 0;
    if (types_[size_t(id)] == TokenType::byte && s.size() == 6 &&
        std::sscanf(s.c_str(), "<0x%2X>", &b) == 1)
      return std::string(1, char(b));
    std::string out;
    for (size_t i = 0; i < s.size();) {
      if (s.compare(i, kSpmSpace.size(), kSpmSpace) == 0) {
        out += ' ';
        i += kSpmSpace.size();
      } else {
        out += s[i++];
      }
    }
    return out;
  }
  std::string out;
  for (size_t i = 0; i < s.size();) {
    size_t len;
    const uint32_t cp = utf8_decode(s, i, len);
    const int b = unicode_to_byte(cp);
    if (b >= 0) out += char(b);
    else out.append(s, i, len);  // not in the byte alphabet: keep the text as it is
    i += len;
  }
  return out;
}

std::string Tokenizer::decode(const std::vector<int32_t>& ids, bool skip_special) const {
  std::string out;
  // The space encode put before the text: dropped from the first text piece (sentencepiece), or
  // (Hugging Face's Strip decoder) from whatever piece comes first.
  bool first_text = spm_ && add_space_prefix_ && !spm_strip_first_piece_;
  bool first_piece = spm_strip_first_piece_;
  for (int32_t id : ids) {
    if (skip_special && is_special(id)) continue;
    std::string piece = token_to_piece(id);
    if ((first_text && !is_added(types_[size_t(id)])) || first_piece) {
      if (!piece.empty() && piece[0] == ' ') piece.erase(0, 1);
      first_text = first_piece = false;
    }
    out += piece;
  }
  return out;
}

std::string StreamDecoder::push(int32_t id) {
  if (skip_special_ && tok_->is_special(id)) return "";
  pending_ += tok_->token_to_piece(id);
  // Emit every complete character; an invalid byte becomes U+FFFD; a valid but unfinished
  // sequence at the end is held back.
  std::string out;
  size_t i = 0;
  while (i < pending_.size()) {
    size_t len;
    const uint32_t cp = utf8_decode(pending_, i, len);
    if (cp != 0xFFFFFFFFu) {
      out.append(pending_, i, len);
      i += len;
      continue;
    }
    // Could it be the start of a character whose remaining bytes have not arrived yet?
    const uint8_t c = uint8_t(pending_[i]);
    const size_t need = c >= 0xF0 ? 4 : c >= 0xE0 ? 3 : c >= 0xC2 ? 2 : 0;
    bool prefix = need > 0 && c <= 0xF4 && i + need > pending_.size();
    for (size_t k = i + 1; prefix && k < pending_.size(); ++k)
      prefix = (uint8_t(pending_[k]) & 0xC0) == 0x80;
    if (prefix) break;
    out += "\xEF\xBF\xBD";
    ++i;
  }
  pending_.erase(0, i);
  return out;
}

std::string StreamDecoder::flush() {
  // What is held back is one unfinished character: one replacement character for it.
  std::string out = pending_.empty() ? "" : "\xEF\xBF\xBD";
  pending_.clear();
  return out;
}

}  // namespace pagedattn
