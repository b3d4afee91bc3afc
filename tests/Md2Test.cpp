// MD2 and HMAC-MD2 (oracle/Md2.h), with which the fake driver answers the
// static CUDA runtime's check of it: RFC 1319's test suite.
#include "oracle/Md2.h"

#include <gtest/gtest.h>

#include <cstdio>
#include <cstring>
#include <string>

namespace {

std::string hex(const metamem::oracle::Md2Digest& digest) {
  std::string text;
  char byte[3];
  for (std::uint8_t b : digest) {
    std::snprintf(byte, sizeof byte, "%02x", b);
    text += byte;
  }
  return text;
}

std::string md2(const char* message) {
  metamem::oracle::Md2 md2;
  md2.update(message, std::strlen(message));
  return hex(md2.finish());
}

}  // namespace

TEST(Md2, Rfc1319TestSuite) {
  EXPECT_EQ(md2(""), "8350e5a3e24c153df2275c9f80692773");
  EXPECT_EQ(md2("a"), "32ec01ec4a6dac72c0ab96fb34c0b5d1");
  EXPECT_EQ(md2("abc"), "da853b0d3f88d99b30283a69e6ded6bb");
  EXPECT_EQ(md2("message digest"), "ab4f496bfb2a530b219ff33031fe06b0");
  EXPECT_EQ(md2("abcdefghijklmnopqrstuvwxyz"), "4e8ddff3650292ab5a4108c3aa47940b");
  EXPECT_EQ(md2("12345678901234567890123456789012345678901234567890123456789012345678901234567890"),
            "d5976f79d83d3a0dc9806c3c66f3efd8");
}

TEST(Md2, HmacIsTheInnerDigestUnderTheOuterKey) {
  const std::array<std::uint8_t, 16> key{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15, 16};
  const auto mac = metamem::oracle::hmac_md2(key, [](metamem::oracle::Md2& md2) { md2.update("abc", 3); });
  metamem::oracle::Md2 inner;
  inner.update(key.data(), key.size(), 0x36);
  inner.update("abc", 3);
  const auto digest = inner.finish();
  metamem::oracle::Md2 outer;
  outer.update(key.data(), key.size(), 0x5c);
  outer.update(digest.data(), digest.size());
  EXPECT_EQ(mac, outer.finish());
  EXPECT_NE(hex(mac), md2("abc"));
}
