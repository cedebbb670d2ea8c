// The JSON prefix automaton against nlohmann::json as the oracle: a text is a valid prefix exactly
// when the parser fails only at the end of the input (or parses it whole, top level an object).
#include <gtest/gtest.h>

#include <cmath>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "pagedattn/error.h"
#include "pagedattn/json_grammar.h"

using namespace pagedattn;

namespace {

enum class Oracle { invalid, prefix, complete };

// The parser's verdict through its SAX interface (no exceptions: the walks ask it ~10^5 times).
struct Verdict : nlohmann::json_sax<nlohmann::json> {
  bool failed = false, eof = false;
  size_t position = 0;
  int depth = 0;
  bool top_object = false;
  bool null() override { return true; }
  bool boolean(bool) override { return true; }
  bool number_integer(number_integer_t) override { return true; }
  bool number_unsigned(number_unsigned_t) override { return true; }
  bool number_float(number_float_t, const string_t&) override { return true; }
  bool string(string_t&) override { return true; }
  bool binary(binary_t&) override { return true; }
  bool start_object(std::size_t) override {
    if (depth++ == 0) top_object = true;
    return true;
  }
  bool key(string_t&) override { return true; }
  bool end_object() override { return --depth, true; }
  bool start_array(std::size_t) override { return ++depth, true; }
  bool end_array() override { return --depth, true; }
  bool parse_error(std::size_t pos, const std::string&,
                   const nlohmann::detail::exception& e) override {
    failed = true;
    position = pos;
    eof = std::string(e.what()).find("unexpected end of input") != std::string::npos;
    return false;
  }
};

Verdict judge(const std::string& s) {
  Verdict v;
  nlohmann::json::sax_parse(s, &v);
  return v;
}

// Whether the parser runs out of input in the middle of a well-formed text (not in a bad token).
bool ends_early(const std::string& s) {
  const Verdict v = judge(s);
  return v.failed ? v.position > s.size() && v.eof : v.top_object;
}

// s is a prefix when some short ending completes the token it ends in (a string, an escape, a
// \uXXXX or surrogate pair, a UTF-8 character, a number, a literal) and the parser then fails only
// for want of more input. NOTE: the parser alone cannot judge a text that ends inside a token: it
// lexes the token to its end before it checks that the token may come there ("{-" fails at its
// end, like the valid "{\"a\":-").
Oracle oracle(const std::string& s) {
  const size_t first = s.find_first_not_of(" \t\n\r");
  if (first != std::string::npos && s[first] != '{') return Oracle::invalid;
  if (const Verdict v = judge(s); !v.failed)
    return v.top_object ? Oracle::complete : Oracle::invalid;
  static const char* kEndings[] = {"",
                                   "0",
                                   "\"",
                                   "n\"",
                                   "0\"",
                                   "00\"",
                                   "000\"",
                                   "0000\"",
                                   "\\udc00\"",
                                   "udc00\"",
                                   "dc00\"",
                                   "c00\"",
                                   "\x80\"",
                                   "\x80\x80\"",
                                   "\x80\x80\x80\"",
                                   "\xa0\x80\"",
                                   "\x90\x80\x80\"",
                                   "rue",
                                   "ue",
                                   "e",
                                   "alse",
                                   "lse",
                                   "se",
                                   "ull",
                                   "ll",
                                   "l"};
  for (const char* e : kEndings)
    if (ends_early(s + e)) return Oracle::prefix;
  return Oracle::invalid;
}

Oracle mine(const std::string& s) {
  JsonPrefix p;
  if (!p.feed(s)) return Oracle::invalid;
  return p.complete() ? Oracle::complete : Oracle::prefix;
}

TEST(JsonGrammar, KnownTexts) {
  for (const char* ok : {"", " ", "{", "{}", "{\"a\"", "{\"a\":", "{\"a\": -0.5e+3", "{\"a\":[1,",
                         "{\"a\":[1,{\"b\":null}]}", "{\"k\":\"\\u00e9\\ud83d\\ude00\"}",
                         "{\"a\":tr", "{\"x\":\"caf\xc3\xa9\"}  "}) {
    EXPECT_NE(mine(ok), Oracle::invalid) << ok;
    EXPECT_EQ(mine(ok), oracle(ok)) << ok;
  }
  for (const char* bad : {"[", "1", "\"a\"", "{,", "{\"a\" 1", "{\"a\":01", "{\"a\":-x",
                          "{\"a\":[1,]", "{\"a\":1}x", "{\"a\":\"\x01\"", "{\"a\":\"\\x\"",
                          "{\"a\":\"\\udc00\"", "{\"a\":\"\\ud800x\"", "{\"a\":\"\xc0\x80\"",
                          "{\"a\":\"\xed\xa0\x80\"", "{\"a\":1.}", "{\"a\":trux", "{}}", "{]"}) {
    EXPECT_EQ(mine(bad), Oracle::invalid) << bad;
    EXPECT_EQ(oracle(bad), Oracle::invalid) << bad;
  }
  JsonPrefix p;
  EXPECT_TRUE(p.feed("{\"a\":[1"));
  EXPECT_FALSE(p.feed("}"));  // the array is open: rejected, state unchanged
  EXPECT_EQ(p.depth(), 2);
  EXPECT_TRUE(p.feed("]}"));
  EXPECT_TRUE(p.complete());
}

// Random walks that extend a text byte by byte: at every step both agree on the extended text.
TEST(JsonGrammar, AgreesWithParserOnRandomWalks) {
  const std::string alphabet = std::string("{}[]\":,-+.0123456789eE tfalsenur\\/bu\n") + "dD8cCf" +
                               "\xc3\xa9\xed\xa0\xf0\x9f\x98\x80\xff\x01";
  std::mt19937 rng(7);
  int steps = 0, kept = 0, completes = 0;
  for (int walk = 0; walk < 300; ++walk) {
    std::string s;
    for (int i = 0; i < 80; ++i) {
      // Bias towards structure early so walks go deep.
      const char c = alphabet[rng() % alphabet.size()];
      const std::string t = s + c;
      const Oracle want = oracle(t);
      ASSERT_EQ(mine(t), want) << "text: " << t;
      ++steps;
      if (want != Oracle::invalid) {
        s = t;
        ++kept;
        if (want == Oracle::complete) ++completes;
      }
    }
  }
  EXPECT_GT(kept, 2000);  // the walks went somewhere
  EXPECT_GT(completes, 10);
}

TEST(JsonGrammar, MaskKeepsOnlyTokensThatContinueThePrefix) {
  const std::vector<std::string> bytes = {"", "{", "{\"", "}", "\"a\":", " ", "1", "x", "\"}"};
  std::vector<float> logits(bytes.size(), 0.f);
  JsonPrefix p;
  EXPECT_EQ(mask_json_logits(p, bytes, logits), 3);  // "{", "{\"" and " "
  EXPECT_TRUE(std::isinf(logits[0]));  // no bytes (end of sequence): not before the end
  EXPECT_EQ(logits[1], 0.f);
  EXPECT_EQ(logits[2], 0.f);
  EXPECT_TRUE(std::isinf(logits[3]));
  EXPECT_EQ(logits[5], 0.f);
  EXPECT_TRUE(std::isinf(logits[7]));
  std::vector<float> wrong(3, 0.f);
  EXPECT_THROW(mask_json_logits(p, bytes, wrong), Error);
}

}  // namespace
