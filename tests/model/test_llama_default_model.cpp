// The default model (SmolLM2-135M-Instruct, Q4_1 GGUF, fetched by scripts/fetch-default-model.sh):
// real weights through LlamaModel against the naive oracle, and a greedy continuation that knows
// the capital of France. Skipped when the model file is absent.
#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "default_model.h"
#include "pagedattn/kv_cache.h"
#include "pagedattn/llama.h"
#include "pagedattn/tokenizer.h"
#include "step_batch.h"
#include "test_llama_oracle.h"

using namespace pagedattn;

namespace {

using pagedattn::testing::default_model_path;

// One name for the default model: the C++ constant (pagedattn/default_model.h) and the scripts'
// variable (scripts/default-model.sh) must agree, and the path ends in the file's name.
TEST(DefaultModelName, CodeAndScriptsNameTheSameFile) {
  std::ifstream f(pagedattn::testing::repo_root() / "scripts" / "default-model.sh");
  ASSERT_TRUE(f) << "scripts/default-model.sh is missing";
  std::string line, name;
  while (std::getline(f, line))
    if (line.rfind("DEFAULT_MODEL_NAME=", 0) == 0) name = line.substr(19);
  EXPECT_EQ(name, kDefaultModelFile);
  EXPECT_EQ(std::string(kDefaultModelPath), std::string("models/") + kDefaultModelFile);
}

struct DefaultModel : ::testing::Test {
  static void SetUpTestSuite() {
    if (!std::filesystem::exists(default_model_path())) return;
    file = new ModelFile(load_model_file(default_model_path()));
    tok = new Tokenizer(load_tokenizer(default_model_path()));
  }
  static void TearDownTestSuite() {
    delete file;
    delete tok;
    file = nullptr;
    tok = nullptr;
  }
  void SetUp() override {
    if (!file)
      GTEST_SKIP() << default_model_path() << " is absent (scripts/fetch-default-model.sh)";
  }
  static KvCacheConfig cache_config(int32_t pages) {
    KvCacheConfig k;
    k.num_layers = file->config.num_layers;
    k.num_kv_heads = file->config.num_kv_heads;
    k.head_dim = file->config.head_dim;
    k.page_size = 16;
    k.num_pages = pages;
    k.enable_prefix_cache = false;
    return k;
  }
  static ModelFile* file;
  static Tokenizer* tok;
};
ModelFile* DefaultModel::file = nullptr;
Tokenizer* DefaultModel::tok = nullptr;

TEST_F(DefaultModel, LogitsMatchNaiveOracle) {
  LlamaModel model(*file);
  KvCache cache(cache_config(4));
  const std::vector<int32_t> ids = tok->encode("Paged attention stores keys", true, false);
  ASSERT_GE(ids.size(), 3u);
  const SeqId s = cache.create_sequence();
  // Prefill all but the last token, then decode the last: both paths through the cache.
  std::vector<int32_t> head(ids.begin(), ids.end() - 1);
  Tensor pre = model.forward(make_step_batch(cache, {s}, {head}, true), cache);
  Tensor dec = model.forward(make_step_batch(cache, {s}, {{ids.back()}}), cache);
  const auto want = test::NaiveLlama(*file).logits(ids);
  const int64_t V = file->config.vocab_size;
  for (size_t r = 0; r < ids.size(); ++r) {
    const float* got =
        r + 1 < ids.size() ? pre.data_as<float>() + int64_t(r) * V : dec.data_as<float>();
    double err = 0, scale = 1;
    for (int64_t i = 0; i < V; ++i) {
      err = std::max(err, std::abs(double(got[i]) - want[r][size_t(i)]));
      scale = std::max(scale, std::abs(want[r][size_t(i)]));
    }
    EXPECT_LT(err / scale, 1e-4) << "position " << r;
  }
}

TEST_F(DefaultModel, GreedyKnowsTheCapitalOfFrance) {
  auto model = create_model(*file, Device::cpu);
  KvCache cache(cache_config(4));
  std::vector<int32_t> ids = tok->encode("The capital of France is", true, false);
  const SeqId s = cache.create_sequence();
  const int64_t V = file->config.vocab_size;
  std::vector<int32_t> out;
  std::vector<int32_t> next = ids;
  for (int i = 0; i < 6; ++i) {
    Tensor l = model->forward(make_step_batch(cache, {s}, {next}), cache);
    const float* row = l.data_as<float>();
    const int32_t t = int32_t(std::max_element(row, row + V) - row);
    out.push_back(t);
    next = {t};
  }
  const std::string text = tok->decode(out);
  EXPECT_NE(text.find("Paris"), std::string::npos) << "continuation: '" << text << "'";
}

}  // namespace
