// core/check.h: invariants.
//
// ASPEN_CHECK(cond) << "context" aborts with file, line, the condition and the
// streamed context when `cond` is false, in every build type. It is for bugs
// in aspen, never for user input (user input gets a Status; see status.h).
#pragma once

#include <sstream>

namespace aspen::detail {

class CheckFailure {
 public:
  CheckFailure(const char* file, int line, const char* cond);
  [[noreturn]] ~CheckFailure();
  template <class T>
  CheckFailure& operator<<(const T& v) {
    os_ << v;
    return *this;
  }

 private:
  std::ostringstream os_;
};

// Makes `cond ? (void)0 : Voidify() & CheckFailure(...) << ...` type-check.
struct Voidify {
  void operator&(const CheckFailure&) {}
};

}  // namespace aspen::detail

#define ASPEN_CHECK(cond)                 \
  (cond) ? (void)0                        \
         : ::aspen::detail::Voidify() &   \
               ::aspen::detail::CheckFailure(__FILE__, __LINE__, #cond)
