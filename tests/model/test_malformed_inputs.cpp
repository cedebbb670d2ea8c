// The model-file readers against malformed input: the inputs the fuzz targets of tests/fuzz found
// (each once crashed, leaked or escaped as something other than pagedattn::Error), and the seeds
// of their corpora, which must stay valid files (a seed the reader rejects fuzzes nothing deep).
#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <string>

#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "pagedattn/model_file.h"
#include "pagedattn/tokenizer.h"
#include "test_gguf_writer.h"

using namespace pagedattn;

namespace {

std::filesystem::path corpus(const std::string& target) {
  // tests/model/<this file> -> tests/fuzz/corpus/<target>.
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "fuzz" / "corpus" / target;
}

std::filesystem::path regressions(const std::string& target) {
  return std::filesystem::path(__FILE__).parent_path().parent_path() / "fuzz" / "regressions" /
         target;
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), {}};
}

// Runs f and expects a pagedattn::Error whose message contains every part of `want`.
template <class F>
void expect_error(F&& f, std::initializer_list<const char*> want) {
  try {
    f();
    ADD_FAILURE() << "no error";
  } catch (const Error& e) {
    for (const char* w : want)
      EXPECT_NE(std::string(e.what()).find(w), std::string::npos) << e.what();
  } catch (const std::exception& e) {
    ADD_FAILURE() << "not a pagedattn::Error: " << e.what();
  }
}

}  // namespace

TEST(FuzzSeeds, AreValidFiles) {
  for (const char* name : {"tiny_llama.gguf", "tiny_qwen2.gguf", "tiny_qwen3_v2.gguf"}) {
    const std::string path = (corpus("gguf") / name).string();
    ModelFile mf;
    ASSERT_NO_THROW(mf = load_model_file(path)) << name;
    EXPECT_EQ(mf.config.hidden_size, 32);
    const Tokenizer t = load_tokenizer(path);
    EXPECT_EQ(t.decode(t.encode("the thing")), "the thing");
  }
  const GGUFFile every = GGUFFile::open((corpus("gguf") / "every_type.gguf").string());
  for (const GGUFTensorInfo& ti : every.tensors()) EXPECT_NO_THROW(every.load_f32(ti)) << ti.name;
  for (const auto& e : std::filesystem::directory_iterator(corpus("safetensors")))
    EXPECT_NO_THROW(load_safetensors(e.path().string())) << e.path();
  for (const auto& e : std::filesystem::directory_iterator(corpus("hf_config")))
    EXPECT_NO_THROW(parse_hf_config(read(e.path()), e.path().string())) << e.path();
  for (const auto& e : std::filesystem::directory_iterator(corpus("tokenizer_json")))
    EXPECT_NO_THROW(Tokenizer::from_tokenizer_json(e.path().string())) << e.path();
}

// config.json: a field of the wrong type escaped as nlohmann's type_error; constants that overflow
// a float, a zero RoPE base and token ids beyond int32 were accepted (found by the hf_config
// target, whose harness requires an accepted config to be usable).
TEST(MalformedInputs, ConfigJsonFieldsNameTheKey) {
  const struct {
    const char* file;
    const char* key;
  } cases[] = {{"rope_type_number.json", "rope_type"},
               {"rope_theta_overflows_float.json", "rope_theta"},
               {"rope_theta_zero.json", "rope_theta"},
               {"eos_negative.json", "eos_token_id"},
               {"eos_beyond_int32.json", "eos_token_id"}};
  for (const auto& c : cases) {
    const auto path = regressions("hf_config") / c.file;
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    SCOPED_TRACE(c.file);
    expect_error([&] { parse_hf_config(read(path), c.file); }, {"load_model_file", c.file, c.key});
  }
}

// tokenizer.json: fields of the wrong type escaped as nlohmann's type_error (found by the
// tokenizer_json target).
TEST(MalformedInputs, TokenizerJsonFieldsNameTheKey) {
  const struct {
    const char* file;
    const char* key;
  } cases[] = {{"model_type_int.json", "'type'"},
               {"special_str.json", "'special'"},
               {"processors_int.json", "'type'"},
               {"special_token_int.json", "'id'"},
               {"ignore_merges_int.json", "'ignore_merges'"}};
  for (const auto& c : cases) {
    const auto path = regressions("tokenizer_json") / c.file;
    ASSERT_TRUE(std::filesystem::exists(path)) << path;
    SCOPED_TRACE(c.file);
    expect_error([&] { Tokenizer::from_tokenizer_json(path.string()); },
                 {"Tokenizer::from_tokenizer_json", c.file, c.key});
  }
}

// GGUF: heads that do not divide, non-finite or zero float constants, a negative sliding window and
// token ids beyond int32 were taken into the config (the gguf target's harness requires an accepted
// config to be usable).
TEST(MalformedInputs, GgufConfigValuesAreChecked) {
  using pagedattn::testing::GGUFWriter;
  const auto dir = std::filesystem::temp_directory_path();
  int n = 0;
  auto check = [&](auto&& add, const char* key) {
    GGUFWriter w;
    w.kv_str("general.architecture", "llama");
    w.kv_u32("llama.embedding_length", 32);
    w.kv_u32("llama.block_count", 1);
    w.kv_u32("llama.feed_forward_length", 32);
    w.kv_u32("llama.attention.head_count", 4);
    add(w);
    const std::string path = (dir / ("pa_malformed_" + std::to_string(n++) + ".gguf")).string();
    w.write(path);
    SCOPED_TRACE(key);
    expect_error([&] { load_model_file(path); }, {"load_model_file", key});
    std::filesystem::remove(path);
  };
  check([](GGUFWriter& w) { w.kv_u32("llama.attention.head_count_kv", 3); },
        "llama.attention.head_count_kv");
  check([](GGUFWriter& w) { w.kv_f32("llama.attention.layer_norm_rms_epsilon", INFINITY); },
        "llama.attention.layer_norm_rms_epsilon");
  check([](GGUFWriter& w) { w.kv<double>("llama.rope.freq_base", 12, 1e300); },
        "llama.rope.freq_base");
  check([](GGUFWriter& w) { w.kv_f32("llama.rope.freq_base", 0.f); }, "llama.rope.freq_base");
  check([](GGUFWriter& w) { w.kv<int32_t>("llama.attention.sliding_window", 5, -4); },
        "llama.attention.sliding_window");
  check([](GGUFWriter& w) { w.kv<uint64_t>("tokenizer.ggml.eos_token_id", 10, uint64_t(1) << 40); },
        "tokenizer.ggml.eos_token_id");
}
