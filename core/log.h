// core/log.h: leveled logging to a sink (stderr by default).
//
//   ASPEN_LOG(info) << "compiled " << n << " nodes";
//
// Messages below the current level cost one comparison. The library logs
// warnings (e.g. a stale cache entry rebuilt) and never prints results; the
// CLI sets the level from --verbose/--quiet.
//
// Thread-safety: a message is formatted locally and written under a lock.
#pragma once

#include <functional>
#include <sstream>
#include <string>

namespace aspen {

enum class LogLevel : int { debug = 0, info = 1, warning = 2, error = 3, off = 4 };

LogLevel log_level();
void set_log_level(LogLevel level);
// Replaces the sink; pass nullptr to restore stderr. Returns the old one.
using LogSink = std::function<void(LogLevel, const std::string&)>;
LogSink set_log_sink(LogSink sink);

namespace detail {
class LogMessage {
 public:
  LogMessage(LogLevel level, const char* file, int line);
  ~LogMessage();
  template <class T>
  LogMessage& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  LogLevel level_;
  std::ostringstream os_;
};
struct LogVoidify {
  void operator&(const LogMessage&) {}
};
}  // namespace detail

}  // namespace aspen

// An expression, not an if-statement, so it nests safely inside an unbraced if.
#define ASPEN_LOG(level)                                  \
  (::aspen::LogLevel::level < ::aspen::log_level())       \
      ? (void)0                                           \
      : ::aspen::detail::LogVoidify() &                   \
            ::aspen::detail::LogMessage(::aspen::LogLevel::level, __FILE__, __LINE__)
