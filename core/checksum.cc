#include "core/checksum.h"

#include <array>
#include <cstring>

namespace aspen {

namespace {

constexpr uint32_t kPoly = 0x82f63b78u;  // CRC-32C, reflected

constexpr std::array<uint32_t, 256> make_table() {
  std::array<uint32_t, 256> t{};
  for (uint32_t i = 0; i < 256; ++i) {
    uint32_t c = i;
    for (int k = 0; k < 8; ++k) c = (c >> 1) ^ (kPoly & (0u - (c & 1u)));
    t[i] = c;
  }
  return t;
}
constexpr std::array<uint32_t, 256> kTable = make_table();

uint32_t crc_table(const unsigned char* p, size_t n, uint32_t c) {
  for (size_t i = 0; i < n; ++i) c = kTable[(c ^ p[i]) & 0xffu] ^ (c >> 8);
  return c;
}

#if defined(__x86_64__)
__attribute__((target("sse4.2"))) uint32_t crc_sse42(const unsigned char* p, size_t n, uint32_t c) {
  uint64_t c64 = c;
  while (n >= 8) {
    uint64_t v;
    std::memcpy(&v, p, 8);
    c64 = __builtin_ia32_crc32di(c64, v);
    p += 8;
    n -= 8;
  }
  uint32_t c32 = uint32_t(c64);
  while (n > 0) {
    c32 = __builtin_ia32_crc32qi(c32, *p++);
    --n;
  }
  return c32;
}
bool have_sse42() {
  static const bool yes = __builtin_cpu_supports("sse4.2");
  return yes;
}
#endif

}  // namespace

uint32_t crc32c(std::string_view bytes, uint32_t crc) {
  const auto* p = reinterpret_cast<const unsigned char*>(bytes.data());
  uint32_t c = ~crc;
#if defined(__x86_64__)
  if (have_sse42()) return ~crc_sse42(p, bytes.size(), c);
#endif
  return ~crc_table(p, bytes.size(), c);
}

std::string hex_digits(uint64_t value, int digits) {
  static const char* kDigits = "0123456789abcdef";
  std::string s(size_t(digits), '0');
  for (int i = digits - 1; i >= 0; --i, value >>= 4) s[size_t(i)] = kDigits[value & 15];
  return s;
}

std::string crc32c_hex(uint32_t crc) { return hex_digits(crc, 8); }

}  // namespace aspen
