// libFuzzer target: a Hugging Face tokenizer.json (Tokenizer::from_tokenizer_json), then the
// loaded tokenizer on a fixed text. Malformed JSON or fields of the wrong type must raise
// pagedattn::Error; anything else is a finding.
#include <cstdint>
#include <cstdlib>

#include "fuzz_util.h"
#include "pagedattn/error.h"
#include "pagedattn/tokenizer.h"

using namespace pagedattn;

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  fuzz::MemFile file(data, size);
  try {
    const Tokenizer t = Tokenizer::from_tokenizer_json(file.path());
    const std::vector<int32_t> ids = t.encode("Hello world 123 <|im_end|>\n", true);
    for (int32_t id : ids)
      if (id < 0 || id >= t.vocab_size()) PA_FUZZ_FINDING();
    t.decode(ids);
  } catch (const Error&) {
  }
  return 0;
}
