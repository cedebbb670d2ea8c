// The OpenAI parameters that change the output: implemented ones take effect (penalties,
// logit_bias, echo, response_format json_object, a list of prompts), the others get a 400 naming
// them, and every value is checked for its type and range.
#include <gtest/gtest.h>

#include <set>
#include <string>
#include <vector>

#include "server_fixture.h"

using namespace pagedattn;
using namespace pagedattn::testing_server;

namespace {

// The 400 (or other status) error naming param.
void expect_error(const httplib::Result& r, int status, const std::string& param,
                  const std::string& in_message) {
  ASSERT_TRUE(r) << "no response";
  EXPECT_EQ(r->status, status) << r->body;
  const json j = json::parse(r->body, nullptr, false);
  ASSERT_TRUE(j.is_object() && j.contains("error")) << r->body;
  EXPECT_EQ(j["error"]["param"], param) << r->body;
  EXPECT_NE(j["error"]["message"].get<std::string>().find(in_message), std::string::npos)
      << r->body;
}

json completion(const FakeServer& s, const json& body, const char* path = "/v1/completions") {
  auto r = s.post(path, body.dump());
  EXPECT_TRUE(r);
  if (!r) return json();
  EXPECT_EQ(r->status, 200) << r->body;
  return json::parse(r->body, nullptr, false);
}

class ParamsTest : public ::testing::TestWithParam<bool> {};

TEST_P(ParamsTest, UnsupportedParametersAreRefusedByName) {
  FakeServer s(GetParam());
  const std::string chat = R"({"model": "fake", "messages": [{"role": "user", "content": "x"}], )";
  const std::string cmpl = R"({"model": "fake", "prompt": "x", )";
  expect_error(s.post("/v1/chat/completions",
                      chat + R"("tools": [{"type": "function", "function": {"name": "f"}}]})"),
               400, "tools", "not supported");
  expect_error(s.post("/v1/chat/completions", chat + R"("tool_choice": "auto"})"), 400,
               "tool_choice", "not supported");
  expect_error(s.post("/v1/chat/completions", chat + R"("functions": [{"name": "f"}]})"), 400,
               "functions", "not supported");
  expect_error(s.post("/v1/completions", cmpl + R"("suffix": "end"})"), 400, "suffix",
               "not supported");
  expect_error(s.post("/v1/chat/completions", chat + R"("modalities": ["text", "audio"]})"), 400,
               "modalities", "not supported");
  expect_error(s.post("/v1/chat/completions", chat + R"("audio": {"voice": "alloy"}})"), 400,
               "audio", "not supported");
  expect_error(s.post("/v1/chat/completions",
                      chat + R"("response_format": {"type": "json_schema", "json_schema": {}}})"),
               400, "response_format", "json_schema");
  expect_error(s.post("/v1/chat/completions", chat + R"("response_format": {"type": "yaml"}})"),
               400, "response_format", "yaml");
  expect_error(s.post("/v1/chat/completions", chat + R"("response_format": "json"})"), 400,
               "response_format", "must be an object");
  expect_error(s.post("/v1/chat/completions", chat + R"("top_logprobs": 2})"), 400, "top_logprobs",
               "needs logprobs");
  expect_error(s.post("/v1/chat/completions", chat + R"("top_logprobs": 21, "logprobs": true})"),
               400, "top_logprobs", "top_logprobs must be in");
  expect_error(s.post("/v1/completions", cmpl + R"("logprobs": 2, "echo": true})"), 400,
               "logprobs", "echo");
  expect_error(s.post("/v1/completions", cmpl + R"("logprobs": 2, "top_logprobs": 2})"), 400,
               "top_logprobs", "chat completions field");
  expect_error(s.post("/v1/completions", cmpl + R"("logprobs": 9})"), 400, "logprobs",
               "logprobs must be in");
  expect_error(s.post("/v1/chat/completions", chat + R"("echo": true})"), 400, "echo",
               "not supported");
  // vLLM's extras that would change the output and are not implemented here.
  for (const char* extra :
       {R"("guided_json": {"type": "object"})", R"("guided_choice": ["a", "b"])",
        R"("guided_regex": "a+")", R"("allowed_token_ids": [1, 2])", R"("bad_words": ["x"])",
        R"("prompt_logprobs": 1)", R"("truncate_prompt_tokens": 8)", R"("min_tokens": 4)",
        R"("include_stop_str_in_output": true)", R"("skip_special_tokens": false)"}) {
    const std::string name = json::parse("{" + std::string(extra) + "}").begin().key();
    expect_error(s.post("/v1/completions", cmpl + extra + "}"), 400, name, "not supported");
  }
  // What changes nothing is accepted: tool_choice none, modalities text, response_format text,
  // vLLM's defaults.
  completion(s, json::parse(chat + R"("tool_choice": "none", "modalities": ["text"],
                                      "response_format": {"type": "text"}, "max_tokens": 2,
                                      "user": "u1", "store": false, "min_tokens": 0,
                                      "skip_special_tokens": true,
                                      "include_stop_str_in_output": false})"),
             "/v1/chat/completions");
}

TEST_P(ParamsTest, ValuesAreCheckedForTypeAndRange) {
  FakeServer s(GetParam());
  const std::string cmpl = R"({"model": "fake", "prompt": "x", )";
  for (const char* name : {"presence_penalty", "frequency_penalty"}) {
    expect_error(s.post("/v1/completions", cmpl + "\"" + name + "\": 99}"), 400, name,
                 std::string(name) + " must be in");
    expect_error(s.post("/v1/completions", cmpl + "\"" + name + "\": -2.5}"), 400, name,
                 std::string(name) + " must be in");
    expect_error(s.post("/v1/completions", cmpl + "\"" + name + "\": \"high\"}"), 400, name,
                 "number");
  }
  expect_error(s.post("/v1/completions", cmpl + R"("logit_bias": 5})"), 400, "logit_bias",
               "must be an object");
  expect_error(s.post("/v1/completions", cmpl + R"("logit_bias": {"abc": 1}})"), 400, "logit_bias",
               "token ids");
  expect_error(s.post("/v1/completions", cmpl + R"("logit_bias": {"500": 1}})"), 400, "logit_bias",
               "token ids");
  expect_error(s.post("/v1/completions", cmpl + R"("logit_bias": {"-1": 1}})"), 400, "logit_bias",
               "token ids");
  expect_error(s.post("/v1/completions", cmpl + R"("logit_bias": {"65": 101}})"), 400, "logit_bias",
               "[-100, 100]");
  expect_error(s.post("/v1/completions", cmpl + R"("logit_bias": {"65": "up"}})"), 400,
               "logit_bias", "[-100, 100]");
  expect_error(s.post("/v1/completions", cmpl + R"("user": 7})"), 400, "user", "string");
  expect_error(s.post("/v1/completions", cmpl + R"("echo": "yes"})"), 400, "echo", "boolean");
  expect_error(s.post("/v1/completions", cmpl + R"("stream_options": {"include_usage": true}})"),
               400, "stream_options", "only allowed when stream");
  // The range as a person writes it (not 2.000000).
  expect_error(s.post("/v1/completions", cmpl + R"("top_p": 1.5})"), 400, "top_p",
               "top_p must be in (0, 1], got 1.5");
  expect_error(s.post("/v1/completions", cmpl + R"("temperature": -0.1})"), 400, "temperature",
               "temperature must be in [0, 2], got -0.1");
  expect_error(s.post("/v1/completions", cmpl + R"("presence_penalty": 2.5})"), 400,
               "presence_penalty", "presence_penalty must be in [-2, 2], got 2.5");
  // An integer past int64's range is named as sent (it was clamped to 2^63 - 1 in the message).
  expect_error(s.post("/v1/completions", cmpl + R"("n": 18446744073709551615})"), 400, "n",
               "got 18446744073709551615");
}

TEST_P(ParamsTest, LogitBiasForcesAndBans) {
  FakeServer s(GetParam());
  // +100 on 'A' (65): greedy picks it every time.
  json j = completion(s, {{"model", "fake"},
                          {"prompt", "bias"},
                          {"max_tokens", 6},
                          {"temperature", 0},
                          {"logit_bias", {{"65", 100}}}});
  EXPECT_EQ(j["choices"][0]["text"], "AAAAAA");
  // -100 on the greedy first token: another one comes first.
  const std::string greedy = s.oracle_text(fakes::fake_encode("bias"), 1);
  ASSERT_EQ(greedy.size(), 1u);
  j = completion(s, {{"model", "fake"},
                     {"prompt", "bias"},
                     {"max_tokens", 1},
                     {"temperature", 0},
                     {"logit_bias", {{std::to_string(int(greedy[0])), -100}}}});
  EXPECT_NE(j["choices"][0]["text"], greedy);
  EXPECT_TRUE(s.pages_released());
}

TEST_P(ParamsTest, PenaltiesChangeRepetition) {
  FakeServer s(GetParam());
  const json base = {{"model", "fake"},
                     {"prompt", "rep"},
                     {"max_tokens", 40},
                     {"temperature", 0},
                     {"ignore_eos", true}};
  auto distinct = [](const std::string& t) { return std::set<char>(t.begin(), t.end()).size(); };
  const std::string plain = completion(s, base)["choices"][0]["text"];
  ASSERT_EQ(plain, s.oracle_text(fakes::fake_encode("rep"), 40));
  json b = base;
  b["frequency_penalty"] = 2.0;
  const std::string freq = completion(s, b)["choices"][0]["text"];
  b = base;
  b["presence_penalty"] = 2.0;
  const std::string pres = completion(s, b)["choices"][0]["text"];
  b = base;
  b["frequency_penalty"] = -2.0;
  const std::string rep = completion(s, b)["choices"][0]["text"];
  // The fake model's logits span a few units: a penalty of 2 per use spreads the output over more
  // distinct tokens, a negative one collapses it.
  EXPECT_GT(distinct(freq), distinct(plain)) << plain << " | " << freq;
  EXPECT_GT(distinct(pres), distinct(plain)) << plain << " | " << pres;
  EXPECT_LE(distinct(rep), distinct(plain)) << plain << " | " << rep;
  EXPECT_NE(rep, plain);
  EXPECT_TRUE(s.pages_released());
}

TEST_P(ParamsTest, EchoPrependsThePrompt) {
  FakeServer s(GetParam());
  json j = completion(s, {{"model", "fake"},
                          {"prompt", "Echo me"},
                          {"max_tokens", 5},
                          {"temperature", 0},
                          {"echo", true}});
  EXPECT_EQ(j["choices"][0]["text"], "Echo me" + s.oracle_text(fakes::fake_encode("Echo me"), 5));
  // A token-id prompt is echoed as its text.
  j = completion(s, {{"model", "fake"},
                     {"prompt", {72, 105}},
                     {"max_tokens", 3},
                     {"temperature", 0},
                     {"echo", true}});
  EXPECT_EQ(j["choices"][0]["text"], "Hi" + s.oracle_text({72, 105}, 3));
  // Streamed: the prompt comes first.
  auto r = s.post("/v1/completions", R"({"model": "fake", "prompt": "Echo", "max_tokens": 4,
                                         "temperature": 0, "echo": true, "stream": true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  std::string text;
  for (size_t at = r->body.find("data: {"); at != std::string::npos;
       at = r->body.find("data: {", at + 1)) {
    const json e = json::parse(r->body.substr(at + 6, r->body.find("\n\n", at) - at - 6));
    if (!e["choices"].empty()) text += e["choices"][0]["text"].get<std::string>();
  }
  EXPECT_EQ(text, "Echo" + s.oracle_text(fakes::fake_encode("Echo"), 4));
  EXPECT_TRUE(s.pages_released());
}

TEST_P(ParamsTest, ListOfPromptsGivesOneChoicePerPrompt) {
  FakeServer s(GetParam());
  json j = completion(s, {{"model", "fake"},
                          {"prompt", {"first", "second one", "3"}},
                          {"max_tokens", 4},
                          {"temperature", 0}});
  ASSERT_EQ(j["choices"].size(), 3u);
  const std::vector<std::string> prompts = {"first", "second one", "3"};
  for (size_t k = 0; k < 3; ++k) {
    EXPECT_EQ(j["choices"][k]["index"], k);
    EXPECT_EQ(j["choices"][k]["text"], s.oracle_text(fakes::fake_encode(prompts[k]), 4));
  }
  EXPECT_EQ(j["usage"]["completion_tokens"], 12);
  EXPECT_EQ(j["usage"]["prompt_tokens"], 5 + 10 + 1);
  // Token-id prompts, with n = 2: choice k * n + i.
  j = completion(s, {{"model", "fake"},
                     {"prompt", {{72, 105}, {66}}},
                     {"max_tokens", 3},
                     {"temperature", 0},
                     {"n", 2}});
  ASSERT_EQ(j["choices"].size(), 4u);
  for (size_t c = 0; c < 4; ++c) {
    EXPECT_EQ(j["choices"][c]["index"], c);
    EXPECT_EQ(j["choices"][c]["text"],
              s.oracle_text(c < 2 ? std::vector<int32_t>{72, 105} : std::vector<int32_t>{66}, 3));
  }
  expect_error(
      s.post("/v1/completions", R"({"model": "fake", "prompt": ["a", "b"], "stream": true})"), 400,
      "prompt", "cannot be streamed");
  expect_error(s.post("/v1/completions", R"({"model": "fake", "prompt": ["a", 5]})"), 400, "prompt",
               "prompt must be");
  EXPECT_TRUE(s.pages_released());
}

// response_format json_object: every output is a JSON object, or (cut by max_tokens, finish_reason
// "length") a prefix of one, judged by nlohmann::json.
TEST_P(ParamsTest, JsonObjectOutputParses) {
  FakeServer s(GetParam());
  int complete = 0;
  for (int seed = 0; seed < 12; ++seed) {
    for (const char* path : {"/v1/chat/completions", "/v1/completions"}) {
      json b = {{"model", "fake"},
                {"max_tokens", 60},
                {"seed", seed},
                {"temperature", seed % 3 == 0 ? 0.0 : 1.0},
                {"response_format", {{"type", "json_object"}}}};
      if (std::string(path) == "/v1/completions")
        b["prompt"] = "json please";
      else
        b["messages"] = {{{"role", "user"}, {"content", "json please"}}};
      // Steer the fake model towards closing brackets and quotes, so that some outputs end.
      b["logit_bias"] = {{"125", 6}, {"34", 5}, {"58", 3}, {"49", 4}};
      const json j = completion(s, b, path);
      const json& c = j["choices"][0];
      const std::string text = c.contains("message") ? c["message"]["content"].get<std::string>()
                                                     : c["text"].get<std::string>();
      if (c["finish_reason"] == "stop") {
        const json parsed = json::parse(text, nullptr, false);
        EXPECT_TRUE(parsed.is_object()) << text;
        ++complete;
      } else {
        EXPECT_EQ(c["finish_reason"], "length");
        try {
          (void)json::parse(text);
          ADD_FAILURE() << "a cut output parsed whole: " << text;
        } catch (const json::parse_error& e) {
          EXPECT_GT(e.byte, text.size()) << "not a JSON prefix: " << text;
        }
        EXPECT_EQ(text.find_first_not_of(" \t\n\r"),
                  text.empty() ? std::string::npos : text.find('{'));
      }
    }
  }
  EXPECT_GT(complete, 0);
  EXPECT_TRUE(s.pages_released());
}

// logprobs: chat's content list and completions' parallel lists, one entry per generated token, in
// both answers and streams; the tokens' texts spell the output.
TEST_P(ParamsTest, LogprobsInChatAndCompletions) {
  FakeServer s(GetParam());
  json j = completion(s, json::parse(R"({"model": "fake", "messages": [{"role": "user",
      "content": "hi"}], "max_tokens": 6, "temperature": 0.8, "seed": 3, "logprobs": true,
      "top_logprobs": 3})"), "/v1/chat/completions");
  const json content = j["choices"][0]["logprobs"]["content"];  // j is reused below
  ASSERT_TRUE(content.is_array()) << j.dump();
  EXPECT_EQ(content.size(), j["usage"]["completion_tokens"].get<size_t>());
  std::string spelled;
  for (const json& t : content) {
    spelled += t["token"].get<std::string>();
    EXPECT_LE(t["logprob"].get<double>(), 0.0);
    EXPECT_EQ(t["bytes"].size(), t["token"].get<std::string>().size());
    ASSERT_EQ(t["top_logprobs"].size(), 3u);
    for (size_t k = 1; k < 3; ++k)
      EXPECT_GE(t["top_logprobs"][k - 1]["logprob"].get<double>(),
                t["top_logprobs"][k]["logprob"].get<double>());
    EXPECT_GE(t["top_logprobs"][0]["logprob"].get<double>(), t["logprob"].get<double>());
  }
  EXPECT_EQ(spelled, j["choices"][0]["message"]["content"].get<std::string>());

  j = completion(s, json::parse(R"({"model": "fake", "prompt": "abc", "max_tokens": 5,
      "temperature": 0, "logprobs": 2})"));
  const json& lp = j["choices"][0]["logprobs"];
  ASSERT_EQ(lp["tokens"].size(), j["usage"]["completion_tokens"].get<size_t>()) << j.dump();
  ASSERT_EQ(lp["token_logprobs"].size(), lp["tokens"].size());
  ASSERT_EQ(lp["top_logprobs"].size(), lp["tokens"].size());
  ASSERT_EQ(lp["text_offset"].size(), lp["tokens"].size());
  spelled.clear();
  for (size_t i = 0; i < lp["tokens"].size(); ++i) {
    EXPECT_EQ(lp["text_offset"][i].get<size_t>(), spelled.size());
    spelled += lp["tokens"][i].get<std::string>();
    EXPECT_LE(lp["top_logprobs"][i].size(), 2u);
    // Greedy: the chosen token is the most likely one.
    double best = -1e9;
    for (const auto& [tok, v] : lp["top_logprobs"][i].items())
      best = std::max(best, v.get<double>());
    EXPECT_NEAR(lp["token_logprobs"][i].get<double>(), best, 1e-6);
  }
  EXPECT_EQ(spelled, j["choices"][0]["text"].get<std::string>());

  // A stream carries each token's logprobs in the chunk that carries the token.
  auto r = s.post("/v1/chat/completions", R"({"model": "fake", "messages": [{"role": "user",
      "content": "hi"}], "max_tokens": 6, "temperature": 0.8, "seed": 3, "logprobs": true,
      "top_logprobs": 3, "stream": true})");
  ASSERT_TRUE(r);
  ASSERT_EQ(r->status, 200) << r->body;
  json streamed = json::array();
  for (size_t pos = 0; (pos = r->body.find("data: {", pos)) != std::string::npos;) {
    const size_t end = r->body.find("\n\n", pos);
    const json e = json::parse(r->body.substr(pos + 6, end - pos - 6));
    pos = end;
    const json& choice = e.at("choices").at(0);
    ASSERT_TRUE(choice.contains("logprobs")) << e.dump();  // null where a chunk has no token
    const json& l = choice.at("logprobs");
    if (l.is_object())
      for (const json& t : l.at("content")) streamed.push_back(t);
  }
  EXPECT_EQ(streamed, content);
}

INSTANTIATE_TEST_SUITE_P(PrefixCache, ParamsTest, ::testing::Bool(),
                         [](const ::testing::TestParamInfo<bool>& i) {
                           return i.param ? "on" : "off";
                         });

}  // namespace
