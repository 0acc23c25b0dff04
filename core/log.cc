#include "core/log.h"

#include <atomic>
#include <cstdio>
#include <mutex>

namespace aspen {

namespace {
std::atomic<int> g_level{int(LogLevel::warning)};
std::mutex g_mu;
LogSink& sink() {
  static LogSink s;
  return s;
}
const char* level_name(LogLevel l) {
  switch (l) {
    case LogLevel::debug: return "debug";
    case LogLevel::info: return "info";
    case LogLevel::warning: return "warning";
    case LogLevel::error: return "error";
    case LogLevel::off: return "off";
  }
  return "?";
}
}  // namespace

LogLevel log_level() { return LogLevel(g_level.load(std::memory_order_relaxed)); }
void set_log_level(LogLevel level) { g_level.store(int(level), std::memory_order_relaxed); }

LogSink set_log_sink(LogSink s) {
  std::lock_guard<std::mutex> lock(g_mu);
  LogSink old = std::move(sink());
  sink() = std::move(s);
  return old;
}

namespace detail {
LogMessage::LogMessage(LogLevel level, const char* file, int line) : level_(level) {
  (void)file;
  (void)line;
}
LogMessage::~LogMessage() {
  std::lock_guard<std::mutex> lock(g_mu);
  if (sink()) {
    sink()(level_, os_.str());
  } else {
    std::fprintf(stderr, "aspen %s: %s\n", level_name(level_), os_.str().c_str());
  }
}
}  // namespace detail

}  // namespace aspen
