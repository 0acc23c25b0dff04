#include "core/atomic_file.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <sstream>
#include <thread>
#include <vector>

namespace aspen {
namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

struct TempDir {
  std::string path = (std::filesystem::temp_directory_path() / ("aspen_atomic_" + std::to_string(::getpid()))).string();
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
  size_t entries() const {
    size_t n = 0;
    for ([[maybe_unused]] const auto& e : std::filesystem::directory_iterator(path)) ++n;
    return n;
  }
};

TEST(AtomicFile, WritesPartsAndReplacesWholeFiles) {
  TempDir dir;
  const std::string path = dir.path + "/f.bin";
  const std::string_view parts[] = {"abc", "", std::string_view("d\0e", 3)};
  ASSERT_TRUE(write_file_atomic(path, parts).is_ok());
  EXPECT_EQ(read_file(path), std::string("abcd\0e", 6));
  ASSERT_TRUE(write_file_atomic(path, "new").is_ok());
  EXPECT_EQ(read_file(path), "new");
  EXPECT_EQ(dir.entries(), 1u);  // no temporary file left
  EXPECT_EQ(std::filesystem::status(path).permissions() & std::filesystem::perms::owner_read,
            std::filesystem::perms::owner_read);
}

TEST(AtomicFile, FailuresNameThePathAndLeaveNothing) {
  const Status s = write_file_atomic("/nonexistent-aspen-dir/f.bin", "x");
  ASSERT_FALSE(s.is_ok());
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.message(),
            "/nonexistent-aspen-dir/f.bin: expected a temporary file beside it to write, found No such file or "
            "directory");
  // A directory in the way of the rename: an error, and the temporary file is gone.
  TempDir dir;
  std::filesystem::create_directories(dir.path + "/d/child");
  const Status r = write_file_atomic(dir.path + "/d", "x");
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.message().find("rename onto it"), std::string::npos) << r.message();
  EXPECT_EQ(dir.entries(), 1u);
}

TEST(AtomicFile, ConcurrentWritersLeaveOneWholeFile) {
  TempDir dir;
  const std::string path = dir.path + "/shared.bin";
  std::vector<std::thread> threads;
  for (int t = 0; t < 8; ++t)
    threads.emplace_back([&, t] {
      const std::string body(100000, char('a' + t));
      for (int k = 0; k < 5; ++k) EXPECT_TRUE(write_file_atomic(path, body).is_ok());
    });
  for (auto& th : threads) th.join();
  const std::string got = read_file(path);
  ASSERT_EQ(got.size(), 100000u);
  EXPECT_EQ(got.find_first_not_of(got[0]), std::string::npos);  // one writer's bytes, whole
  EXPECT_EQ(dir.entries(), 1u);
}

}  // namespace
}  // namespace aspen
