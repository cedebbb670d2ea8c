#include "page_hash.h"

#include <openssl/evp.h>

#include <memory>
#include <vector>

#include "pagedattn/error.h"

namespace pagedattn::kv {

namespace {

struct CtxDeleter {
  void operator()(EVP_MD_CTX* c) const { EVP_MD_CTX_free(c); }
};

// Hashes the concatenation of `parts` (pointer, length pairs).
PageHash digest(std::initializer_list<std::pair<const void*, size_t>> parts) {
  std::unique_ptr<EVP_MD_CTX, CtxDeleter> ctx(EVP_MD_CTX_new());
  PA_CHECK(ctx != nullptr, "sha256: EVP_MD_CTX_new failed");
  PA_CHECK(EVP_DigestInit_ex(ctx.get(), EVP_sha256(), nullptr) == 1,
           "sha256: EVP_DigestInit_ex failed");
  for (const auto& [ptr, len] : parts) {
    if (len == 0) continue;
    PA_CHECK(EVP_DigestUpdate(ctx.get(), ptr, len) == 1, "sha256: EVP_DigestUpdate failed");
  }
  PageHash out{};
  unsigned int out_len = 0;
  PA_CHECK(EVP_DigestFinal_ex(ctx.get(), out.data(), &out_len) == 1 && out_len == out.size(),
           "sha256: EVP_DigestFinal_ex failed");
  return out;
}

}  // namespace

PageHash sha256(std::span<const uint8_t> data) { return digest({{data.data(), data.size()}}); }

PageHash page_hash(const PageHash& parent, std::span<const int32_t> tokens, std::string_view salt) {
  std::vector<uint8_t> ids(tokens.size() * 4);
  for (size_t i = 0; i < tokens.size(); ++i) {
    const uint32_t t = uint32_t(tokens[i]);
    for (int b = 0; b < 4; ++b) ids[i * 4 + size_t(b)] = uint8_t(t >> (8 * b));
  }
  return digest(
      {{parent.data(), parent.size()}, {ids.data(), ids.size()}, {salt.data(), salt.size()}});
}

}  // namespace pagedattn::kv
