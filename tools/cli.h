// The `pagedattn` command line: each command lives in its own file and registers itself on the
// application (or on the `bench` group) through one function declared here and called once from
// main.cpp.
//
// A command's callback stores its exit status with set_exit_code(); errors (pagedattn::Error and
// the like) may simply be thrown: main prints "pagedattn: <message>" and exits with 1.
#pragma once

#include <CLI/CLI.hpp>

namespace pagedattn::tools {

void set_exit_code(int code);

// `pagedattn bench attention ...` (bench_attention_cli.cpp).
void register_bench_attention(CLI::App& bench);

// `pagedattn generate`, `chat`, `logits` and `bench model` (cmd_generate.cpp).
void register_generate(CLI::App& app, CLI::App& bench);

// `pagedattn bench serve` (cmd_bench_serve.cpp).
void register_bench_serve(CLI::App& bench);

// `pagedattn serve` (cmd_serve.cpp).
void register_serve(CLI::App& app);

}  // namespace pagedattn::tools
