#include "core/checksum.h"

#include <gtest/gtest.h>

#include <string>

namespace aspen {
namespace {

// The bitwise definition (reflected polynomial 0x82f63b78), the reference for both fast paths.
uint32_t crc32c_naive(std::string_view s) {
  uint32_t c = 0xffffffffu;
  for (unsigned char b : s) {
    c ^= b;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
  }
  return ~c;
}

TEST(Crc32c, KnownValuesAndOddLengths) {
  EXPECT_EQ(crc32c("123456789"), 0xe3069283u);  // the standard check value
  EXPECT_EQ(crc32c(""), 0u);
  EXPECT_EQ(crc32c(std::string(32, '\0')), 0x8a9136aau);  // RFC 3720 B.4
  std::string s;
  for (int n = 0; n < 70; ++n) {  // every tail length, unaligned starts
    EXPECT_EQ(crc32c(s), crc32c_naive(s)) << n;
    EXPECT_EQ(crc32c(std::string_view(s).substr(s.empty() ? 0 : 1)), crc32c_naive(std::string_view(s).substr(s.empty() ? 0 : 1)));
    s.push_back(char(n * 37 + 11));
  }
  // Continuing over pieces equals one pass.
  EXPECT_EQ(crc32c(std::string_view(s).substr(13), crc32c(std::string_view(s).substr(0, 13))), crc32c(s));
}

TEST(Crc32c, DetectsAFlippedByte) {
  std::string s(1 << 16, 'a');
  const uint32_t before = crc32c(s);
  s.back() ^= 1;
  EXPECT_NE(crc32c(s), before);
}

TEST(Crc32c, LargeBufferInPiecesAndHex) {
  std::string data((5 << 20) + 3, '\0');
  for (size_t i = 0; i < data.size(); ++i) data[i] = char(i * 131 + (i >> 9));
  uint32_t pieces = 0;
  for (size_t at = 0; at < data.size(); at += 1 << 20)
    pieces = crc32c(std::string_view(data).substr(at, 1 << 20), pieces);
  EXPECT_EQ(pieces, crc32c_naive(data));
  EXPECT_EQ(crc32c_hex(0xe3069283u), "e3069283");
  EXPECT_EQ(crc32c_hex(0x0000000fu), "0000000f");
  EXPECT_EQ(hex_digits(0xabcu, 5), "00abc");
}

}  // namespace
}  // namespace aspen
