// core/status.h: errors as values.
//
// Status is the result of an operation that can fail because of its input (a
// file, a config, a shape, an option). A failed Status names the subject (the
// thing that is wrong), what was expected, what was found, and optionally a
// hint:  "matmul: argument 'a': expected at least 12 elements, found 6".
// Result<T> holds either a T or a failed Status.
//
// Broken internal invariants are not Status: they are ASPEN_CHECK failures,
// which print file and line and abort (see check.h).
//
// Thread-safety: Status and Result are values; distinct objects may be used
// from different threads freely.
#pragma once

#include <memory>
#include <string>
#include <utility>
#include <variant>

namespace aspen {

enum class Code : int {
  kOk = 0,
  kInvalidArgument,     // the caller passed something malformed
  kOutOfRange,          // an index or size outside what is allowed
  kNotFound,            // a named thing does not exist
  kCorrupt,             // a file or buffer failed validation
  kUnimplemented,       // valid request this build cannot serve (e.g. dtype combination)
  kFailedPrecondition,  // the system is not in a state to do this
  kIoError,             // the operating system reported an error
  kInternal,            // a bug; prefer ASPEN_CHECK where aborting is acceptable
  kDeadlineExceeded,    // waited longer than allowed (a collective whose peers did not arrive)
  kAborted,             // gave up because a peer failed (another rank's error ended the collective)
};

const char* code_name(Code code);

class [[nodiscard]] Status {
 public:
  Status() = default;  // ok

  static Status ok() { return Status(); }
  // The general form: subject, expected, found, optional hint.
  static Status error(Code code, std::string subject, std::string expected, std::string found,
                      std::string hint = {});
  static Status invalid_argument(std::string subject, std::string expected, std::string found,
                                 std::string hint = {}) {
    return error(Code::kInvalidArgument, std::move(subject), std::move(expected), std::move(found),
                 std::move(hint));
  }
  static Status unimplemented(std::string subject, std::string what);

  bool is_ok() const { return rep_ == nullptr; }
  explicit operator bool() const { return is_ok(); }
  Code code() const { return rep_ ? rep_->code : Code::kOk; }
  const std::string& subject() const;
  const std::string& expected() const;
  const std::string& found() const;
  const std::string& hint() const;

  // "subject: expected E, found F (hint: H)", or "ok".
  std::string message() const;
  // "InvalidArgument: " + message().
  std::string to_string() const;

  // Prefixes the subject with context, e.g. "layer 3" -> "layer 3: attn.q".
  Status with_context(const std::string& context) &&;

 private:
  struct Rep {
    Code code;
    std::string subject, expected, found, hint;
  };
  std::shared_ptr<const Rep> rep_;  // null when ok; shared so copies are cheap
};

template <class T>
class [[nodiscard]] Result {
 public:
  Result(T value) : v_(std::move(value)) {}  // NOLINT: implicit by design
  Result(Status status) : v_(std::move(status)) {  // NOLINT
    if (std::get<Status>(v_).is_ok()) v_ = Status::error(Code::kInternal, "Result", "a failed Status or a value", "an ok Status");
  }

  bool is_ok() const { return std::holds_alternative<T>(v_); }
  explicit operator bool() const { return is_ok(); }
  Status status() const { return is_ok() ? Status() : std::get<Status>(v_); }

  // Accessing the value of a failed Result is a bug: it aborts with the message.
  T& value() & { check(); return std::get<T>(v_); }
  const T& value() const& { check(); return std::get<T>(v_); }
  T&& value() && { check(); return std::get<T>(std::move(v_)); }
  T* operator->() { return &value(); }
  const T* operator->() const { return &value(); }
  T& operator*() & { return value(); }
  const T& operator*() const& { return value(); }

 private:
  void check() const;
  std::variant<T, Status> v_;
};

[[noreturn]] void die_on_bad_result(const Status& s, const char* file, int line);

template <class T>
void Result<T>::check() const {
  if (!is_ok()) die_on_bad_result(std::get<Status>(v_), __FILE__, __LINE__);
}

}  // namespace aspen

// Returns from the enclosing function if `expr` (a Status) failed.
#define ASPEN_RETURN_IF_ERROR(expr)                \
  do {                                             \
    ::aspen::Status aspen_status_ = (expr);        \
    if (!aspen_status_.is_ok()) return aspen_status_; \
  } while (0)

#define ASPEN_CONCAT_INNER_(a, b) a##b
#define ASPEN_CONCAT_(a, b) ASPEN_CONCAT_INNER_(a, b)
// `ASPEN_ASSIGN_OR_RETURN(auto x, make())`: binds the value or returns the error.
#define ASPEN_ASSIGN_OR_RETURN(lhs, expr) \
  ASPEN_ASSIGN_OR_RETURN_IMPL_(ASPEN_CONCAT_(aspen_result_, __LINE__), lhs, expr)
#define ASPEN_ASSIGN_OR_RETURN_IMPL_(tmp, lhs, expr) \
  auto tmp = (expr);                                 \
  if (!tmp.is_ok()) return tmp.status();             \
  lhs = std::move(tmp).value()
