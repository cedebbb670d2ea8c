// Tokenizers of the Llama family: byte-level BPE (GPT-2 family: SmolLM2, Llama 3, Qwen2/3) from
// GGUF metadata or a Hugging Face tokenizer.json, and SentencePiece BPE (Llama 2, Mistral
// v0.1-v0.3) from GGUF metadata (tokenizer model "llama") or a Hugging Face tokenizer.json with
// byte fallback.
//
// encode: special/added tokens are split out first (when parse_special). Byte-level BPE: the rest
// is split by the family's pre-tokenizer regex, each piece mapped to GPT-2's byte-to-unicode
// alphabet and merged by merge rank. SentencePiece: each stretch of text gets U+2581 for its
// spaces and one before it (add_space_prefix: at the start and after a special token), its
// characters are merged highest score first into vocabulary pieces, and a piece the vocabulary
// lacks becomes its bytes' <0xXX> tokens. decode maps pieces back to bytes; StreamDecoder emits
// only complete UTF-8.
#pragma once

#include <array>
#include <cstdint>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

namespace pagedattn {

class GGUFFile;

// Which pre-tokenizer split regex a vocabulary uses.
enum class PreTokenizer : uint8_t {
  gpt2,    // GPT-2: 's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
  smollm,  // SmolLM/StarCoder: every digit split out on its own first, then the gpt2 regex
  llama3,  // Llama 3: case-insensitive contractions, [^\r\n\p{L}\p{N}]?\p{L}+, \p{N}{1,3}, ...
  qwen2,   // Qwen2/3: as llama3 but single digits \p{N}
};
// Parses a GGUF tokenizer.ggml.pre name ("gpt2", "smollm", "llama-bpe", "qwen2", ...);
// unknown names throw Error.
PreTokenizer parse_pre_tokenizer(std::string_view name);

enum class TokenType : uint8_t { normal = 1, unknown = 2, control = 3, user_defined = 4, unused = 5, byte = 6 };

class Tokenizer {
 public:
  // From the tokenizer.ggml.* metadata of a GGUF file (model "gpt2": byte-level BPE; "llama":
  // SentencePiece BPE).
  static Tokenizer from_gguf(const GGUFFile& file);
  // From a Hugging Face tokenizer.json (and tokenizer_config.json beside it, when present, for
  // bos/eos and the chat template): byte-level BPE, or with "byte_fallback" SentencePiece BPE
  // merged by rank (the legacy Prepend/Replace normalizer or a Metaspace pre-tokenizer).
  static Tokenizer from_tokenizer_json(const std::string& path);

  // Splits out special tokens (added tokens; when parse_special) and BPE-encodes the rest.
  // add_special prepends BOS when the vocabulary asks for it (add_bos). text is UTF-8; a byte the
  // vocabulary has no token for (0xFF in most) maps to the unknown token, or is dropped without one.
  std::vector<int32_t> encode(std::string_view text, bool add_special = false,
                              bool parse_special = true) const;
  // Concatenated bytes of the tokens (special tokens included as their text unless skip_special).
  // SentencePiece with add_space_prefix: the space that encode put before the text is dropped
  // from the first text token (after any special ones), as sentencepiece's decode does.
  std::string decode(const std::vector<int32_t>& ids, bool skip_special = false) const;
  // The raw bytes of one token (throws Error for an id outside the vocabulary).
  std::string token_to_piece(int32_t id) const;
  // The token's vocabulary string (byte-level alphabet), e.g. "Ġhello".
  const std::string& token_text(int32_t id) const;
  // Id of a vocabulary string, or -1.
  int32_t token_id(std::string_view text) const;

  int32_t vocab_size() const { return int32_t(vocab_.size()); }
  int32_t bos_id() const { return bos_id_; }
  int32_t eos_id() const { return eos_id_; }
  // End-of-generation ids: eos plus <|im_end|>, <|eot_id|>, <|eom_id|>, <|endoftext|> if present.
  const std::vector<int32_t>& eog_ids() const { return eog_ids_; }
  bool is_eog(int32_t id) const;
  bool is_special(int32_t id) const;
  bool add_bos() const { return add_bos_; }
  PreTokenizer pre_tokenizer() const { return pre_; }
  // SentencePiece BPE (GGUF tokenizer model "llama") rather than byte-level BPE.
  bool sentencepiece() const { return spm_; }
  // The Jinja chat template from the file ("" when absent).
  const std::string& chat_template() const { return chat_template_; }

  // For tests and tools: build from parts. merges are "a b" strings in the byte-level alphabet.
  // Tokens of type control/user_defined are split out of text before BPE and decode as their text.
  static Tokenizer from_parts(std::vector<std::string> vocab, const std::vector<std::string>& merges,
                              std::vector<TokenType> types, PreTokenizer pre, int32_t bos_id,
                              int32_t eos_id, bool add_bos, std::string chat_template = "");
  // SentencePiece BPE from parts: pieces (spaces as U+2581), their scores (the higher merges
  // first) and types (byte tokens are "<0xXX>").
  static Tokenizer from_sentencepiece(std::vector<std::string> pieces, std::vector<float> scores,
                                      std::vector<TokenType> types, int32_t bos_id, int32_t eos_id,
                                      bool add_bos, bool add_space_prefix,
                                      std::string chat_template = "");

 private:
  friend struct TokenizerLoader;
  void build_index(const std::vector<std::string>& merges);
  void bpe(std::string_view piece, std::vector<int32_t>& out) const;
  void encode_text(std::string_view text, std::vector<int32_t>& out) const;
  void spm_encode(std::string_view text, bool prefix_space, std::vector<int32_t>& out) const;

  std::vector<std::string> vocab_;                       // [vocab_size] byte-level strings
  std::vector<TokenType> types_;                         // [vocab_size]
  std::unordered_map<std::string, int32_t> ids_;         // vocab string -> id
  struct Merge {
    int32_t rank, merged;
  };
  std::unordered_map<uint64_t, Merge> merges_;           // (left id << 32 | right id) -> merge
  bool ignore_merges_ = false;                           // whole pre-token in vocab wins (llama3)
  int32_t unk_id_ = -1;
  std::array<int32_t, 256> byte_ids_{};                  // id of each byte's one-character token
  std::vector<int32_t> special_ids_;                     // split out before BPE, longest first
  std::vector<int32_t> eog_ids_;
  PreTokenizer pre_ = PreTokenizer::gpt2;
  int32_t bos_id_ = -1;
  int32_t eos_id_ = -1;
  bool add_bos_ = false;
  std::string chat_template_;
  // SentencePiece BPE
  bool spm_ = false;
  bool add_space_prefix_ = true;
  // A Hugging Face tokenizer.json with byte fallback (a SentencePiece model as transformers
  // converts it): pieces merged by merges_ rank instead of score; the U+2581 prefix only before a
  // stretch at the start of the text (Metaspace "first") and only where it does not already
  // start with a space or U+2581 (Metaspace); merges kept within words that start at each U+2581
  // (Metaspace split); decode strips a space from the first piece it emits, whatever its type.
  bool spm_ranked_ = false;
  bool spm_prefix_first_ = false;
  bool spm_prefix_if_no_space_ = false;
  bool spm_split_ = false;
  bool spm_strip_first_piece_ = false;
  std::vector<float> scores_;                 // [vocab_size]
  std::array<int32_t, 256> spm_byte_ids_{};   // id of each byte's <0xXX> token, or -1
};

// A .gguf file or a folder with tokenizer.json.
Tokenizer load_tokenizer(const std::string& path);

// Turns a stream of token ids into text, holding back bytes until they form complete UTF-8
// characters (an invalid sequence is emitted as U+FFFD rather than stalling).
class StreamDecoder {
 public:
  explicit StreamDecoder(const Tokenizer& tok, bool skip_special = false)
      : tok_(&tok), skip_special_(skip_special) {}
  // Returns the text completed by this token (possibly empty).
  std::string push(int32_t id);
  // Returns whatever is held back (incomplete sequences as U+FFFD).
  std::string flush();

 private:
  const Tokenizer* tok_;
  bool skip_special_;
  std::string pending_;
};

}  // namespace pagedattn
