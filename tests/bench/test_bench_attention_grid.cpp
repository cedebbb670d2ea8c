// The attention benchmark's grids and CSV rows (bench/bench_attention_grid.h): flag parsing and
// validation (errors name the flag), the default grids against the loops they replaced, the
// kernel-report preset, flags over sections, and CSV rows read back by their header. No timing.
#include <gtest/gtest.h>

#include <map>
#include <set>
#include <sstream>
#include <string>
#include <vector>

#include "bench_attention_grid.h"
#include "pagedattn/error.h"

namespace bg = pagedattn::bench::bench_grid;
using pagedattn::DType;
using pagedattn::Error;
using pagedattn::bench::BenchAttentionArgs;

namespace {

// Runs fn, expects an Error whose message contains `needle`.
template <class Fn>
void expect_error_naming(Fn&& fn, const std::string& needle) {
  try {
    fn();
    ADD_FAILURE() << "no Error; expected one naming " << needle;
  } catch (const Error& e) {
    EXPECT_NE(std::string(e.what()).find(needle), std::string::npos)
        << "message '" << e.what() << "' does not name " << needle;
  }
}

std::vector<std::string> split(const std::string& s) {
  std::vector<std::string> v;
  std::string item;
  std::stringstream ss(s);
  while (std::getline(ss, item, ',')) v.push_back(item);
  if (!s.empty() && s.back() == ',') v.push_back("");
  return v;
}

// A CSV row by column name.
std::map<std::string, std::string> read_row(const std::string& row) {
  const auto names = split(bg::csv_header());
  const auto values = split(row);
  EXPECT_EQ(names.size(), values.size()) << row;
  std::map<std::string, std::string> m;
  for (size_t i = 0; i < names.size() && i < values.size(); ++i) m[names[i]] = values[i];
  return m;
}

bg::GridPoint point(std::string mode, int batch, int ctx, int q, int hq, int hkv, int d, int page,
                    DType t) {
  bg::GridPoint p;
  p.mode = mode;
  p.batch = batch, p.context = ctx, p.q_per_seq = q, p.num_q_heads = hq, p.num_kv_heads = hkv;
  p.head_dim = d, p.page_size = page, p.kv_dtype = t;
  return p;
}

}  // namespace

TEST(BenchAttentionFlags, IntListsParseAndBadValuesNameTheFlag) {
  EXPECT_EQ(bg::parse_int_list("8,16,32,64,128", "--page-size"),
            (std::vector<int>{8, 16, 32, 64, 128}));
  EXPECT_EQ(bg::parse_int_list("7", "--batch"), std::vector<int>{7});
  for (const char* bad : {"", "0", "-8", "8,x", "8,,16", "8,", "1.5", "16k", " 8", "99999999999"})
    expect_error_naming([&] { bg::parse_int_list(bad, "--page-size"); }, "--page-size");
  EXPECT_EQ(bg::parse_int("0", "--iters"), 0);
  EXPECT_EQ(bg::parse_int("30", "--iters"), 30);
  for (const char* bad : {"", "-1", "ten", "3x"})
    expect_error_naming([&] { bg::parse_int(bad, "--iters"); }, "--iters");
  EXPECT_EQ(bg::parse_string_list("bf16,fp8", "--kv-dtype"),
            (std::vector<std::string>{"bf16", "fp8"}));
  expect_error_naming([] { bg::parse_string_list("bf16,,fp8", "--kv-dtype"); }, "--kv-dtype");
  expect_error_naming([] { bg::parse_string_list("bf16,", "--kv-dtype"); }, "--kv-dtype");
}

TEST(BenchAttentionFlags, ValidationNamesTheFlag) {
  const auto with = [](auto change) {
    BenchAttentionArgs a;
    change(a);
    return a;
  };
  const auto bad = [&](const BenchAttentionArgs& a, const std::string& device,
                       const std::string& flag) {
    expect_error_naming([&] { bg::validate_args(a, device); }, flag);
  };
  bad(with([](auto& a) { a.page_size = {16, 0}; }), "cpu", "--page-size");
  bad(with([](auto& a) { a.batch = {-1}; }), "cpu", "--batch");
  bad(with([](auto& a) { a.context = {0}; }), "cuda", "--context");
  bad(with([](auto& a) { a.head_dim = {0}; }), "cpu", "--head-dim");
  bad(with([](auto& a) { a.num_kv_heads = {5}; }), "cpu", "--num-kv-heads");
  bad(with([](auto& a) { a.num_q_heads = 0; }), "cpu", "--num-q-heads");
  bad(with([](auto& a) { a.kv_dtype = {"f8"}; }), "cpu", "--kv-dtype");
  bad(with([](auto& a) { a.kv_dtype = {"f32"}; }), "cuda", "--kv-dtype");
  bad(with([](auto& a) { a.head_dim = {96}; }), "cuda", "--head-dim");
  bad(with([](auto& a) { a.mode = "both"; }), "cpu", "--mode");
  bad(with([](auto& a) { a.iters = -2; }), "cpu", "--iters");
  bad(with([](auto& a) { a.prefill_chunk = -1; }), "cpu", "--prefill-chunk");
  bad(with([](auto& a) { a.quick = a.report = true; }), "cpu", "--report");
  // What the CPU kernel runs and the CUDA kernels do not.
  EXPECT_NO_THROW(bg::validate_args(with([](auto& a) { a.kv_dtype = {"f32", "fp8"}; }), "cpu"));
  EXPECT_NO_THROW(bg::validate_args(with([](auto& a) { a.head_dim = {96}; }), "cpu"));
  EXPECT_NO_THROW(bg::validate_args(BenchAttentionArgs{}, "cuda"));
}

// The CPU default grid, as the loops before the grid header wrote it: mode, dtype, KV heads, head
// dim, page, context, batch (outermost first; one page size, so the report's page-innermost order
// keeps it).
TEST(BenchAttentionGrid, CpuDefaultKeepsItsShapesAndOrder) {
  for (bool quick : {false, true}) {
    BenchAttentionArgs a;
    a.quick = quick;
    std::vector<bg::GridPoint> want;
    for (std::string mode : {"decode", "prefill"})
      for (int ctx : quick ? std::vector<int>{256, 1024} : std::vector<int>{2048, 8192})
        for (int b : quick ? std::vector<int>{2} : std::vector<int>{1, 8})
          want.push_back(point(mode, b, ctx, mode == "decode" ? 1 : (quick ? 32 : 128), 32, 8, 128,
                               16, DType::bf16));
    EXPECT_EQ(bg::make_points(a, "cpu", bg::kCpuOrder), want) << "quick " << quick;
  }
  // Flags as before: prefill chunk capped by the context, --mode picks the sections.
  BenchAttentionArgs a;
  a.mode = "prefill";
  a.context = {64};
  a.prefill_chunk = 100;
  a.kv_dtype = {"f32", "bf16"};
  a.num_kv_heads = {32, 4};
  const auto pts = bg::make_points(a, "cpu", bg::kCpuOrder);
  ASSERT_EQ(pts.size(), 8u);
  for (const auto& p : pts) {
    EXPECT_EQ(p.mode, "prefill");
    EXPECT_EQ(p.q_per_seq, 64);
  }
  EXPECT_EQ(pts[0].kv_dtype, DType::f32);
  EXPECT_EQ(pts[0].num_kv_heads, 32);
  EXPECT_EQ(pts[2].num_kv_heads, 4);
  EXPECT_EQ(pts[4].kv_dtype, DType::bf16);
}

// The CUDA default grid, as the loops before the grid header wrote it: dtype, head dim, KV heads,
// batch, context (batch 64 never at context 32768), page; then prefill of whole sequences.
TEST(BenchAttentionGrid, CudaDefaultKeepsItsShapesAndOrder) {
  std::vector<bg::GridPoint> want;
  for (DType t : {DType::bf16, DType::fp8_e4m3})
    for (int d : {128, 256})
      for (int hkv : {8, 32})
        for (int b : {1, 8, 64})
          for (int ctx : {512, 2048, 8192, 32768}) {
            if (ctx >= 32768 && b > 8) continue;
            for (int page : {16, 32, 64})
              want.push_back(point("decode", b, ctx, 1, 32, hkv, d, page, t));
          }
  for (int b : {1, 4})
    for (int len : {2048, 8192})
      want.push_back(point("prefill", b, len, len, 32, 8, 128, 16, DType::bf16));
  const auto got = bg::make_points(BenchAttentionArgs{}, "cuda", bg::kCudaOrder);
  EXPECT_EQ(got, want);
  EXPECT_EQ(want.size(), 264u + 4u);  // the 264 decode rows of docs/BENCHMARKS.md
}

TEST(BenchAttentionGrid, ReportCoversPagesGqaAndDtypes) {
  for (const std::string device : {"cpu", "cuda"}) {
    BenchAttentionArgs a;
    a.report = true;
    const auto pts = bg::make_points(a, device, device == "cpu" ? bg::kCpuOrder : bg::kCudaOrder);
    std::set<int> pages, gqa, contexts, batches;
    std::set<std::string> dtypes, modes;
    double kv_bytes = 0;
    for (size_t i = 0; i < pts.size(); ++i) {
      const auto& p = pts[i];
      pages.insert(p.page_size), gqa.insert(p.gqa()), contexts.insert(p.context);
      batches.insert(p.batch), modes.insert(p.mode);
      dtypes.insert(bg::short_dtype_name(p.kv_dtype));
      kv_bytes += p.kv_bytes();
      for (size_t j = 0; j < i; ++j) EXPECT_FALSE(pts[j] == p) << "point " << i << " repeated";
      EXPECT_EQ(p.num_q_heads % p.num_kv_heads, 0);
      EXPECT_EQ(p.q_per_seq, p.mode == "decode" ? 1 : (device == "cpu" ? 128 : p.context));
    }
    EXPECT_EQ(pages, (std::set<int>{8, 16, 32, 64, 128})) << device;
    EXPECT_EQ(gqa, (std::set<int>{1, 4, 8})) << device;
    EXPECT_EQ(modes, (std::set<std::string>{"decode", "prefill"})) << device;
    EXPECT_GE(contexts.size(), 2u) << device;
    EXPECT_GE(batches.size(), 2u) << device;
    if (device == "cpu") {
      EXPECT_EQ(dtypes, (std::set<std::string>{"f32", "bf16", "fp8"}));
      // Sized for 2 cores: every shape is timed about 24 times (paged and dense), so a few GB of
      // K/V over the whole grid keeps it to minutes at a few GB/s.
      EXPECT_LT(kv_bytes, 6e9);
    } else {
      EXPECT_EQ(dtypes, (std::set<std::string>{"bf16", "fp8"}));
      for (const auto& p : pts) EXPECT_LE(int64_t(p.batch) * p.context, 64 * 8192);
    }
  }
}

TEST(BenchAttentionGrid, FlagsNarrowEverySectionOfTheReport) {
  BenchAttentionArgs a;
  a.report = true;
  a.page_size = {16};
  a.kv_dtype = {"bf16"};
  a.mode = "decode";
  const auto pts = bg::make_points(a, "cuda", bg::kCudaOrder);
  ASSERT_FALSE(pts.empty());
  std::set<int> gqa;
  for (const auto& p : pts) {
    EXPECT_EQ(p.page_size, 16);
    EXPECT_EQ(p.kv_dtype, DType::bf16);
    EXPECT_EQ(p.mode, "decode");
    gqa.insert(p.gqa());
  }
  EXPECT_EQ(gqa, (std::set<int>{1, 4, 8}));  // the GQA section stays
}

TEST(BenchAttentionGrid, ExpandFollowsTheOrderAndLimits) {
  bg::GridSpec s{"decode", {1, 2}, {100, 200}, {4}, {64}, {8, 16}, {"bf16"}, 0, 300};
  const auto pts = bg::expand({s, s}, 8,
                              {bg::Dim::page_size, bg::Dim::batch, bg::Dim::context,
                               bg::Dim::kv_dtype, bg::Dim::head_dim, bg::Dim::num_kv_heads});
  // batch * context <= 300 leaves out (2, 200); the repeated section adds nothing.
  std::vector<std::pair<int, std::pair<int, int>>> got;
  for (const auto& p : pts) got.push_back({p.page_size, {p.batch, p.context}});
  const std::vector<std::pair<int, std::pair<int, int>>> want = {
      {8, {1, 100}}, {8, {1, 200}}, {8, {2, 100}}, {16, {1, 100}}, {16, {1, 200}}, {16, {2, 100}}};
  EXPECT_EQ(got, want);
  bg::GridSpec empty = s;
  empty.page_size.clear();
  EXPECT_TRUE(bg::expand({empty}, 8, bg::kCpuOrder).empty());
}

TEST(BenchAttentionCsv, RowsReadBackByTheirHeader) {
  bg::Row r;
  r.device = "cpu";
  r.hardware = "Some CPU, 2 sockets \"x\"";
  r.workers = 2;
  // 2 sequences, 1024 tokens, 8 KV heads of 128, bf16: K + V = 2 * 2 * 1024 * 8 * 128 * 2 bytes.
  r.p = point("decode", 2, 1024, 1, 32, 8, 128, 16, DType::bf16);
  r.us = 100;
  r.roofline_gbps = 200;
  r.dense_us = 90;
  r.ref_rel_err = 1.5e-7;
  auto m = read_row(bg::csv_row(r));
  EXPECT_EQ(m["device"], "cpu");
  EXPECT_EQ(m["hardware"].find(','), std::string::npos);
  EXPECT_EQ(m["hardware"].find('"'), std::string::npos);
  EXPECT_EQ(m["mode"], "decode");
  EXPECT_EQ(m["batch"], "2");
  EXPECT_EQ(m["context"], "1024");
  EXPECT_EQ(m["gqa"], "4");
  EXPECT_EQ(m["page_size"], "16");
  EXPECT_EQ(m["kv_dtype"], "bf16");
  EXPECT_EQ(m["q_dtype"], "f32");
  const double bytes = 2.0 * 2 * 1024 * 8 * 128 * 2;
  EXPECT_DOUBLE_EQ(std::stod(m["kv_mib"]), bytes / 1048576);
  EXPECT_NEAR(std::stod(m["gbps"]), bytes / 100e-6 / 1e9, 1e-3);
  EXPECT_NEAR(std::stod(m["pct_roofline"]), 100 * bytes / 100e-6 / 1e9 / 200, 1e-2);
  EXPECT_NEAR(std::stod(m["dense_over_paged"]), 0.9, 1e-9);
  EXPECT_NEAR(std::stod(m["ref_rel_err"]), 1.5e-7, 1e-9);
  // Decode: 2 multiply-adds of 2 flops per query head, key and dimension.
  EXPECT_NEAR(std::stod(m["tflops"]), 4.0 * 2 * 32 * 128 * 1024 / 100e-6 / 1e12, 1e-6);

  r.dense_us = -1;
  r.ref_rel_err = -1;
  r.device = "cuda";
  r.p.kv_dtype = DType::fp8_e4m3;
  m = read_row(bg::csv_row(r));
  EXPECT_EQ(m["dense_us"], "");
  EXPECT_EQ(m["dense_over_paged"], "");
  EXPECT_EQ(m["ref_rel_err"], "");
  EXPECT_EQ(m["kv_dtype"], "fp8");
  EXPECT_DOUBLE_EQ(std::stod(m["kv_mib"]), bytes / 2 / 1048576);
}

TEST(BenchAttentionCsv, CausalFlopsMatchACountOfPairs) {
  for (int ctx : {1, 7, 100, 513})
    for (int q : {1, 3, 64, 513}) {
      if (q > ctx) continue;
      const auto p = point("prefill", 3, ctx, q, 8, 2, 64, 16, DType::bf16);
      double pairs = 0;  // query j (at ctx - q + j) sees keys 0 .. ctx - q + j
      for (int j = 0; j < q; ++j)
        for (int k = 0; k < ctx; ++k) pairs += k <= ctx - q + j;
      EXPECT_DOUBLE_EQ(p.flops(), 4.0 * 3 * 8 * 64 * pairs) << "ctx " << ctx << " q " << q;
    }
}
