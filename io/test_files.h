// io/test_files.h: file helpers the io tests share (test-only).
#pragma once

#include <unistd.h>

#include <fstream>
#include <sstream>
#include <string>

namespace aspen::io::test_files {

inline std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::ostringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

// Unlinks first: truncating a file in place makes ext4 flush it on close (auto_da_alloc),
// which turns the corruption loops from milliseconds into seconds.
inline void write_bytes(const std::string& path, const std::string& bytes) {
  ::unlink(path.c_str());
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(bytes.data(), std::streamsize(bytes.size()));
}

}  // namespace aspen::io::test_files
