// libFuzzer target: the safetensors reader (header JSON, dtypes, shapes, data offsets) over a file.
// A malformed file must raise pagedattn::Error; anything else is a finding.
#include <cstdint>

#include "fuzz_util.h"
#include "pagedattn/error.h"
#include "pagedattn/model_file.h"

using namespace pagedattn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile file(data, size);
  try {
    for (const auto& [name, t] : load_safetensors(file.path()))
      if (t.dtype() != DType::f32) PA_FUZZ_FINDING();  // every tensor comes back as f32
  } catch (const Error&) {
  }
  return 0;
}
