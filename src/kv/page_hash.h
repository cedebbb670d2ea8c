// SHA-256 (OpenSSL libcrypto, EVP API) and the chained prefix hash of a full KV page (page_hash).
#pragma once

#include <cstddef>
#include <cstdint>
#include <span>
#include <string_view>

#include "pagedattn/kv_cache.h"

namespace pagedattn::kv {

// SHA-256 of `data`.
PageHash sha256(std::span<const uint8_t> data);

// The parent hash of a sequence's first page.
inline constexpr PageHash kRootHash{};

// h = SHA-256(parent (32 bytes) || token ids (int32, little-endian) || cache salt bytes).
// NOTE: parent and tokens have a fixed size for a given page size, so the salt (the remainder) is
// unambiguous and two salts can never produce the same input.
PageHash page_hash(const PageHash& parent, std::span<const int32_t> tokens, std::string_view salt);

// A hasher for unordered containers keyed by PageHash (the first 8 bytes of a SHA-256 are uniform).
struct PageHashHasher {
  size_t operator()(const PageHash& h) const noexcept {
    size_t v = 0;
    for (int i = 0; i < 8; ++i) v = (v << 8) | h[size_t(i)];
    return v;
  }
};

}  // namespace pagedattn::kv
