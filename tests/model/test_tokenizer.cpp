// Tokenizer: encodings of a varied text set equal those of the Hugging Face `tokenizers` library on
// the default model's vocabulary (tests/model/tokenizer_oracle.py), for the smollm, llama3 and
// qwen2 pre-tokenizers; decode(encode(x)) == x; streaming decode; tokenizer.json loading.
#include <gtest/gtest.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <sstream>
#include <nlohmann/json.hpp>
#include <random>

#include "default_model.h"
#include "model/tokenizer_internal.h"
#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "pagedattn/tokenizer.h"
#include "python_oracle.h"

namespace pagedattn {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

const fs::path kRepo = fs::path(__FILE__).parent_path().parent_path().parent_path();

// PAGEDATTN_MODEL or the default model.
std::string model_path() { return pagedattn::testing::model_path_from_env(); }

const std::vector<std::string>& texts() {
  static const std::vector<std::string> t = {
      "",
      "Hello world",
      "Hello, world! How are you doing today?",
      "I'm here; you're there. We'll see, they've gone, she'd know. IT'S LOUD, DON'T",
      "café naïve résumé Straße Ångström façade jalapeño",
      "日本語のテキストと中文文本，还有한국어 텍스트。",
      "emoji 🙂🚀 family 👨‍👩‍👧 flag 🇫🇷 skin 👍🏽",
      "def f(x):\n    return x**2 + 1  # square\n\n\tif x != 0: print(\"ok\")",
      "    leading spaces and trailing spaces    ",
      "tabs\t\tand\r\nwindows lines\n\n\nthree newlines \n \n",
      "numbers 1 12 123 1234 12345 3.14159 1,000,000 ½ ² ٣",
      "<|im_start|>user\nWhat is 2+2?<|im_end|>\n<|im_start|>assistant\n",
      "<|endoftext|><repo_name>a<file_sep>b<|im_end|>",
      "almost special <|im_start and |im_end|> and <|unknown|>",
      "مرحبا بالعالم — नमस्ते दुनिया — Привет, мир!",
      "math ∑ ∫ √ ≠ ≤ ∞ and symbols @#$%^&*()_+-=[]{}|;':\",./<>?`~",
      "https://example.com/path?q=1&r=two#frag user@mail.org",
      "a  b   c    d\u00a0e\u3000f\u2003g",
      "'s 't 're 've 'm 'll 'd 'S 'T 'RE '",
      std::string(300, ' ') + "x" + std::string(50, '!') + "zzzzzzzzzzzzzzzzzzzzzzzz",
  };
  return t;
}

struct Oracle {
  test::CachedOracle run;
  json out;
};

// Runs the Python oracle for the whole text set, once for these texts and this model file.
const Oracle& oracle() {
  static const Oracle o = [] {
    Oracle r;
    const std::string texts_json = json(texts()).dump();
    const test::CachedOracle run = test::run_cached_oracle(
        kRepo / "tests/model/tokenizer_oracle.py",
        texts_json + std::to_string(fs::file_size(model_path())),
        [&](const fs::path& dir) { std::ofstream(dir / "texts.json") << texts_json; },
        [](const fs::path& dir) {
          return std::vector<std::string>{model_path(), (dir / "texts.json").string(),
                                          (dir / "out.json").string()};
        });
    if (run.status == test::PythonRun::ok) r.out = json::parse(std::ifstream(run.dir / "out.json"));
    r.run = run;
    return r;
  }();
  return o;
}

class TokenizerOracle : public ::testing::Test {
 protected:
  void SetUp() override {
    if (!fs::exists(model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch-default-model.sh";
    const Oracle& o = oracle();
    PA_REQUIRE_ORACLE(o.run);
  }
  static const GGUFFile& file() {
    static const GGUFFile f = GGUFFile::open(model_path());
    return f;
  }
  // The default model's vocabulary behind another family's pre-tokenizer.
  static Tokenizer with_pre(PreTokenizer pre) {
    const GGUFFile& g = file();
    std::vector<TokenType> types;
    for (int64_t t : g.get("tokenizer.ggml.token_type").ints) types.push_back(TokenType(t));
    return Tokenizer::from_parts(g.get("tokenizer.ggml.tokens").strings,
                                 g.get("tokenizer.ggml.merges").strings, types, pre, 1, 2, false);
  }
  static void compare(const Tokenizer& tok, const std::string& family) {
    const json& want = oracle().out["encodings"][family];
    ASSERT_EQ(want.size(), texts().size());
    for (size_t i = 0; i < texts().size(); ++i) {
      const auto ids = tok.encode(texts()[i]);
      EXPECT_EQ(ids, want[i].get<std::vector<int32_t>>()) << family << " text " << i << ": " << texts()[i];
      EXPECT_EQ(tok.decode(ids), texts()[i]) << family << " text " << i;
    }
  }
};

TEST_F(TokenizerOracle, DefaultModelMatchesTokenizersLibrary) {
  const Tokenizer tok = load_tokenizer(model_path());
  EXPECT_EQ(tok.pre_tokenizer(), PreTokenizer::smollm);
  compare(tok, "smollm");
}

TEST_F(TokenizerOracle, Llama3AndQwen2PreTokenizersMatch) {
  compare(with_pre(PreTokenizer::llama3), "llama3");
  compare(with_pre(PreTokenizer::qwen2), "qwen2");
}

TEST_F(TokenizerOracle, PreTokenizerSplitsMatchRegexes) {
  for (auto [pre, name] : {std::pair{PreTokenizer::gpt2, "gpt2"}, {PreTokenizer::llama3, "llama3"},
                           {PreTokenizer::qwen2, "qwen2"}}) {
    const json& want = oracle().out["pretokens"][name];
    for (size_t i = 0; i < texts().size(); ++i) {
      std::vector<std::string> got;
      for (auto v : pre_tokenize(pre, texts()[i])) got.emplace_back(v);
      EXPECT_EQ(got, want[i].get<std::vector<std::string>>()) << name << " text " << i;
    }
  }
}

TEST_F(TokenizerOracle, TokenizerJsonWithBothMergeFormsMatches) {
  // Export the default model's vocabulary as tokenizer.json (merges as "a b" strings in one file,
  // as [a, b] pairs in the other) with SmolLM2's pre-tokenizer; both must encode like the oracle.
  const GGUFFile& g = file();
  const auto& toks = g.get("tokenizer.ggml.tokens").strings;
  const auto& types = g.get("tokenizer.ggml.token_type").ints;
  const auto& merges = g.get("tokenizer.ggml.merges").strings;
  json vocab = json::object(), added = json::array();
  for (size_t i = 0; i < toks.size(); ++i) {
    if (types[i] == 3) added.push_back({{"id", i}, {"content", toks[i]}, {"special", true}});
    vocab[toks[i]] = i;
  }
  for (bool pairs : {false, true}) {
    json m = json::array();
    for (const auto& s : merges) {
      const size_t sp = s.find(' ', 1);
      if (pairs) m.push_back(json::array({s.substr(0, sp), s.substr(sp + 1)}));
      else m.push_back(s);
    }
    json tj = {{"version", "1.0"},
               {"added_tokens", added},
               {"normalizer", nullptr},
               {"pre_tokenizer",
                {{"type", "Sequence"},
                 {"pretokenizers",
                  json::array({{{"type", "Digits"}, {"individual_digits", true}},
                               {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"trim_offsets", true},
                                {"use_regex", true}}})}}},
               {"model", {{"type", "BPE"}, {"vocab", vocab}, {"merges", m}}}};
    const fs::path dir = fs::temp_directory_path() / ("pa_tokjson_" + std::to_string(pairs));
    fs::create_directories(dir);
    std::ofstream(dir / "tokenizer.json") << tj.dump();
    std::ofstream(dir / "tokenizer_config.json")
        << json({{"bos_token", "<|im_start|>"}, {"eos_token", "<|im_end|>"}, {"add_bos_token", false},
                 {"chat_template", "{{'<|im_start|>'}}"}})
               .dump();
    const Tokenizer tok = load_tokenizer(dir.string());
    EXPECT_EQ(tok.vocab_size(), 49152);
    EXPECT_EQ(tok.bos_id(), 1);
    EXPECT_EQ(tok.eos_id(), 2);
    EXPECT_EQ(tok.chat_template(), "{{'<|im_start|>'}}");
    compare(tok, "smollm");
    fs::remove_all(dir);
  }
}

TEST(Tokenizer, DefaultModelSpecialTokens) {
  if (!fs::exists(model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch-default-model.sh";
  const Tokenizer tok = load_tokenizer(model_path());
  EXPECT_EQ(tok.vocab_size(), 49152);
  EXPECT_EQ(tok.bos_id(), 1);
  EXPECT_EQ(tok.eos_id(), 2);
  EXPECT_FALSE(tok.add_bos());
  EXPECT_TRUE(tok.is_eog(2));
  EXPECT_TRUE(tok.is_eog(0));  // <|endoftext|>
  EXPECT_FALSE(tok.is_eog(1));
  EXPECT_EQ(tok.encode("<|im_start|>"), (std::vector<int32_t>{1}));
  const auto literal = tok.encode("<|im_start|>", false, /*parse_special=*/false);
  EXPECT_GT(literal.size(), 1u);
  EXPECT_EQ(tok.decode(literal), "<|im_start|>");
  EXPECT_EQ(tok.decode({1, 2}, /*skip_special=*/true), "");
  EXPECT_EQ(tok.token_to_piece(1), "<|im_start|>");
  EXPECT_EQ(tok.token_text(tok.encode(" hello")[0]), "Ġhello");
  EXPECT_THROW(tok.token_to_piece(-1), Error);
  EXPECT_THROW(tok.token_to_piece(49152), Error);
  EXPECT_NE(tok.chat_template().find("<|im_start|>"), std::string::npos);
}

TEST(Tokenizer, StreamingEmitsOnlyCompleteUtf8) {
  if (!fs::exists(model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch-default-model.sh";
  const Tokenizer tok = load_tokenizer(model_path());
  for (const std::string& text : texts()) {
    StreamDecoder dec(tok);
    std::string all;
    for (int32_t id : tok.encode(text)) {
      const std::string part = dec.push(id);
      // Every emitted part is whole UTF-8.
      for (size_t i = 0, len; i < part.size(); i += len)
        ASSERT_NE(utf8_decode(part, i, len), 0xFFFFFFFFu) << "partial UTF-8 in " << text;
      all += part;
    }
    all += dec.flush();
    EXPECT_EQ(all, text);
  }
  // Bytes of "é" (c3 a9) split across tokens are held back until complete; a lone continuation
  // byte becomes U+FFFD; an unfinished character at the end flushes as U+FFFD.
  const int32_t c3 = tok.token_id("Ã"), a9 = tok.token_id("©");
  ASSERT_GE(c3, 0);
  ASSERT_GE(a9, 0);
  StreamDecoder dec(tok);
  EXPECT_EQ(dec.push(c3), "");
  EXPECT_EQ(dec.push(a9), "é");
  EXPECT_EQ(dec.push(a9), "\xEF\xBF\xBD");
  EXPECT_EQ(dec.push(c3), "");
  EXPECT_EQ(dec.flush(), "\xEF\xBF\xBD");
}

TEST(Tokenizer, RandomInputsRoundTrip) {
  if (!fs::exists(model_path())) GTEST_SKIP() << "default model missing: run scripts/fetch-default-model.sh";
  const Tokenizer tok = load_tokenizer(model_path());
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {"a", "Z", " ", "  ", "\n", "\t", "'s", "1", "é", "日", "🙂",
                                          "<|im_end|>", "<|im_", "!?", "\r\n", "\xF0\x9F", "\x80", "\xFF"};
  for (int round = 0; round < 300; ++round) {
    std::string text;
    const int n = int(rng() % 40);
    // Even rounds draw only valid UTF-8 (the last three atoms are invalid on their own).
    const size_t pool = round % 2 == 0 ? atoms.size() - 3 : atoms.size();
    for (int k = 0; k < n; ++k) text += atoms[rng() % pool];
    const auto ids = tok.encode(text);
    for (int32_t id : ids) ASSERT_TRUE(id >= 0 && id < tok.vocab_size());
    // Valid UTF-8 round-trips exactly (directly and streamed). NOTE: this vocabulary has no token
    // for bytes that never occur in UTF-8 (0xFF), so those are dropped, as the tokenizers library
    // (which only takes valid strings) never sees them.
    bool valid = true;
    for (size_t i = 0, len; i < text.size(); i += len) valid &= utf8_decode(text, i, len) != 0xFFFFFFFFu;
    if (valid) {
      ASSERT_EQ(tok.decode(ids), text) << "round " << round;
    }
    StreamDecoder dec(tok);
    std::string streamed;
    for (int32_t id : ids) streamed += dec.push(id);
    streamed += dec.flush();
    if (valid) {
      EXPECT_EQ(streamed, text) << "round " << round;
    }
    for (size_t i = 0, len; i < streamed.size(); i += len)
      ASSERT_NE(utf8_decode(streamed, i, len), 0xFFFFFFFFu) << "round " << round;
  }
}

// A hand-made vocabulary whose expected encodings follow from the merge ranks alone.
TEST(Tokenizer, MergesApplyLowestRankFirstLeftmostFirst) {
  std::vector<std::string> vocab;
  for (int b = 0; b < 256; ++b) {
    std::string s;
    utf8_append(s, byte_to_unicode(uint8_t(b)));
    vocab.push_back(s);
  }
  auto add = [&](const std::string& s) {
    vocab.push_back(s);
    return int32_t(vocab.size() - 1);
  };
  const int32_t aa = add("aa"), ab = add("ab"), bc = add("bc"), aab = add("aab"), sp_a = add("Ġa");
  const int32_t special = add("<x>");
  std::vector<TokenType> types(vocab.size(), TokenType::normal);
  types.back() = TokenType::control;
  const Tokenizer tok = Tokenizer::from_parts(vocab, {"b c", "a a", "a b", "aa b", "Ġ a"}, types,
                                              PreTokenizer::gpt2, -1, -1, false);
  EXPECT_EQ(tok.encode("aaa"), (std::vector<int32_t>{aa, 'a'}));          // leftmost pair first
  EXPECT_EQ(tok.encode("abc"), (std::vector<int32_t>{'a', bc}));          // "b c" outranks "a b"
  EXPECT_EQ(tok.encode("aab"), (std::vector<int32_t>{aab}));              // a a, then aa b
  EXPECT_EQ(tok.encode("ab"), (std::vector<int32_t>{ab}));
  EXPECT_EQ(tok.encode(" a<x>a"), (std::vector<int32_t>{sp_a, special, 'a'}));
  EXPECT_EQ(tok.encode("\n"), (std::vector<int32_t>{'\n'}));  // byte b is token b here
  EXPECT_EQ(tok.decode(tok.encode("a\xff\x80 z")), "a\xff\x80 z");  // invalid UTF-8 survives
  EXPECT_THROW(Tokenizer::from_parts(vocab, {"a zz"}, types, PreTokenizer::gpt2, -1, -1, false), Error);
  EXPECT_THROW(Tokenizer::from_parts(vocab, {"ab"}, types, PreTokenizer::gpt2, -1, -1, false), Error);
}

TEST(Tokenizer, BadSourcesRaiseErrors) {
  EXPECT_THROW(load_tokenizer("/nonexistent/tokenizer"), Error);
  EXPECT_THROW(parse_pre_tokenizer("no-such-pre"), Error);
  const fs::path dir = fs::temp_directory_path() / "pa_tok_bad";
  fs::create_directories(dir);
  std::ofstream(dir / "tokenizer.json") << R"({"model": {"type": "Unigram", "vocab": []}})";
  try {
    load_tokenizer(dir.string());
    ADD_FAILURE();
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find("model.type"), std::string::npos) << e.what();
  }
  std::ofstream(dir / "tokenizer.json") << "{not json";
  EXPECT_THROW(load_tokenizer(dir.string()), Error);
  fs::remove_all(dir);
}

}  // namespace
}  // namespace pagedattn
