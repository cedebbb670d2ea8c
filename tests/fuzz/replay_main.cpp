// Replays files through a fuzz target's entry point without libFuzzer (the project's compiler, and
// its sanitizers in `make sanitize`): every seed of corpus/<target>/ and every input of
// regressions/<target>/ that once crashed, leaked or hung. A target aborts on a finding, so a
// regression fails the test; an expected rejection (pagedattn::Error) is caught inside the target.
//
//   fuzz_replay TARGET DIR_OR_FILE...
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <map>
#include <string>
#include <vector>

#define PA_FUZZ_ENTRY(t) extern "C" int fuzz_entry_##t(const uint8_t*, size_t);
PA_FUZZ_ENTRY(gguf)
PA_FUZZ_ENTRY(safetensors)
PA_FUZZ_ENTRY(hf_config)
PA_FUZZ_ENTRY(tokenizer_json)
PA_FUZZ_ENTRY(tokenizer)
PA_FUZZ_ENTRY(chat_template)
PA_FUZZ_ENTRY(request)
#undef PA_FUZZ_ENTRY

namespace fs = std::filesystem;
using Entry = int (*)(const uint8_t*, size_t);

int main(int argc, char** argv) {
  const std::map<std::string, Entry> targets = {
      {"gguf", fuzz_entry_gguf},           {"safetensors", fuzz_entry_safetensors},
      {"hf_config", fuzz_entry_hf_config}, {"tokenizer_json", fuzz_entry_tokenizer_json},
      {"tokenizer", fuzz_entry_tokenizer}, {"chat_template", fuzz_entry_chat_template},
      {"request", fuzz_entry_request}};
  if (argc < 2 || !targets.count(argv[1])) {
    std::fprintf(stderr, "usage: fuzz_replay TARGET DIR_OR_FILE...\n");
    return 2;
  }
  const Entry entry = targets.at(argv[1]);
  std::vector<fs::path> files;
  for (int a = 2; a < argc; ++a) {
    const fs::path p = argv[a];
    if (fs::is_directory(p)) {
      for (const auto& e : fs::directory_iterator(p))
        if (e.is_regular_file()) files.push_back(e.path());
    } else if (fs::is_regular_file(p)) {
      files.push_back(p);
    }
  }
  std::sort(files.begin(), files.end());
  for (const fs::path& f : files) {
    std::ifstream in(f, std::ios::binary);
    const std::vector<uint8_t> bytes((std::istreambuf_iterator<char>(in)), {});
    entry(bytes.data(), bytes.size());  // a finding aborts the process (named in its output)
  }
  std::printf("fuzz_replay %s: %zu inputs replayed, none failed\n", argv[1], files.size());
  return files.empty() ? 1 : 0;
}
