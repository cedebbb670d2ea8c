// libFuzzer target: a Hugging Face config.json as ModelConfig (parse_hf_config).
// Malformed or inconsistent text must raise pagedattn::Error; an accepted config must be one the
// runtime can use: positive dimensions, heads that divide, finite positive RoPE and norm constants,
// token ids that are ids.
#include <cstdint>
#include <cstdlib>
#include <string>

#include "fuzz_util.h"
#include "pagedattn/error.h"
#include "pagedattn/model_file.h"

using namespace pagedattn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string text(reinterpret_cast<const char*>(data), size);
  try {
    const ModelConfig c = parse_hf_config(text, "config.json");
    if (!fuzz::config_is_usable(c)) PA_FUZZ_FINDING();
  } catch (const Error&) {
  }
  return 0;
}
