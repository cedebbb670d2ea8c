// Runs the Python oracles of the model tests (tests/model/*_oracle.py): scripts that compute
// reference results with PyPI packages. The packages they lack are pip-installed into a folder of
// the build tree (pydeps.py), which is also put on PYTHONPATH; the interpreter and the folder come
// from CMake (PAGEDATTN_TEST_PYTHON, PAGEDATTN_TEST_PYDEPS). A script that cannot get its packages
// (offline) exits with status 77: the test skips with the reason it printed.
#pragma once

#include <sys/wait.h>

#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <string>
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

}  // namespace pagedattn::test
