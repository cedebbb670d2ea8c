// SHA-256 against the FIPS 180-2 test vectors, and the chained page hash's inputs.
#include <gtest/gtest.h>

#include <cstdio>
#include <string>
#include <vector>

#include "kv/page_hash.h"

using namespace pagedattn;

namespace {

std::string hex(const PageHash& h) {
  std::string s;
  char b[3];
  for (uint8_t x : h) {
    std::snprintf(b, sizeof b, "%02x", x);
    s += b;
  }
  return s;
}

PageHash sha_of(const std::string& s) {
  return kv::sha256({reinterpret_cast<const uint8_t*>(s.data()), s.size()});
}

}  // namespace

TEST(Sha256, KnownVectors) {
  EXPECT_EQ(hex(sha_of("")), "e3b0c44298fc1c149afbf4c8996fb92427ae41e4649b934ca495991b7852b855");
  EXPECT_EQ(hex(sha_of("abc")), "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  EXPECT_EQ(hex(sha_of("abcdbcdecdefdefgefghfghighijhijkijkljklmklmnlmnomnopnopq")),
            "248d6a61d20638b8e5c026930c3e6039a33ce45964ff2167f6ecedd419db06c1");
}

TEST(Sha256, PageHashIsTheDigestOfParentTokensAndSalt) {
  PageHash parent{};
  for (size_t i = 0; i < parent.size(); ++i) parent[i] = uint8_t(i * 3 + 1);
  const std::vector<int32_t> tokens = {1, 258, -1};
  std::string msg(reinterpret_cast<const char*>(parent.data()), parent.size());
  msg += std::string("\x01\x00\x00\x00\x02\x01\x00\x00\xff\xff\xff\xff", 12);  // little-endian ids
  msg += "tenant";
  EXPECT_EQ(kv::page_hash(parent, tokens, "tenant"), sha_of(msg));
}

TEST(Sha256, PageHashDependsOnEveryInput) {
  const std::vector<int32_t> t = {5, 6, 7, 8};
  const PageHash h = kv::page_hash(kv::kRootHash, t, "");
  EXPECT_EQ(h, kv::page_hash(kv::kRootHash, t, ""));
  EXPECT_NE(h, kv::page_hash(kv::kRootHash, t, "a"));
  EXPECT_NE(h, kv::page_hash(h, t, ""));
  std::vector<int32_t> t2 = t;
  t2[3] = 9;
  EXPECT_NE(h, kv::page_hash(kv::kRootHash, t2, ""));
  // Swapped tokens differ (order matters).
  EXPECT_NE(h, kv::page_hash(kv::kRootHash, std::vector<int32_t>{6, 5, 7, 8}, ""));
}
