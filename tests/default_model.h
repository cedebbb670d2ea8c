// Where the tests find the default model (pagedattn/default_model.h) in this checkout, and the
// model a test runs when PAGEDATTN_MODEL names another file. Tests that need it skip, and say so,
// when it is absent (scripts/fetch-default-model.sh fetches it).
#pragma once

#include <cstdlib>
#include <filesystem>
#include <string>

#include "pagedattn/default_model.h"

namespace pagedattn::testing {

// The repository root: tests/<this file> -> the root. NOTE: __FILE__ may be relative to the
// compiler's working directory (the build's tests/ folder, where ctest runs the tests).
inline std::filesystem::path repo_root() {
  return std::filesystem::path(__FILE__).parent_path().parent_path();
}

// models/<the default model> of this checkout.
inline std::string default_model_path() {
  return (repo_root() / kDefaultModelPath).lexically_normal().string();
}

// PAGEDATTN_MODEL when it is set, else the default model.
inline std::string model_path_from_env() {
  if (const char* env = std::getenv("PAGEDATTN_MODEL")) return env;
  return default_model_path();
}

}  // namespace pagedattn::testing
