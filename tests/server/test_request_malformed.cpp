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

}  // namespace

TEST(RequestMalformed, ContentPartTypeOfTheWrongTypeIsA400) {
  EngineConfig ec;
  ec.kv_cache_tokens = 1024;
  ec.log_startup = false;
  Engine engine(std::make_unique<fakes::FakeModel>(128, std::vector<int32_t>{0}, 512), ec,
                fakes::fake_decode);
  TextCodec codec{
      [](const std::string& t) { return fakes::fake_encode(t); },
      [](const std::vector<ChatMessage>& m) { return fakes::fake_encode(m[0].content); }};
  ServerConfig sc;
  sc.model_name = "fuzz";
  // The fuzz input: byte 0 picks chat, the rest is the body.
  const std::string input = regression("content_part_type_number");
  ASSERT_FALSE(input.empty());
  ASSERT_EQ(input[0], '\x01');
  try {
    api::parse_request(input.substr(1), true, sc, codec, engine);
    ADD_FAILURE() << "accepted";
  } catch (const api::ApiError& e) {
    EXPECT_EQ(e.status, 400);
    EXPECT_EQ(e.param, "messages");
    EXPECT_NE(std::string(e.what()).find("content parts"), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not an ApiError: " << e.what();
  }
}
