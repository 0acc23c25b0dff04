// profile/trace_testing.h: events made by hand for the profile's tests.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "profile/trace.h"

namespace aspen::profile {

inline TraceEvent test_event(std::string device, std::string name, int64_t start, int64_t end, int64_t bytes = 0,
                             std::string cat = category::kKernel,
                             std::vector<std::pair<std::string, std::string>> args = {}) {
  TraceEvent e;
  e.device = std::move(device);
  e.name = std::move(name);
  e.category = std::move(cat);
  e.start_ns = start;
  e.end_ns = end;
  e.bytes = bytes;
  e.args = std::move(args);
  return e;
}

}  // namespace aspen::profile
