// python/binding.h: what the extension module's translation units share (private to python/): aspen's
// Status as a C++ exception that the module turns into a Python one (python/module.cc), and outputs as
// numpy arrays without copies (NOTE [python arrays]).
#pragma once

#include <nanobind/nanobind.h>

#include <exception>
#include <string>
#include <utility>

#include "core/status.h"
#include "core/tensor.h"

namespace nb = nanobind;

namespace aspen::python {

struct StatusError : std::exception {
  explicit StatusError(Status s) : status(std::move(s)), text(status.message()) {}
  const char* what() const noexcept override { return text.c_str(); }
  Status status;
  std::string text;
};

inline void check(const Status& s) {
  if (!s.is_ok()) throw StatusError(s);
}
template <class T>
T take(Result<T> r) {
  if (!r.is_ok()) throw StatusError(r.status());
  return std::move(r).value();
}
[[noreturn]] inline void bad_argument(std::string subject, std::string expected, std::string found) {
  throw StatusError(Status::invalid_argument(std::move(subject), std::move(expected), std::move(found)));
}

// A numpy array over `t`'s memory, owned by a capsule (f32 for bf16). `merge` leading dimensions are
// folded into the next one (PopTorch's combined batch).
nb::object to_numpy(Tensor t, int merge = 0);

// The Tokenizer, Generator and Embedder classes (python/text.cc).
void bind_text(nb::module_& m);

}  // namespace aspen::python
