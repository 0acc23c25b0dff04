#include "core/file.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>

namespace aspen {
namespace {

struct TempDir {
  std::string path = (std::filesystem::temp_directory_path() / ("aspen_file_" + std::to_string(::getpid()))).string();
  TempDir() { std::filesystem::create_directories(path); }
  ~TempDir() { std::filesystem::remove_all(path); }
};

void write(const std::string& path, const std::string& bytes) { std::ofstream(path, std::ios::binary) << bytes; }

TEST(InputFile, ReadsRegularFiles) {
  TempDir dir;
  write(dir.path + "/a.txt", std::string("ab\0c", 4));
  auto text = read_regular_file(dir.path + "/a.txt");
  ASSERT_TRUE(text.is_ok()) << text.status().to_string();
  EXPECT_EQ(*text, std::string("ab\0c", 4));
  auto f = InputFile::open(dir.path + "/a.txt", 100);
  ASSERT_TRUE(f.is_ok());
  EXPECT_EQ(f->size(), 4u);
  char two[2];
  ASSERT_TRUE(f->pread_exact(2, two, 2).is_ok());
  EXPECT_EQ(std::string(two, 2), std::string("\0c", 2));
}

// FileBytes: a large file mapped, a small one and an empty one read, bytes copied; moving keeps the bytes
// where they are; InputFile's checks apply.
TEST(FileBytes, MapsReadsAndCopiesAndMovesWithoutMovingTheBytes) {
  TempDir dir;
  std::string big(10000, 'x');
  big[9999] = 'z';
  write(dir.path + "/big", big);
  write(dir.path + "/small", "abc");
  write(dir.path + "/empty", "");
  for (const auto& [name, want] : {std::pair{"big", big}, std::pair{"small", std::string("abc")},
                                   std::pair{"empty", std::string()}}) {
    SCOPED_TRACE(name);
    auto f = FileBytes::open(dir.path + "/" + name, 1 << 20);
    ASSERT_TRUE(f.is_ok()) << f.status().to_string();
    ASSERT_EQ(f->size(), want.size());
    ASSERT_NE(f->data(), nullptr);
    EXPECT_EQ(std::string(reinterpret_cast<const char*>(f->data()), f->size()), want);
    const std::byte* at = f->data();
    FileBytes moved = std::move(*f);
    EXPECT_EQ(moved.data(), at);
    EXPECT_EQ(f->data(), nullptr);
  }
  const std::string text = "copy me";
  FileBytes c = FileBytes::copy(std::as_bytes(std::span(text.data(), text.size())));
  EXPECT_EQ(std::string(reinterpret_cast<const char*>(c.data()), c.size()), text);
  EXPECT_NE(reinterpret_cast<const char*>(c.data()), text.data());
  auto too_big = FileBytes::open(dir.path + "/big", 100);
  ASSERT_FALSE(too_big.is_ok());
  EXPECT_EQ(too_big.status().code(), Code::kCorrupt);
  EXPECT_EQ(FileBytes::open(dir.path + "/missing", 100).status().code(), Code::kNotFound);
}

// A FIFO would block open() and read() forever; /dev/zero would read until memory runs out.
// The file-backed pages of this process now (/proc/self/statm's third field).
int64_t file_pages_resident() {
  std::ifstream statm("/proc/self/statm");
  int64_t size = 0, all = 0, file = 0;
  statm >> size >> all >> file;
  return file * int64_t(::sysconf(_SC_PAGESIZE));
}

// NOTE [pages read once]: released pages leave the process's resident set, and read again they hold the same
// bytes; a range that covers no whole page, or bytes of a copy, are no-ops.
TEST(FileBytes, ReleasedPagesLeaveTheResidentSetAndReadTheSame) {
  TempDir dir;
  const size_t n = size_t(48) << 20;
  std::string bytes(n, '\0');
  for (size_t i = 0; i < n; ++i) bytes[i] = char((i * 2654435761u) >> 13);
  write(dir.path + "/big", bytes);
  auto f = FileBytes::open(dir.path + "/big", n);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  auto sum = [&] {
    uint64_t s = 0;
    for (size_t i = 0; i < n; i += 512) s += uint64_t(uint8_t(f->data()[i])) * i;
    return s;
  };
  uint64_t want = 0;
  for (size_t i = 0; i < n; i += 512) want += uint64_t(uint8_t(bytes[i])) * i;
  EXPECT_EQ(sum(), want);  // every page touched
  const int64_t touched = file_pages_resident();
  f->release(f->bytes().subspan(0, 100));  // no whole page: nothing
  f->release(f->bytes().subspan(1, n - 2));  // all but the first and last pages
  const int64_t released = file_pages_resident();
  EXPECT_GT(touched - released, int64_t(n) - (int64_t(4) << 20)) << touched << " -> " << released;
  EXPECT_EQ(sum(), want);  // read from the file again
  EXPECT_EQ(std::memcmp(f->data(), bytes.data(), n), 0);
  FileBytes c = FileBytes::copy(std::as_bytes(std::span(bytes.data(), 100)));
  c.release(c.bytes());
  EXPECT_EQ(std::memcmp(c.data(), bytes.data(), 100), 0);
}

TEST(InputFile, RefusesSpecialFilesWithoutBlocking) {
  TempDir dir;
  const std::string fifo = dir.path + "/pipe";
  ASSERT_EQ(::mkfifo(fifo.c_str(), 0600), 0);
  Status s = read_regular_file(fifo).status();
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(), fifo + ": expected a regular file, found a FIFO (named pipe)");
  s = InputFile::open("/dev/zero", kMaxBinaryFileBytes).status();
  EXPECT_EQ(s.message(), "/dev/zero: expected a regular file, found a character device");
  s = read_regular_file(dir.path).status();
  EXPECT_EQ(s.message(), dir.path + ": expected a regular file, found a directory");
}

TEST(InputFile, BoundsSizeAndNamesMissingFiles) {
  TempDir dir;
  write(dir.path + "/big", std::string(11, 'x'));
  Status s = read_regular_file(dir.path + "/big", 10).status();
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.message(), dir.path + "/big: expected at most 10 bytes, found 11 bytes");
  s = read_regular_file(dir.path + "/none").status();
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), dir.path + "/none: expected a readable file, found No such file or directory");
}

TEST(InputFile, TruncationWhileOpenIsCorruptNotACrash) {
  TempDir dir;
  const std::string path = dir.path + "/shard";
  write(path, std::string(64, 'x'));
  auto f = InputFile::open(path, 100);
  ASSERT_TRUE(f.is_ok());
  ASSERT_EQ(::truncate(path.c_str(), 40), 0);
  char buf[32];
  const Status s = f->pread_exact(32, buf, 32);
  EXPECT_EQ(s.code(), Code::kCorrupt);
  EXPECT_EQ(s.message(), path + ": expected 32 bytes at offset 32 (the file had 64 bytes when opened), found 8 bytes "
                                "(the file was truncated while in use)");
}

TEST(DirectoryLock, SecondClaimNamesTheHolder) {
  TempDir dir;
  const std::string run = dir.path + "/run";
  auto first = DirectoryLock::acquire(run, "run directory");
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  // flock is per open file description: a second open in this process conflicts as another process would.
  const Status s = DirectoryLock::acquire(run, "run directory").status();
  EXPECT_EQ(s.code(), Code::kFailedPrecondition);
  EXPECT_EQ(s.message(), "run directory '" + run + "': expected no other job using it, found one running (pid " +
                             std::to_string(::getpid()) + ", holding " + run + "/.lock) (hint: wait for it to finish, "
                             "or give this job another directory)");
  { DirectoryLock released = std::move(first).value(); }
  EXPECT_TRUE(DirectoryLock::acquire(run, "run directory").is_ok());
}

TEST(CheckWritableDirectory, CreatesOrNamesWhyNot) {
  TempDir dir;
  EXPECT_TRUE(check_writable_directory(dir.path + "/a/b", "checkpoint directory").is_ok());
  EXPECT_TRUE(std::filesystem::is_directory(dir.path + "/a/b"));
  std::ofstream(dir.path + "/file") << "x";
  const Status s = check_writable_directory(dir.path + "/file/sub", "checkpoint directory");
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.message().rfind("checkpoint directory '" + dir.path + "/file/sub': expected a directory that exists or "
                              "can be created, found ", 0), 0u) << s.message();
  if (::geteuid() != 0) {  // root writes anywhere
    std::filesystem::create_directories(dir.path + "/ro");
    ::chmod((dir.path + "/ro").c_str(), 0555);
    EXPECT_EQ(check_writable_directory(dir.path + "/ro", "run directory").message(),
              "run directory '" + dir.path + "/ro': expected a directory this job can write files in, found Permission "
              "denied");
    ::chmod((dir.path + "/ro").c_str(), 0755);
  }
}

TEST(EscapeForTerminal, EscapesControlBytesKeepsUtf8) {
  EXPECT_EQ(escape_for_terminal("plain 'text'"), "plain 'text'");
  EXPECT_EQ(escape_for_terminal(std::string("a\0b\x1b[2J\x7f", 8)), "a\\0b\\x1b[2J\\x7f");
  EXPECT_EQ(escape_for_terminal("line\nnext\ttab\r"), "line\\nnext\\ttab\\r");
  EXPECT_EQ(escape_for_terminal("caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80"), "caf\xc3\xa9 \xe2\x82\xac \xf0\x9f\x98\x80");
  EXPECT_EQ(escape_for_terminal("\xff\xc3"), "\\xff\\xc3");        // not UTF-8; a cut sequence
  EXPECT_EQ(escape_for_terminal("\xc2\x9b"), "\\xc2\\x9b");        // C1 control (CSI)
  EXPECT_EQ(escape_for_terminal("\xc0\xaf"), "\\xc0\\xaf");        // overlong '/'
  EXPECT_EQ(escape_for_terminal("\xed\xa0\x80"), "\\xed\\xa0\\x80");  // a surrogate
}

}  // namespace
}  // namespace aspen
