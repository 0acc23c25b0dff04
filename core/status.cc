#include "core/status.h"

#include <cstdio>
#include <cstdlib>

namespace aspen {

const char* code_name(Code code) {
  switch (code) {
    case Code::kOk: return "Ok";
    case Code::kInvalidArgument: return "InvalidArgument";
    case Code::kOutOfRange: return "OutOfRange";
    case Code::kNotFound: return "NotFound";
    case Code::kCorrupt: return "Corrupt";
    case Code::kUnimplemented: return "Unimplemented";
    case Code::kFailedPrecondition: return "FailedPrecondition";
    case Code::kIoError: return "IoError";
    case Code::kInternal: return "Internal";
    case Code::kDeadlineExceeded: return "DeadlineExceeded";
    case Code::kAborted: return "Aborted";
  }
  return "Unknown";
}

Status Status::error(Code code, std::string subject, std::string expected, std::string found,
                     std::string hint) {
  Status s;
  if (code == Code::kOk) code = Code::kInternal;  // an "error" that is ok is itself a bug
  s.rep_ = std::make_shared<const Rep>(
      Rep{code, std::move(subject), std::move(expected), std::move(found), std::move(hint)});
  return s;
}

Status Status::unimplemented(std::string subject, std::string what) {
  return error(Code::kUnimplemented, std::move(subject), "a supported " + what, "an unsupported one");
}

static const std::string& empty_string() {
  static const std::string empty;
  return empty;
}

const std::string& Status::subject() const { return rep_ ? rep_->subject : empty_string(); }
const std::string& Status::expected() const { return rep_ ? rep_->expected : empty_string(); }
const std::string& Status::found() const { return rep_ ? rep_->found : empty_string(); }
const std::string& Status::hint() const { return rep_ ? rep_->hint : empty_string(); }

std::string Status::message() const {
  if (!rep_) return "ok";
  std::string m = rep_->subject;
  if (!rep_->expected.empty()) m += ": expected " + rep_->expected;
  if (!rep_->found.empty()) m += (rep_->expected.empty() ? ": " : ", found ") + rep_->found;
  if (!rep_->hint.empty()) m += " (hint: " + rep_->hint + ")";
  return m;
}

std::string Status::to_string() const {
  if (!rep_) return "ok";
  return std::string(code_name(rep_->code)) + ": " + message();
}

Status Status::with_context(const std::string& context) && {
  if (!rep_) return std::move(*this);
  return error(rep_->code, context + ": " + rep_->subject, rep_->expected, rep_->found, rep_->hint);
}

void die_on_bad_result(const Status& s, const char* file, int line) {
  std::fprintf(stderr, "%s:%d: value() of a failed Result: %s\n", file, line, s.to_string().c_str());
  std::abort();
}

}  // namespace aspen
