// SentencePiece BPE (GGUF tokenizer model "llama": Llama 2, Mistral v0.1-v0.3): encodings and
// decodings equal Google's sentencepiece on a model it trains (tests/model/spm_oracle.py writes
// the model's vocabulary, scores and types as GGUF metadata with the `gguf` package); special
// tokens, BOS and the streamed decoding on top.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "pagedattn/chat_template.h"
#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "pagedattn/tokenizer.h"
#include "python_oracle.h"

namespace pagedattn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path().parent_path();

std::vector<std::string> texts() {
  std::vector<std::string> t = {
      "Hello world", "the tokenizer paged attention cache", " leading space", "trailing space ",
      "two  spaces   three", "", " ", "   ", "line1\nline2\n\n", "tab\there", "café naïve Straße",
      "日本語のテキスト", "emoji 🙂🚀 here", "digits 1234567890 and 3.14", "x = f(y) + 2;",
      "def main():\n    return 0", "<s> is not special here", "▁ literal U+2581",
      "MiXeD CaSe WoRdS", "punctuation!?.,;:'\"()[]{}", "a", "ab", "\xC3\xA9t\xC3\xA9",
      "\xF0\x9F\x98\x80\xF0\x9F\x98\x81", "über über über"};
  // Random strings over a mixed alphabet: words, runs of spaces, digits, accents, CJK, emoji.
  const std::vector<std::string> alphabet = {
      "the", " ", "  ", "of", "and", "model", "e", "t", "a", "s", "1", "23", ".", ",", "!", "\n",
      "\t", "é", "ü", "ß", "日", "本", "🙂", "Z", "Q", "x", "-", "_", "(", ")", "ing", "tion"};
  std::mt19937 rng(11);
  for (int k = 0; k < 200; ++k) {
    std::string s;
    const int n = 1 + int(rng() % 24);
    for (int i = 0; i < n; ++i) s += alphabet[rng() % alphabet.size()];
    t.push_back(s);
  }
  return t;
}

struct Oracle {
  test::CachedOracle run;
  json out;
  fs::path gguf;
};

// Runs the oracle once for these texts: it trains the model, writes its GGUF and the results.
const Oracle& oracle() {
  static const Oracle o = [] {
    Oracle r;
    const std::string texts_json = json(texts()).dump();
    const test::CachedOracle run = test::run_cached_oracle(
        kRepo / "tests/model/spm_oracle.py", texts_json,
        [&](const fs::path& dir) { std::ofstream(dir / "texts.json") << texts_json; },
        [](const fs::path& dir) {
          return std::vector<std::string>{(dir / "texts.json").string(), dir.string()};
        });
    if (run.status == test::PythonRun::ok) {
      r.gguf = run.dir / "spm.gguf";
      r.out = json::parse(std::ifstream(run.dir / "out.json"));
    }
    r.run = run;
    return r;
  }();
  return o;
}

class SentencePieceOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    const Oracle& o = oracle();
    PA_REQUIRE_ORACLE(o.run);
    file_ = std::make_unique<GGUFFile>(GGUFFile::open(o.gguf.string()));
    tok_ = std::make_unique<Tokenizer>(Tokenizer::from_gguf(*file_));
  }
  std::unique_ptr<GGUFFile> file_;
  std::unique_ptr<Tokenizer> tok_;
};

TEST_F(SentencePieceOracle, EncodingsEqualSentencepiece) {
  const json& out = oracle().out;
  ASSERT_TRUE(tok_->sentencepiece());
  ASSERT_EQ(tok_->vocab_size(), out["vocab_size"].get<int32_t>());
  const auto& ts = out["texts"];
  int mismatches = 0;
  for (size_t i = 0; i < ts.size(); ++i) {
    const std::string text = ts[i].get<std::string>();
    const auto want = out["ids"][i].get<std::vector<int32_t>>();
    const auto got = tok_->encode(text, /*add_special=*/false, /*parse_special=*/false);
    if (got != want && ++mismatches <= 5) {
      std::string pieces;
      for (int32_t id : got) pieces += "[" + tok_->token_text(id) + "]";
      ADD_FAILURE() << "text " << json(text).dump() << ": sentencepiece " << out["pieces"][i].dump()
                    << ", ours " << pieces;
    }
  }
  EXPECT_EQ(mismatches, 0) << "of " << ts.size() << " texts";
}

TEST_F(SentencePieceOracle, DecodingsEqualSentencepieceAndRoundTrip) {
  const json& out = oracle().out;
  const auto& ts = out["texts"];
  for (size_t i = 0; i < ts.size(); ++i) {
    const auto ids = out["ids"][i].get<std::vector<int32_t>>();
    EXPECT_EQ(tok_->decode(ids), out["decoded"][i].get<std::string>()) << ts[i].dump();
    // A text's own U+2581 decodes as a space (as in sentencepiece); every other text round-trips.
    const std::string text = ts[i].get<std::string>();
    if (text.find("\xE2\x96\x81") == std::string::npos) {
      EXPECT_EQ(tok_->decode(tok_->encode(text)), text);
    }
  }
  // The byte-fallback tokens of an emoji decode to its UTF-8 bytes.
  const std::string emoji = "\xF0\x9F\x99\x82";
  EXPECT_EQ(tok_->decode(tok_->encode(emoji, false, false)), emoji);
}

TEST_F(SentencePieceOracle, SpecialTokensAndBos) {
  const int32_t bos = tok_->bos_id();
  ASSERT_GE(bos, 0);
  ASSERT_TRUE(tok_->add_bos());
  const auto plain = tok_->encode("hello world", false, false);
  auto with_bos = tok_->encode("hello world", /*add_special=*/true, false);
  ASSERT_FALSE(with_bos.empty());
  EXPECT_EQ(with_bos[0], bos);
  with_bos.erase(with_bos.begin());
  EXPECT_EQ(with_bos, plain);
  // "<s>" in the text is the control token when parsed; the text after it gets its own space.
  auto parsed = tok_->encode("<s>hello world", false, /*parse_special=*/true);
  ASSERT_FALSE(parsed.empty());
  EXPECT_EQ(parsed[0], bos);
  parsed.erase(parsed.begin());
  EXPECT_EQ(parsed, plain);
  // decode drops the space encode put before the text, also after a leading special token.
  EXPECT_EQ(tok_->decode(tok_->encode("hello world", true, false), /*skip_special=*/true),
            "hello world");
  EXPECT_EQ(tok_->decode(tok_->encode("hello world", true, false)), "<s>hello world");
}

// A chat without a template in the file: [INST] turns (Mistral, Llama 2), encoded as the rendered
// text would be with its BOS split out, the text after it with SentencePiece's space.
TEST_F(SentencePieceOracle, ChatUsesInstTurns) {
  EXPECT_EQ(detect_chat_family(*tok_), ChatFamily::mistral);
  const std::vector<ChatMessage> msgs = {{"user", "hello there"}};
  const std::string text = apply_chat_template(*tok_, msgs, true);
  EXPECT_EQ(text, "<s>[INST] hello there [/INST]");
  const auto ids = encode_chat(*tok_, msgs, true);
  EXPECT_EQ(ids, tok_->encode(text, false, true));
  ASSERT_FALSE(ids.empty());
  EXPECT_EQ(ids[0], tok_->bos_id());
  EXPECT_EQ(tok_->decode(ids, /*skip_special=*/true), "[INST] hello there [/INST]");
}

// Streamed decoding (generated tokens follow a prompt) keeps every space, the first included.
TEST_F(SentencePieceOracle, StreamedDecodingKeepsSpaces) {
  const auto ids = tok_->encode("hello café 🙂", false, false);
  StreamDecoder d(*tok_);
  std::string text;
  for (int32_t id : ids) text += d.push(id);
  text += d.flush();
  EXPECT_EQ(text, " hello café 🙂");
}

// The same model as Hugging Face tokenizer.json folders (byte fallback, merges by rank; the
// legacy normalizer, Metaspace "first", Metaspace "first" with split): every text as the
// `tokenizers` library encodes it (added tokens split out) and decodes it.
TEST(SentencePieceTokenizerJson, EncodingsAndDecodingsEqualTokenizers) {
  const Oracle& o = oracle();
  PA_REQUIRE_ORACLE(o.run);
  const json& out = o.out;
  const auto& ts = out["texts"];
  for (const char* name : {"legacy", "metaspace", "split"}) {
    SCOPED_TRACE(name);
    const fs::path dir = o.run.dir / (std::string("hf_") + name);
    const Tokenizer tok = load_tokenizer(dir.string());
    ASSERT_TRUE(tok.sentencepiece());
    ASSERT_EQ(tok.vocab_size(), out["vocab_size"].get<int32_t>());
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_TRUE(tok.add_bos());
    const json& hf = out["hf"][name];
    int mismatches = 0;
    for (size_t i = 0; i < ts.size(); ++i) {
      const std::string text = ts[i].get<std::string>();
      const auto want = hf["ids"][i].get<std::vector<int32_t>>();
      const auto got = tok.encode(text, /*add_special=*/false, /*parse_special=*/true);
      if (got != want && ++mismatches <= 5) {
        std::string pieces, theirs;
        for (int32_t id : got) pieces += "[" + tok.token_text(id) + "]";
        for (int32_t id : want) theirs += "[" + tok.token_text(id) + "]";
        ADD_FAILURE() << "text " << json(text).dump() << ": tokenizers " << theirs << ", ours "
                      << pieces;
      }
      EXPECT_EQ(tok.decode(want), hf["decoded"][i].get<std::string>()) << json(text).dump();
      EXPECT_EQ(tok.decode(want, /*skip_special=*/true), hf["decoded_skip"][i].get<std::string>())
          << json(text).dump();
    }
    EXPECT_EQ(mismatches, 0) << "of " << ts.size() << " texts";
    // BOS from tokenizer_config.json, before the text's own encoding.
    auto with_bos = tok.encode("hello world", /*add_special=*/true);
    ASSERT_FALSE(with_bos.empty());
    EXPECT_EQ(with_bos[0], 1);
  }
}

// A tokenizer.json with byte fallback whose text preparation this tokenizer does not have is
// refused with the key that says so.
TEST(SentencePieceTokenizerJson, UnsupportedPreparationIsRefusedByName) {
  const fs::path dir = fs::temp_directory_path() / "pagedattn_spm_json_refused";
  fs::create_directories(dir);
  const json vocab = {{"<unk>", 0}, {"<s>", 1}, {"</s>", 2}, {"\xE2\x96\x81", 3}, {"a", 4}};
  auto write = [&](const json& extra) {
    json tj = {{"model", {{"type", "BPE"}, {"byte_fallback", true}, {"unk_token", "<unk>"},
                          {"vocab", vocab}, {"merges", json::array()}}}};
    for (const auto& [k, v] : extra.items()) tj[k] = v;
    std::ofstream(dir / "tokenizer.json") << tj.dump();
    return (dir / "tokenizer.json").string();
  };
  const std::vector<std::pair<json, std::string>> cases = {
      {{{"normalizer", {{"type", "NFKC"}}}}, "normalizer"},
      {{{"pre_tokenizer", {{"type", "ByteLevel"}}}}, "pre_tokenizer"},
      {json::object(), "U+2581"},
      {{{"pre_tokenizer", {{"type", "Metaspace"}, {"prepend_scheme", "sometimes"}}}},
       "prepend_scheme"}};
  for (const auto& [extra, key] : cases) {
    try {
      (void)Tokenizer::from_tokenizer_json(write(extra));
      ADD_FAILURE() << "no error for " << extra.dump();
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(key), std::string::npos) << e.what();
    }
  }
  // The legacy normalizer alone is enough: "a" after the prefix, no merges.
  const std::string sp = "\xE2\x96\x81";
  const json prepend = {{"type", "Prepend"}, {"prepend", sp}};
  const json replace = {{"type", "Replace"}, {"pattern", {{"String", " "}}}, {"content", sp}};
  const Tokenizer t = Tokenizer::from_tokenizer_json(
      write({{"normalizer", {{"type", "Sequence"}, {"normalizers", {prepend, replace}}}}}));
  EXPECT_EQ(t.encode("a", false, false), (std::vector<int32_t>{3, 4}));
  fs::remove_all(dir);
}

TEST(SentencePieceGguf, BadScoresAreRefusedByName) {
  std::vector<std::string> pieces = {"<unk>", "<s>", "</s>", "a"};
  std::vector<TokenType> types = {TokenType::unknown, TokenType::control, TokenType::control,
                                  TokenType::normal};
  try {
    (void)Tokenizer::from_sentencepiece(pieces, {0.f, 0.f}, types, 1, 2, true, true);
    ADD_FAILURE() << "no error for 2 scores of 4 pieces";
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("scores"), std::string::npos) << e.what();
  }
  // Without byte tokens a piece the vocabulary lacks is the unknown token.
  const Tokenizer t = Tokenizer::from_sentencepiece(pieces, {}, types, 1, 2, true, false);
  EXPECT_EQ(t.encode("ab", false, false), (std::vector<int32_t>{3, 0}));
}

}  // namespace
}  // namespace pagedattn
