// The serving benchmark's reports (serve_bench_run.h's RunResult): one JSON object per run, a CSV
// row per run, the KV timeline as CSV (scripts/plot.sh), and the table on stdout. Values a mode
// cannot know (NaN doubles, negative counts) are absent: "-", an empty cell or null.
#pragma once

#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>

#include "serve_bench_run.h"

namespace pagedattn::bench::serve_bench {

// device: "" for a server (not known here); url: "" in process.
nlohmann::json result_json(const RunResult& r, const std::string& model, const std::string& device,
                           const std::string& url);
// Append one row (with the header when the file is new or empty).
void append_csv(const std::string& path, const RunResult& r);
// Append the run's KV samples (with the header when the file is new or empty).
void append_timeline(const std::string& path, const RunResult& r);
// The table on stdout: its header, then one row per run.
void print_header();
void print_row(const RunResult& r);

// "inf" or the rate in %g.
std::string rate_text(double rate);
// A number in printf format, or `absent` for NaN / a negative count.
std::string fmt(double v, const char* format, const char* absent = "");
std::string fmt_count(int64_t v, const char* absent = "");

}  // namespace pagedattn::bench::serve_bench
