// pagedattn: the command-line entry point. Commands register themselves (cli.h); adding one is a
// new file plus one line below.
#include <exception>
#include <iostream>

#include "cli.h"
#include "model_session.h"

namespace pagedattn::tools {
namespace {
int g_exit_code = 0;
}  // namespace
void set_exit_code(int code) { g_exit_code = code; }
}  // namespace pagedattn::tools

int main(int argc, char** argv) {
  namespace t = pagedattn::tools;
  CLI::App app{"pagedattn: LLM inference around a paged KV cache"};
  app.require_subcommand(1);
  CLI::App* bench = app.add_subcommand("bench", "Benchmarks");
  bench->require_subcommand(1);

  // ---- commands: one registration line each ----
  t::register_bench_attention(*bench);
  t::register_generate(app, *bench);
  t::register_bench_serve(*bench);
  t::register_serve(app);
  t::register_tp_worker(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  } catch (const std::exception& e) {
    std::cerr << "pagedattn: " << e.what() << "\n";
    return 1;
  }
  return t::g_exit_code;
}
