#include "core/atomic_file.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>

namespace aspen {

namespace {

int write_all(int fd, std::string_view bytes) {
  const char* p = bytes.data();
  size_t n = bytes.size();
  while (n > 0) {
    const ssize_t w = ::write(fd, p, n);
    if (w < 0) {
      if (errno == EINTR) continue;
      return errno;
    }
    p += w;
    n -= size_t(w);
  }
  return 0;
}

}  // namespace

Status write_file_atomic(const std::string& path, std::span<const std::string_view> parts) {
  std::string tmp = path + ".tmp.XXXXXX";
  int fd = ::mkstemp(tmp.data());
  if (fd < 0)
    return Status::error(Code::kIoError, path, "a temporary file beside it to write", std::strerror(errno));
  auto fail = [&](const char* step, int err) {
    if (fd >= 0) ::close(fd);
    ::unlink(tmp.c_str());
    return Status::error(Code::kIoError, path, std::string(step) + " of '" + tmp + "' to succeed", std::strerror(err));
  };
  if (::fchmod(fd, 0644) != 0) return fail("chmod", errno);
  for (std::string_view part : parts)
    if (const int err = write_all(fd, part); err != 0) return fail("writing", err);
  if (::fsync(fd) != 0) return fail("fsync", errno);
  const int closed = ::close(fd);
  fd = -1;
  if (closed != 0) return fail("close", errno);
  if (::rename(tmp.c_str(), path.c_str()) != 0) return fail("rename onto it", errno);
  const size_t slash = path.find_last_of('/');
  const std::string dir = slash == std::string::npos ? "." : slash == 0 ? "/" : path.substr(0, slash);
  const int dfd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (dfd >= 0) {
    (void)::fsync(dfd);
    ::close(dfd);
  }
  return Status();
}

}  // namespace aspen
