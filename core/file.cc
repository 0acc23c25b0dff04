#include "core/file.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <utility>

#include "core/log.h"

namespace aspen {

namespace {

const char* kind_of(mode_t m) {
  if (S_ISDIR(m)) return "a directory";
  if (S_ISFIFO(m)) return "a FIFO (named pipe)";
  if (S_ISCHR(m)) return "a character device";
  if (S_ISBLK(m)) return "a block device";
  if (S_ISSOCK(m)) return "a socket";
  return "not a regular file";
}

}  // namespace

InputFile::InputFile(InputFile&& o) noexcept
    : fd_(std::exchange(o.fd_, -1)), size_(std::exchange(o.size_, 0)), path_(std::move(o.path_)) {}

InputFile& InputFile::operator=(InputFile&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
    size_ = std::exchange(o.size_, 0);
    path_ = std::move(o.path_);
  }
  return *this;
}

InputFile::~InputFile() {
  if (fd_ >= 0) ::close(fd_);
}

Result<InputFile> InputFile::open(const std::string& path, uint64_t max_bytes) {
  InputFile f;
  f.path_ = path;
  f.fd_ = ::open(path.c_str(), O_RDONLY | O_CLOEXEC | O_NONBLOCK | O_NOCTTY);
  if (f.fd_ < 0) {
    const int err = errno;
    return Status::error(err == ENOENT ? Code::kNotFound : Code::kIoError, path, "a readable file",
                         std::strerror(err));
  }
  struct stat st;
  if (::fstat(f.fd_, &st) != 0) return Status::error(Code::kIoError, path, "a file whose size can be read", std::strerror(errno));
  if (!S_ISREG(st.st_mode)) return Status::invalid_argument(path, "a regular file", kind_of(st.st_mode));
  f.size_ = uint64_t(st.st_size);
  if (f.size_ > max_bytes)
    return Status::error(Code::kCorrupt, path, "at most " + std::to_string(max_bytes) + " bytes",
                         std::to_string(f.size_) + " bytes");
  const int flags = ::fcntl(f.fd_, F_GETFL);
  if (flags >= 0) (void)::fcntl(f.fd_, F_SETFL, flags & ~O_NONBLOCK);
  return f;
}

FileBytes::FileBytes(FileBytes&& o) noexcept { *this = std::move(o); }

FileBytes& FileBytes::operator=(FileBytes&& o) noexcept {
  if (this != &o) {
    release();
    map_ = std::exchange(o.map_, nullptr);
    map_size_ = std::exchange(o.map_size_, 0);
    owned_ = std::move(o.owned_);
    data_ = std::exchange(o.data_, nullptr);
    size_ = std::exchange(o.size_, 0);
  }
  return *this;
}

FileBytes::~FileBytes() { release(); }

void FileBytes::release() {
  if (map_) munmap(map_, map_size_);
  map_ = nullptr;
  map_size_ = 0;
  owned_.reset();
  data_ = nullptr;
  size_ = 0;
}

FileBytes FileBytes::copy(std::span<const std::byte> bytes) {
  FileBytes f;
  f.owned_ = std::make_unique_for_overwrite<std::byte[]>(bytes.size() + 1);
  if (!bytes.empty()) std::memcpy(f.owned_.get(), bytes.data(), bytes.size());
  f.data_ = f.owned_.get();
  f.size_ = bytes.size();
  return f;
}

Result<FileBytes> FileBytes::open(const std::string& path, uint64_t max_bytes) {
  ASPEN_ASSIGN_OR_RETURN(const InputFile in, InputFile::open(path, max_bytes));
  FileBytes f;
  if (in.size() < 4096) {
    f.owned_ = std::make_unique_for_overwrite<std::byte[]>(size_t(in.size()) + 1);
    ASPEN_RETURN_IF_ERROR(in.pread_exact(0, f.owned_.get(), in.size()));
    f.data_ = f.owned_.get();
    f.size_ = in.size();
    return f;
  }
  void* m = mmap(nullptr, size_t(in.size()), PROT_READ, MAP_PRIVATE, in.fd(), 0);
  const int err = errno;
  if (m == MAP_FAILED)
    return Status::error(Code::kIoError, path, "a file that can be memory-mapped", std::strerror(err));
  f.map_ = m;
  f.map_size_ = size_t(in.size());
  f.data_ = static_cast<const std::byte*>(m);
  f.size_ = in.size();
  return f;
}

void FileBytes::release(std::span<const std::byte> range) const {
  if (map_ == nullptr || range.empty()) return;
  static const uintptr_t page = uintptr_t(sysconf(_SC_PAGESIZE));
  const auto begin = reinterpret_cast<uintptr_t>(range.data()), end = begin + range.size();
  const uintptr_t lo = (begin + page - 1) / page * page, hi = end / page * page;  // whole pages only
  const auto map_lo = reinterpret_cast<uintptr_t>(map_), map_hi = map_lo + map_size_;
  if (lo >= hi || lo < map_lo || hi > map_hi) return;
  // A private read-only mapping's pages were never written: dropped, they read the file again. A failure
  // (none is expected) only leaves them resident.
  (void)madvise(reinterpret_cast<void*>(lo), size_t(hi - lo), MADV_DONTNEED);
}

Status InputFile::pread_exact(uint64_t offset, void* out, uint64_t bytes) const {
  auto* p = static_cast<char*>(out);
  uint64_t done = 0;
  while (done < bytes) {
    const ssize_t r = ::pread(fd_, p + done, size_t(bytes - done), off_t(offset + done));
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::error(Code::kIoError, path_, "a readable file", std::strerror(errno));
    if (r == 0)
      return Status::error(Code::kCorrupt, path_,
                           std::to_string(bytes) + " bytes at offset " + std::to_string(offset) + " (the file had " +
                               std::to_string(size_) + " bytes when opened)",
                           std::to_string(done) + " bytes (the file was truncated while in use)");
    done += uint64_t(r);
  }
  return Status::ok();
}

Result<std::string> read_regular_file(const std::string& path, uint64_t max_bytes) {
  ASPEN_ASSIGN_OR_RETURN(InputFile f, InputFile::open(path, max_bytes));
  std::string out(size_t(f.size()), '\0');
  size_t done = 0;
  while (done < out.size()) {
    const ssize_t r = ::read(f.fd(), out.data() + done, out.size() - done);
    if (r < 0 && errno == EINTR) continue;
    if (r < 0) return Status::error(Code::kIoError, path, "a readable file", std::strerror(errno));
    if (r == 0) break;  // shrank while read: what is there is validated by the caller
    done += size_t(r);
  }
  out.resize(done);
  return out;
}

DirectoryLock::DirectoryLock(DirectoryLock&& o) noexcept : fd_(std::exchange(o.fd_, -1)) {}
DirectoryLock& DirectoryLock::operator=(DirectoryLock&& o) noexcept {
  if (this != &o) {
    if (fd_ >= 0) ::close(fd_);
    fd_ = std::exchange(o.fd_, -1);
  }
  return *this;
}
DirectoryLock::~DirectoryLock() {
  if (fd_ >= 0) ::close(fd_);  // closing drops the flock
}

Result<DirectoryLock> DirectoryLock::acquire(const std::string& dir, const std::string& what) {
  const std::string subject = what + " '" + dir + "'";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(Code::kIoError, subject, "a directory that exists or can be created", ec.message());
  const std::string path = dir + "/.lock";
  DirectoryLock lock;
  lock.fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC | O_NOFOLLOW, 0644);
  if (lock.fd_ < 0) return Status::error(Code::kIoError, path, "a lock file that can be created", std::strerror(errno));
  if (::flock(lock.fd_, LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == ENOLCK || err == EOPNOTSUPP || err == ENOSYS || err == EINVAL) {
      // A filesystem without flock (some NFS, Lustre or FUSE mounts): run unlocked rather than not at all.
      ASPEN_LOG(warning) << subject << ": not locked (" << std::strerror(err)
                         << "): make sure no other job uses it";
      return lock;
    }
    if (err != EWOULDBLOCK) return Status::error(Code::kIoError, path, "a lock that can be taken", std::strerror(err));
    char buf[32] = {};
    const ssize_t n = ::pread(lock.fd_, buf, sizeof buf - 1, 0);
    std::string pid = n > 0 ? std::string(buf, size_t(n)) : std::string();
    while (!pid.empty() && (pid.back() == '\n' || pid.back() == ' ')) pid.pop_back();
    return Status::error(Code::kFailedPrecondition, subject, "no other job using it",
                         "one running (pid " + (pid.empty() ? std::string("unknown") : escape_for_terminal(pid)) +
                             ", holding " + path + ")",
                         "wait for it to finish, or give this job another directory");
  }
  const std::string pid = std::to_string(::getpid()) + "\n";
  if (::ftruncate(lock.fd_, 0) != 0 || ::pwrite(lock.fd_, pid.data(), pid.size(), 0) != ssize_t(pid.size()))
    return Status::error(Code::kIoError, path, "the holder's pid written", std::strerror(errno));
  return lock;
}

Status check_writable_directory(const std::string& dir, const std::string& what) {
  const std::string subject = what + " '" + dir + "'";
  std::error_code ec;
  std::filesystem::create_directories(dir, ec);
  if (ec) return Status::error(Code::kIoError, subject, "a directory that exists or can be created", ec.message());
  std::string probe = dir + "/.aspen-write-test-XXXXXX";
  const int fd = ::mkstemp(probe.data());
  if (fd < 0) return Status::error(Code::kIoError, subject, "a directory this job can write files in", std::strerror(errno));
  ::close(fd);
  ::unlink(probe.c_str());
  return Status::ok();
}

std::string escape_for_terminal(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  auto hex = [&](unsigned char c) {
    static const char* kDigits = "0123456789abcdef";
    out += "\\x";
    out += kDigits[c >> 4];
    out += kDigits[c & 15];
  };
  for (size_t i = 0; i < s.size();) {
    const auto c = static_cast<unsigned char>(s[i]);
    if (c >= 0x20 && c < 0x7f) {
      out += char(c);
      ++i;
      continue;
    }
    if (c == '\n') { out += "\\n"; ++i; continue; }
    if (c == '\t') { out += "\\t"; ++i; continue; }
    if (c == '\r') { out += "\\r"; ++i; continue; }
    if (c == 0) { out += "\\0"; ++i; continue; }
    // A whole, minimal UTF-8 sequence of a character that is not a C1 control passes through.
    size_t len = c >= 0xc2 && c <= 0xdf ? 2 : c >= 0xe0 && c <= 0xef ? 3 : c >= 0xf0 && c <= 0xf4 ? 4 : 0;
    bool ok = len > 0 && i + len <= s.size();
    for (size_t k = 1; ok && k < len; ++k) ok = (static_cast<unsigned char>(s[i + k]) & 0xc0) == 0x80;
    if (ok && len == 3) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xe0 && c1 < 0xa0) && !(c == 0xed && c1 >= 0xa0);  // overlong, surrogates
    }
    if (ok && len == 4) {
      const auto c1 = static_cast<unsigned char>(s[i + 1]);
      ok = !(c == 0xf0 && c1 < 0x90) && !(c == 0xf4 && c1 >= 0x90);  // overlong, beyond U+10FFFF
    }
    if (ok && len == 2 && c == 0xc2 && static_cast<unsigned char>(s[i + 1]) < 0xa0) ok = false;  // C1 controls
    if (ok) {
      out.append(s.data() + i, len);
      i += len;
    } else {
      hex(c);
      ++i;
    }
  }
  return out;
}

double physical_memory_bytes() {
  static const double memory = [] {  // read once: a machine's memory does not change under a process
    const long pages = ::sysconf(_SC_PHYS_PAGES), page = ::sysconf(_SC_PAGE_SIZE);
    double bytes = pages > 0 && page > 0 ? double(pages) * double(page) : 0.0;
    // A container's limit (cgroup v2, then v1) when it is lower: "max" or a huge number means none.
    for (const char* limit : {"/sys/fs/cgroup/memory.max", "/sys/fs/cgroup/memory/memory.limit_in_bytes"}) {
      Result<std::string> text = read_regular_file(limit, 64);
      if (!text.is_ok()) continue;
      char* end = nullptr;
      const double v = std::strtod(text->c_str(), &end);
      if (end != text->c_str() && v > 0 && (bytes <= 0 || v < bytes)) bytes = v;
    }
    return bytes;
  }();
  return memory;
}

}  // namespace aspen
