// libFuzzer target: the GGUF reader (from memory and from a mapped file), every tensor it accepts
// dequantised, the model mapping (load_gguf_model) and the tokenizer from its metadata.
// A malformed file must raise pagedattn::Error; anything else (a crash, a sanitizer report, another
// exception) is a finding.
#include <cstdint>
#include <vector>

#include "fuzz_util.h"
#include "pagedattn/error.h"
#include "pagedattn/gguf.h"
#include "pagedattn/model_file.h"
#include "pagedattn/tokenizer.h"

using namespace pagedattn;

namespace {

// NOTE: tensors are bounded by the input's size (checked by the reader), so dequantising all of
// them is cheap; the cap only keeps one input from taking seconds.
constexpr int64_t kMaxDequantElements = int64_t(1) << 22;

void exercise_tokenizer(const GGUFFile& f) {
  const Tokenizer t = Tokenizer::from_gguf(f);
  const std::vector<int32_t> ids = t.encode("Hello world 123 <|im_end|> \xF0\x9F\x98\x80!", true);
  for (int32_t id : ids)
    if (id < 0 || id >= t.vocab_size()) PA_FUZZ_FINDING();
  t.decode(ids);
  std::vector<int32_t> all;
  for (int32_t id = 0; id < t.vocab_size() && id < 4096; ++id) all.push_back(id);
  StreamDecoder sd(t);
  for (int32_t id : all) sd.push(id);
  sd.flush();
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const GGUFFile f = GGUFFile::from_bytes(std::vector<uint8_t>(data, data + size), "fuzz.gguf");
    int64_t budget = kMaxDequantElements;
    for (const GGUFTensorInfo& ti : f.tensors()) {
      if (!ggml_type_supported(ti.type) || ti.numel() > budget) continue;
      budget -= ti.numel();
      f.load_f32(ti);
    }
    try {
      exercise_tokenizer(f);
    } catch (const Error&) {
    }
  } catch (const Error&) {
    return 0;  // rejected with a clear error: what a malformed file should get
  }
  // The same bytes as a mapped file, through the model mapping.
  fuzz::MemFile file(data, size);
  try {
    ModelFile mf = load_gguf_model(file.path());
    check_model_tensors(mf);
    if (!fuzz::config_is_usable(mf.config)) PA_FUZZ_FINDING();  // accepted, so it must be usable
  } catch (const Error&) {
  }
  return 0;
}
