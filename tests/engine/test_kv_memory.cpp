// --kv-cache-memory as MiB, a fraction or a percentage of free memory: parsing, MemAvailable, the
// arithmetic, and an engine sized from a fraction of the host's free memory.
#include <gtest/gtest.h>

#include <cmath>
#include <memory>
#include <string>

#include "fake_model.h"
#include "pagedattn/engine.h"
#include "pagedattn/error.h"

using namespace pagedattn;
using pagedattn::fakes::FakeModel;

TEST(KvMemory, ParsesMiBFractionsAndPercentages) {
  KvMemorySpec s = parse_kv_cache_memory("512");
  EXPECT_EQ(s.mib, 512);
  EXPECT_EQ(s.fraction, 0);
  s = parse_kv_cache_memory("1");
  EXPECT_EQ(s.mib, 1);  // values of 1 and more are MiB
  s = parse_kv_cache_memory("1536.5");
  EXPECT_EQ(s.mib, 1536.5);
  s = parse_kv_cache_memory("0.5");
  EXPECT_EQ(s.fraction, 0.5);
  EXPECT_EQ(s.mib, 0);
  s = parse_kv_cache_memory("50%");
  EXPECT_DOUBLE_EQ(s.fraction, 0.5);
  s = parse_kv_cache_memory("100%");
  EXPECT_DOUBLE_EQ(s.fraction, 1.0);
  s = parse_kv_cache_memory("12.5% ");
  EXPECT_DOUBLE_EQ(s.fraction, 0.125);
  for (const char *bad : {"", "%", "abc", "0", "-1", "-0.5", "0%", "150%", "12MiB", "nan", "inf",
                          "1e999", "0.5.1"}) {
    try {
      parse_kv_cache_memory(bad);
      ADD_FAILURE() << "accepted '" << bad << "'";
    } catch (const Error &e) {
      EXPECT_EQ(std::string(e.what()).rfind("kv_cache_memory: ", 0), 0u) << e.what();
    }
  }
}

TEST(KvMemory, MemAvailableAndFractionArithmetic) {
  const std::string meminfo =
      "MemTotal:       16303280 kB\nMemFree:          512000 kB\n"
      "MemAvailable:    8388608 kB\nBuffers:          102400 kB\n";
  EXPECT_EQ(parse_mem_available(meminfo), int64_t(8388608) * 1024);
  EXPECT_THROW(parse_mem_available("MemTotal: 1 kB\n"), Error);
  EXPECT_THROW(parse_mem_available("MemAvailable: lots\n"), Error);
  EXPECT_DOUBLE_EQ(kv_fraction_mib(0.5, int64_t(8) << 30), 4096.0);
  EXPECT_DOUBLE_EQ(kv_fraction_mib(1.0, int64_t(3) << 20), 3.0);
  EXPECT_THROW(kv_fraction_mib(0.0, 1 << 30), Error);
  EXPECT_THROW(kv_fraction_mib(1.5, 1 << 30), Error);
  EXPECT_THROW(kv_fraction_mib(NAN, 1 << 30), Error);
  EXPECT_THROW(kv_fraction_mib(0.5, -1), Error);
  EXPECT_GT(free_memory_bytes(Device::cpu), 0);  // this host's MemAvailable
}

TEST(KvMemory, EngineSizedFromAFractionOfFreeMemory) {
  // 2 layers x 2 heads x 4 dims x K and V at f32 = 128 bytes per token; pages of 16 tokens.
  const double fraction = 1e-5;
  EngineConfig c;
  c.page_size = 16;
  c.kv_cache_memory_fraction = fraction;
  c.log_startup = false;
  const double free_before = double(free_memory_bytes(Device::cpu));
  Engine e(std::make_unique<FakeModel>(), c);
  const double free_after = double(free_memory_bytes(Device::cpu));
  const double lo = std::floor(fraction * std::min(free_before, free_after) / (128.0 * 16));
  const double hi = std::floor(fraction * std::max(free_before, free_after) / (128.0 * 16));
  // Free memory moves while other processes run: allow 10% either way.
  EXPECT_GE(double(e.cache().config().num_pages), 0.9 * lo);
  EXPECT_LE(double(e.cache().config().num_pages), 1.1 * hi + 1);
  // MiB and tokens take precedence over the fraction.
  c.kv_cache_memory_mib = 1;
  Engine by_mib(std::make_unique<FakeModel>(), c);
  EXPECT_EQ(by_mib.cache().config().num_pages, 1024 * 1024 / (128 * 16));
  // A fraction outside (0, 1] is refused even when another budget is set.
  c.kv_cache_memory_fraction = 2;
  EXPECT_THROW(kv_num_pages(c, FakeModel().config(), DType::f32), Error);
  c.kv_cache_memory_fraction = -0.1;
  EXPECT_THROW(Engine(std::make_unique<FakeModel>(), c), Error);
}

// With no budget set, the cache holds what max_num_seqs sequences at the longest context need, at
// most kDefaultKvMiB.
TEST(KvMemory, DefaultBudgetFromContextAndMaxNumSeqs) {
  ModelConfig mc = FakeModel().config();  // 128 bytes per token at f32
  EngineConfig c;
  c.page_size = 16;
  c.max_model_len = 100;  // 7 pages a sequence
  c.max_num_seqs = 3;
  EXPECT_EQ(kv_num_pages(c, mc, DType::f32), 21);
  c.max_model_len = 0;  // the model's max_position_embeddings
  mc.max_position_embeddings = 64;
  EXPECT_EQ(kv_num_pages(c, mc, DType::f32), 12);
  // Capped at kDefaultKvMiB.
  c.max_model_len = 1 << 20;
  c.max_num_seqs = 1 << 10;
  EXPECT_EQ(kv_num_pages(c, mc, DType::f32),
            int32_t(EngineConfig::kDefaultKvMiB * 1024 * 1024 / (128 * 16)));
  // An explicit budget is taken as it is.
  c.max_model_len = 100;
  c.kv_cache_memory_mib = 1;
  EXPECT_EQ(kv_num_pages(c, mc, DType::f32), 1024 * 1024 / (128 * 16));
  c.kv_cache_memory_mib = 0;
  c.kv_cache_tokens = 1000;
  EXPECT_EQ(kv_num_pages(c, mc, DType::f32), 63);
}
