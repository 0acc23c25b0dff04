// io/test_files.h: file helpers the io and train tests share (test-only).
#pragma once

#include <stdlib.h>
#include <unistd.h>

#include <cstdlib>
#include <filesystem>

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

// A fresh directory (mkdtemp under the system's temporary directory), removed
// with everything in it when the object goes.
class TempDir {
 public:
  explicit TempDir(const std::string& prefix = "aspen_test") {
    std::string tmpl = (std::filesystem::temp_directory_path() / (prefix + "_XXXXXX")).string();
    if (mkdtemp(tmpl.data()) == nullptr) std::abort();
    path_ = tmpl;
  }
  ~TempDir() {
    std::error_code ec;
    std::filesystem::remove_all(path_, ec);
  }
  TempDir(const TempDir&) = delete;
  TempDir& operator=(const TempDir&) = delete;
  const std::string& path() const { return path_; }
  std::string operator/(const std::string& name) const { return path_ + "/" + name; }

 private:
  std::string path_;
};

}  // namespace aspen::io::test_files
