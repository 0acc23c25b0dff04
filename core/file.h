// core/file.h: opening and reading input files a user names (configs,
// tokenizers, weights, token shards, cache entries, checkpoints) so that no
// file can hang or exhaust the process.
//
//   ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxConfigBytes));
//   ASPEN_ASSIGN_OR_RETURN(InputFile f, InputFile::open(path, kMaxWeightBytes));  // f.fd(), f.size()
//
// Every input is opened with O_NONBLOCK (so a FIFO or a device never blocks
// the open), then must be a regular file (a FIFO, /dev/zero, a socket or a
// directory is InvalidArgument naming the path and what it is) of at most
// `max_bytes` (Corrupt naming both sizes). A missing file is NotFound; other
// OS failures are IoError with strerror. The non-blocking flag is cleared
// after the checks: reading a regular file never blocks anyway.
//
// Thread-safety: free functions and a move-only owner of one descriptor.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace aspen {

// Size bounds for the kinds of input (bytes).
inline constexpr uint64_t kMaxTextFileBytes = uint64_t(256) << 20;   // JSON / YAML / vocab / merges files
inline constexpr uint64_t kMaxBinaryFileBytes = uint64_t(1) << 42;   // weight and token shards (4 TiB)

class InputFile {
 public:
  static Result<InputFile> open(const std::string& path, uint64_t max_bytes);
  InputFile(InputFile&& o) noexcept;
  InputFile& operator=(InputFile&& o) noexcept;
  InputFile(const InputFile&) = delete;
  InputFile& operator=(const InputFile&) = delete;
  ~InputFile();

  int fd() const { return fd_; }
  uint64_t size() const { return size_; }  // at open()
  const std::string& path() const { return path_; }
  // Reads exactly `bytes` bytes at `offset`. A short read (the file shrank
  // since open()) is Corrupt naming the path, the range and the bytes found.
  [[nodiscard]] Status pread_exact(uint64_t offset, void* out, uint64_t bytes) const;

 private:
  InputFile() = default;
  int fd_ = -1;
  uint64_t size_ = 0;
  std::string path_;
};

// The bytes of an input file (InputFile's checks), memory-mapped read-only, or read when under 4 KiB (mmap
// refuses an empty file); or a copy of bytes in memory. Move-only; moving keeps the bytes where they are, so
// pointers into them stay valid. data() is never null (a byte past the end is allocated for the copies).
class FileBytes {
 public:
  static Result<FileBytes> open(const std::string& path, uint64_t max_bytes);
  static FileBytes copy(std::span<const std::byte> bytes);
  FileBytes() = default;
  FileBytes(FileBytes&& o) noexcept;
  FileBytes& operator=(FileBytes&& o) noexcept;
  FileBytes(const FileBytes&) = delete;
  FileBytes& operator=(const FileBytes&) = delete;
  ~FileBytes();

  const std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  std::span<const std::byte> bytes() const { return {data_, size_t(size_)}; }
  // NOTE [pages read once]: drops the whole pages inside `range` (a part of bytes()) from the process's
  // resident memory; reading them again reads them from the file (the page cache) again, so the bytes seen
  // never change. For a file read once into other buffers (weights into a program's parameters): without it
  // the mapping's pages stay resident beside their copies, and loading a model peaks at twice its size.
  // Nothing for a copy. Thread-safe.
  void release(std::span<const std::byte> range) const;

 private:
  void release();
  void* map_ = nullptr;  // the mapping, or null
  size_t map_size_ = 0;
  std::unique_ptr<std::byte[]> owned_;  // the copy, or null
  const std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

// An exclusive claim on a directory for the life of a job (a training run
// directory, a checkpoint root): flock() on <dir>/.lock, which holds the
// holder's pid. The kernel drops the claim when the process ends however it
// ends, so a crashed run never leaves a stale lock. A second claimant gets
// FailedPrecondition naming the directory and the holder's pid. On a
// filesystem without flock (ENOLCK, EOPNOTSUPP) the claim is a warning only.
class DirectoryLock {
 public:
  // Creates `dir` (and parents) if missing. `what` names it in errors ("run directory").
  static Result<DirectoryLock> acquire(const std::string& dir, const std::string& what);
  DirectoryLock(DirectoryLock&& o) noexcept;
  DirectoryLock& operator=(DirectoryLock&& o) noexcept;
  DirectoryLock(const DirectoryLock&) = delete;
  DirectoryLock& operator=(const DirectoryLock&) = delete;
  ~DirectoryLock();  // releases the claim (the .lock file stays: removing it would race a new claimant)

 private:
  DirectoryLock() = default;
  int fd_ = -1;
};

// OK when a file can be created in `dir` (made with its parents if missing):
// an output directory checked before a job starts, not at its first save.
// IoError naming the directory, `what` it is for, and strerror.
[[nodiscard]] Status check_writable_directory(const std::string& dir, const std::string& what);

// The whole contents of a regular file of at most `max_bytes`.
Result<std::string> read_regular_file(const std::string& path, uint64_t max_bytes = kMaxTextFileBytes);

// `s` with control bytes, DEL and bytes that are not UTF-8 spelled as \xNN
// (and \n, \t, \r, \0 as themselves escaped), so a message never writes raw
// control bytes to a terminal. Printable ASCII and valid UTF-8 pass through.
std::string escape_for_terminal(std::string_view s);

// This machine's physical memory in bytes, or a container's limit (cgroup v2, then v1) where it is lower;
// 0 when unknown. Read once per process. Thread-safe.
double physical_memory_bytes();

}  // namespace aspen
