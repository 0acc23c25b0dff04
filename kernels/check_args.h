// kernels/check_args.h: argument validation shared by every kernel.
//
// Kernels take buffers as std::span and shapes as integers. Before touching
// memory, each kernel checks every extent is non-negative and every buffer
// holds at least what the shape needs, and returns a Status that names the
// kernel, the argument, what was expected and what was given:
//   "layernorm_forward: argument 'gamma': expected at least 768 elements, found 512"
#pragma once

#include <cstdint>
#include <span>
#include <string>

#include "core/status.h"

namespace aspen::kernels {

inline Status check_extent(const char* kernel, const char* name, int64_t value, int64_t min = 0) {
  if (value < min)
    return Status::invalid_argument(std::string(kernel) + ": " + name, ">= " + std::to_string(min),
                                    std::to_string(value));
  return Status();
}

template <class T>
Status check_buffer(const char* kernel, const char* name, std::span<T> buf, int64_t required) {
  if (required > 0 && buf.data() == nullptr)
    return Status::invalid_argument(std::string(kernel) + ": argument '" + name + "'",
                                    "a buffer of " + std::to_string(required) + " elements", "a null pointer");
  if (int64_t(buf.size()) < required)
    return Status::invalid_argument(std::string(kernel) + ": argument '" + name + "'",
                                    "at least " + std::to_string(required) + " elements",
                                    std::to_string(buf.size()));
  return Status();
}

}  // namespace aspen::kernels
