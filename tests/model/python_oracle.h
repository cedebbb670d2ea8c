// Runs the Python oracles of the model tests (tests/model/*_oracle.py): scripts that compute
// reference results with PyPI packages. The packages they lack are pip-installed into a folder of
// the build tree (pydeps.py), which is also put on PYTHONPATH; the interpreter and the folder come
// from CMake (PAGEDATTN_TEST_PYTHON, PAGEDATTN_TEST_PYDEPS). A script that cannot get its packages
// (offline) exits with status 77: the test skips with the reason it printed.
#pragma once

#include <sys/wait.h>

#include <unistd.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <sstream>
#include <string>
#include <system_error>
#include <vector>

namespace pagedattn::test {

inline std::string python_executable() {
#ifdef PAGEDATTN_TEST_PYTHON
  return PAGEDATTN_TEST_PYTHON;
#else
  return "python3";
#endif
}

inline std::string python_deps_dir() {
#ifdef PAGEDATTN_TEST_PYDEPS
  return PAGEDATTN_TEST_PYDEPS;
#else
  return (std::filesystem::temp_directory_path() / "pagedattn-pydeps").string();
#endif
}

inline std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

struct PythonRun {
  enum Status { ok, skip, fail } status = fail;
  std::string output;  // stdout and stderr of the script
  std::string reason;  // skip/fail: what went wrong (the script's last line)
};

// Runs `python script --deps DIR args...` with DIR on PYTHONPATH.
inline PythonRun run_python_oracle(const std::filesystem::path& script,
                                   const std::vector<std::string>& args) {
  PythonRun r;
  const std::string py = python_executable();
  if (std::system(("command -v " + shell_quote(py) + " > /dev/null 2>&1").c_str()) != 0) {
    r.status = PythonRun::skip;
    r.reason = "no Python interpreter (" + py + ") for " + script.filename().string();
    return r;
  }
  const std::string deps = python_deps_dir();
  std::string cmd = "PYTHONPATH=" + shell_quote(deps) + " " + shell_quote(py) + " " +
                    shell_quote(script.string()) + " --deps " + shell_quote(deps);
  for (const std::string& a : args) cmd += " " + shell_quote(a);
  cmd += " 2>&1";
  FILE* p = popen(cmd.c_str(), "r");
  if (!p) {
    r.reason = "cannot run " + cmd;
    return r;
  }
  char buf[4096];
  for (size_t n; (n = fread(buf, 1, sizeof buf, p)) > 0;) r.output.append(buf, n);
  const int rc = pclose(p);
  const int status = WIFEXITED(rc) ? WEXITSTATUS(rc) : -1;
  std::string last = r.output;
  while (!last.empty() && last.back() == '\n') last.pop_back();
  last = last.substr(last.rfind('\n') == std::string::npos ? 0 : last.rfind('\n') + 1);
  r.status = status == 0 ? PythonRun::ok : status == 77 ? PythonRun::skip : PythonRun::fail;
  r.reason = script.filename().string() + ": " + last;
  return r;
}

// A finished oracle run kept in the temp folder (ctest runs each test in a process of its own):
// `dir` holds what the script wrote.
struct CachedOracle {
  PythonRun::Status status = PythonRun::fail;
  std::string reason;  // skip/fail: what went wrong
  std::string output;  // fail: the script's output
  std::filesystem::path dir;
};

// Runs `script` once for `key` (the texts and whatever else decides its results; the script's own
// text is added): into a fresh folder that prepare() fills first and whose path args_for() turns
// into the script's arguments. A run that ends well is kept under the temp folder for the next
// process with the same key; one that does not is removed.
inline CachedOracle run_cached_oracle(
    const std::filesystem::path& script, const std::string& key,
    const std::function<void(const std::filesystem::path&)>& prepare,
    const std::function<std::vector<std::string>(const std::filesystem::path&)>& args_for) {
  namespace fs = std::filesystem;
  std::stringstream script_text;
  script_text << std::ifstream(script).rdbuf();
  const std::string stem = "pa_" + script.stem().string() + "_";
  const fs::path cached =
      fs::temp_directory_path() /
      (stem + std::to_string(std::hash<std::string>{}(key + script_text.str())));
  CachedOracle r;
  r.dir = cached;
  if (fs::exists(cached / "done")) {
    r.status = PythonRun::ok;
    return r;
  }
  const fs::path dir = fs::temp_directory_path() / (stem + "run_" + std::to_string(::getpid()));
  fs::remove_all(dir);
  fs::create_directories(dir);
  prepare(dir);
  const PythonRun run = run_python_oracle(script, args_for(dir));
  r.status = run.status;
  r.reason = run.reason;
  r.output = run.output;
  if (run.status != PythonRun::ok) {
    fs::remove_all(dir);
    return r;
  }
  std::ofstream(dir / "done") << "ok";
  std::error_code ec;
  fs::rename(dir, cached, ec);  // another process may have put its run there first
  if (ec) fs::remove_all(dir);
  return r;
}

// In a fixture's SetUp: fails the test with the script's output when the oracle failed, skips it
// with the reason when the oracle could not run (offline); true when its results are there.
#define PA_REQUIRE_ORACLE(run)                                                         \
  do {                                                                                 \
    ASSERT_NE((run).status, ::pagedattn::test::PythonRun::fail)                        \
        << (run).reason << " failed:\n" << (run).output;                               \
    if ((run).status == ::pagedattn::test::PythonRun::skip) GTEST_SKIP() << (run).reason; \
  } while (0)

}  // namespace pagedattn::test
