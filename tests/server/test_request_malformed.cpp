// The request parser (api::parse_request) called directly on bodies the request fuzz target found:
// each escaped as an exception other than api::ApiError (a server error, or a 400 with a library's
// message and the wrong param), and must now be a 4xx naming the field.
#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <memory>
#include <string>

#include "engine/fake_model.h"
#include "server/openai_api.h"

using namespace pagedattn;

namespace {

std::string regression(const std::string& name) {
  // tests/server/<this file> -> tests/fuzz/regressions/request/<name> (PAGEDATTN_TESTS_DIR: a
  // build whose __FILE__ is relative to another folder says where tests/ is)
#ifdef PAGEDATTN_TESTS_DIR
  const auto tests = std::filesystem::path(PAGEDATTN_TESTS_DIR);
#else
  const auto tests = std::filesystem::path(__FILE__).parent_path().parent_path();
#endif
  const auto p = tests / "fuzz" / "regressions" / "request" / name;
  std::ifstream in(p, std::ios::binary);
  EXPECT_TRUE(in) << p;
  return {std::istreambuf_iterator<char>(in), {}};
}

struct Parser {
  Engine engine;
  TextCodec codec;
  ServerConfig sc;
  Parser()
      : engine(std::make_unique<fakes::FakeModel>(128, std::vector<int32_t>{0}, 512),
               [] {
                 EngineConfig ec;
                 ec.kv_cache_tokens = 1024;
                 ec.log_startup = false;
                 return ec;
               }(),
               fakes::fake_decode),
        codec{[](const std::string& t) { return fakes::fake_encode(t); },
              [](const std::vector<ChatMessage>& m) { return fakes::fake_encode(m[0].content); }} {
    sc.model_name = "fuzz";
  }
  // The ApiError a completion body raises (status 0 when it is accepted).
  api::ApiError error_of(const std::string& body) {
    try {
      api::parse_request(body, false, sc, codec, engine);
    } catch (const api::ApiError& e) {
      return e;
    }
    return api::ApiError(0, "accepted", "", "");
  }
};

std::string nested(int depth) {
  return std::string(size_t(depth), '[') + std::string(size_t(depth), ']');
}

}  // namespace

TEST(RequestMalformed, ContentPartTypeOfTheWrongTypeIsA400) {
  Parser p;
  // The fuzz input: byte 0 picks chat, the rest is the body.
  const std::string input = regression("content_part_type_number");
  ASSERT_FALSE(input.empty());
  ASSERT_EQ(input[0], '\x01');
  try {
    api::parse_request(input.substr(1), true, p.sc, p.codec, p.engine);
    ADD_FAILURE() << "accepted";
  } catch (const api::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages");
    EXPECT_NE(std::string(e.what()).find("content parts"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an ApiError: " << e.what();
  }
}


// A body of 1 MiB can nest half a million arrays; naming such a value in an error message printed
// it recursively and overflowed the handler's stack (the server died). Bodies nesting deeper than
// 64 levels are refused before they are parsed; brackets inside strings do not count.
TEST(RequestMalformed, DeeplyNestedBodiesAreRefusedBeforeParsing) {
  Parser p;
  const std::string head = R"({"model":"fuzz","max_tokens":1,"prompt":"hi",)";
  for (int depth : {65, 300000}) {
    const api::ApiError e = p.error_of(head + R"("logit_bias":{"1":)" + nested(depth) + "}}");
    EXPECT_EQ(e.status, 400) << depth;
    EXPECT_EQ(e.code, "invalid_json") << depth;
    EXPECT_NE(std::string(e.what()).find("deeper than 64"), std::string::npos) << e.what();
  }
  // 64 levels in all (the body's object, logit_bias's, 62 arrays) are parsed and checked.
  const api::ApiError at_limit = p.error_of(head + R"("logit_bias":{"1":)" + nested(62) + "}}");
  EXPECT_EQ(at_limit.status, 400);
  EXPECT_EQ(at_limit.param, "logit_bias");
  EXPECT_NE(std::string(at_limit.what()).find("got an array"), std::string::npos)
      << at_limit.what();
  const std::string brackets(5000, '[');
  EXPECT_EQ(p.error_of(R"({"model":"fuzz","max_tokens":1,"prompt":")" + brackets + R"(\"["})")
                .status,
            0);
}

// Error messages quote at most 64 bytes of what the client sent.
TEST(RequestMalformed, ErrorMessagesQuoteABoundedPartOfTheRequest) {
  Parser p;
  const std::string big(100000, 'x');
  for (const std::string& body :
       {R"({"model":")" + big + R"(","prompt":"hi"})",
        R"({"model":"fuzz","prompt":"hi","logit_bias":{")" + big + R"(":1}})",
        R"({"model":"fuzz","prompt":"hi","logit_bias":{"1":")" + big + R"("}})",
        R"({"model":"fuzz","prompt":"hi","response_format":{"type":")" + big + R"("}})"}) {
    const api::ApiError e = p.error_of(body);
    EXPECT_GE(e.status, 400);
    EXPECT_LT(std::string(e.what()).size(), 300u) << std::string(e.what()).substr(0, 200);
    EXPECT_NE(std::string(e.what()).find("xxx..."), std::string::npos) << e.what();
  }
}

// A raw NUL byte is not JSON anywhere in a body; the parser took it for the end of the input and
// accepted what came before it.
TEST(RequestMalformed, NulBytesAreNotJson) {
  Parser p;
  const std::string ok = R"({"model":"fuzz","max_tokens":1,"prompt":"hi"})";
  EXPECT_EQ(p.error_of(ok).status, 0);
  for (const std::string& body : {ok + std::string(2, '\0'), ok + std::string(1, '\0') + "{}",
                                  R"({"model":"fuzz","max_tokens":1,"prompt":"h)" +
                                      std::string(1, '\0') + R"(i"})"}) {
    const api::ApiError e = p.error_of(body);
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.code, "invalid_json") << e.what();
  }
  // An escaped NUL inside a string is JSON.
  EXPECT_EQ(p.error_of(R"({"model":"fuzz","max_tokens":1,"prompt":"h\u0000i"})").status, 0);
}

// A quoted value keeps its escaped NULs and other control bytes visible (\xNN): the message was
// cut at the first NUL where it was read as a C string, and a cut never splits a character.
TEST(RequestMalformed, QuotedValuesShowControlBytesAndWholeCharacters) {
  Parser p;
  api::ApiError e = p.error_of(R"({"model":"fuzz\u0000x","prompt":"hi"})");
  EXPECT_EQ(e.status, 404);
  EXPECT_NE(std::string(e.what()).find("'fuzz\\x00x'"), std::string::npos) << e.what();
  try {
    api::parse_request(R"({"model":"fuzz","messages":[{"role":"user\u0000","content":"hi"}]})",
                       true, p.sc, p.codec, p.engine);
    ADD_FAILURE() << "a role with a NUL was accepted";
  } catch (const api::ApiError& c) {
    EXPECT_NE(std::string(c.what()).find("'user\\x00' is not one of"), std::string::npos)
        << c.what();
  }
  // 63 ASCII bytes and a 3-byte character: the cut at 64 bytes falls inside it, so it goes whole.
  e = p.error_of(R"({"model":")" + std::string(63, 'a') + "\xe2\x82\xac" + R"(zz","prompt":"hi"})");
  const std::string m = e.what();
  EXPECT_NE(m.find("'" + std::string(63, 'a') + "...'"), std::string::npos) << m;
}

// Numbers inside a documented range that single precision or int64 cannot hold: an open bound's
// tiny value is kept inside it, an integer past int64 is named out of range (not "not an
// integer").
TEST(RequestMalformed, NumbersPastTheTypesRanges) {
  Parser p;
  for (const char* f : {"top_p", "repetition_penalty"})
    EXPECT_EQ(
        p.error_of(std::string(R"({"model":"fuzz","max_tokens":1,"prompt":"hi",")") + f +
                   R"(":1e-300})")
            .status,
        0)
        << f;
  const api::ApiError e =
      p.error_of(R"({"model":"fuzz","max_tokens":1,"prompt":"hi","seed":18446744073709551616})");
  EXPECT_EQ(e.status, 400);
  EXPECT_EQ(e.code, "invalid_value") << e.what();
  EXPECT_NE(std::string(e.what()).find("seed must be in ["), std::string::npos) << e.what();
}
