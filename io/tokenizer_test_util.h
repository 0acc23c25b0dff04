// io/tokenizer_test_util.h: helpers the tokenizer golden tests share (test-only).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "io/tokenizer.h"

namespace aspen::io::tokenizer_test {

// The text split on '\n' (a final empty piece kept), as the golden scripts split it.
inline std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  size_t start = 0;
  for (size_t p; (p = text.find('\n', start)) != std::string::npos; start = p + 1)
    lines.push_back(text.substr(start, p - start));
  lines.push_back(text.substr(start));
  return lines;
}

// The golden scripts' digest: FNV-1a 64 over each id as a little-endian u32, then the u32 0xFFFFFFFF.
inline uint64_t fnv1a(uint64_t h, const std::vector<TokenId>& ids) {
  auto mix = [&](uint32_t v) {
    for (int b = 0; b < 4; ++b) {
      h ^= (v >> (8 * b)) & 0xFF;
      h *= 0x100000001B3ull;
    }
  };
  for (TokenId id : ids) mix(uint32_t(id));
  mix(0xFFFFFFFFu);
  return h;
}

constexpr uint64_t kFnvBasis = 0xCBF29CE484222325ull;

}  // namespace aspen::io::tokenizer_test
