// RoPE scaling (rope.h) against transformers: linear and YaRN configs parsed from config.json text
// (parse_hf_config) give the inverse frequencies and cos/sin factor that transformers'
// ROPE_INIT_FUNCTIONS computes (tests/model/rope_scaling_golden.json, written by
// rope_scaling_oracle.py; transformers computes in f32, hence the tolerance); bad parameters are
// refused by name.
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <sstream>
#include <string>
#include <vector>

#include "model/rope.h"
#include "pagedattn/error.h"
#include "pagedattn/model_file.h"

using namespace pagedattn;
using nlohmann::json;

namespace {

json golden() {
  const auto path = std::filesystem::path(__FILE__).parent_path() / "rope_scaling_golden.json";
  std::ifstream in(path);
  EXPECT_TRUE(in.good()) << path;
  std::stringstream ss;
  ss << in.rdbuf();
  return json::parse(ss.str());
}

// A llama config.json of the case's shape with its rope_scaling (the legacy key) or, transformers
// >= 5's way, rope_parameters with rope_theta inside.
std::string config_text(const json& c, bool parameters) {
  json j = {{"architectures", {"LlamaForCausalLM"}},
            {"model_type", "llama"},
            {"vocab_size", 256},
            {"hidden_size", c["head_dim"].get<int>() * 4},
            {"intermediate_size", 64},
            {"num_hidden_layers", 1},
            {"num_attention_heads", 4},
            {"num_key_value_heads", 4},
            {"head_dim", c["head_dim"]},
            {"max_position_embeddings", c["max_position_embeddings"]}};
  if (parameters) {
    json rp = c["rope_scaling"];
    rp["rope_theta"] = c["rope_theta"];
    j["rope_parameters"] = rp;
  } else {
    j["rope_theta"] = c["rope_theta"];
    j["rope_scaling"] = c["rope_scaling"];
  }
  return j.dump();
}

}  // namespace

TEST(RopeScaling, LinearAndYarnMatchTransformers) {
  const json g = golden();
  ASSERT_GE(g["cases"].size(), 8u);
  for (const json& c : g["cases"]) {
    for (bool parameters : {false, true}) {
      const ModelConfig cfg = parse_hf_config(config_text(c, parameters), "config.json");
      const std::string what = c["rope_scaling"].dump() + (parameters ? " (rope_parameters)" : "");
      EXPECT_EQ(cfg.rope_scaling.type, c["rope_scaling"]["rope_type"].get<std::string>()) << what;
      const std::vector<double> inv = rope_inv_freq(cfg.head_dim, cfg.rope_theta, cfg.rope_scaling);
      const std::vector<double> want = c["inv_freq"].get<std::vector<double>>();
      ASSERT_EQ(inv.size(), want.size()) << what;
      for (size_t i = 0; i < inv.size(); ++i)
        EXPECT_NEAR(inv[i], want[i], 2e-6 * want[i]) << what << " frequency " << i;
      EXPECT_NEAR(rope_attention_factor(cfg.rope_scaling), c["attention_factor"].get<double>(),
                  1e-6)
          << what;
    }
  }
}

// The tables carry the factor; unscaled configs keep factor 1 and their bits.
TEST(RopeScaling, TablesCarryTheAttentionFactor) {
  RopeScaling y;
  y.type = "yarn";
  y.factor = 4.f;
  y.original_max_position = 4096;
  const double f = rope_attention_factor(y);
  EXPECT_NEAR(f, 0.1 * std::log(4.0) + 1.0, 1e-12);
  const std::vector<double> inv = rope_inv_freq(64, 10000.f, y);
  const int32_t pos[] = {0, 1, 777, 20000};
  std::vector<float> c1(4 * 32), s1(4 * 32), cf(4 * 32), sf(4 * 32);
  rope_tables(inv, pos, 4, c1.data(), s1.data());
  rope_tables(inv, pos, 4, cf.data(), sf.data(), f);
  for (size_t i = 0; i < c1.size(); ++i) {
    EXPECT_NEAR(cf[i], c1[i] * f, 1e-6);
    EXPECT_NEAR(sf[i], s1[i] * f, 1e-6);
  }
  EXPECT_EQ(rope_attention_factor(RopeScaling{}), 1.0);
  RopeScaling lin;
  lin.type = "linear";
  lin.factor = 2.f;
  EXPECT_EQ(rope_attention_factor(lin), 1.0);
}

TEST(RopeScaling, BadParametersAreRefusedByName) {
  auto refused = [](const std::string& scaling, const std::string& needle) {
    const std::string text =
        R"({"architectures": ["LlamaForCausalLM"], "vocab_size": 256, "hidden_size": 256,
            "intermediate_size": 64, "num_hidden_layers": 1, "num_attention_heads": 4,
            "max_position_embeddings": 4096, "rope_scaling": )" +
        scaling + "}";
    try {
      parse_hf_config(text, "config.json");
      ADD_FAILURE() << "taken: " << scaling;
    } catch (const Error& e) {
      EXPECT_NE(std::string(e.what()).find(needle), std::string::npos) << e.what();
    }
  };
  refused(R"({"rope_type": "linear", "factor": 0})", "linear factor");
  refused(R"({"rope_type": "yarn", "factor": -2, "original_max_position_embeddings": 1024})",
          "yarn needs");
  refused(R"({"rope_type": "yarn", "factor": 4, "beta_fast": 0})", "yarn needs");
  refused(R"({"rope_type": "dynamic", "factor": 2})", "unsupported rope_type 'dynamic'");
  RopeScaling y;
  y.type = "yarn";
  y.factor = 4.f;
  y.original_max_position = 0;
  EXPECT_THROW(rope_inv_freq(64, 10000.f, y), Error);
  EXPECT_THROW(rope_attention_factor(y), Error);
}
