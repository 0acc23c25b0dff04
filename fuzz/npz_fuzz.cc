// fuzz/npz_fuzz.cc: libFuzzer target for the .npz reader (io/npz.h).
//
// The input is a whole .npz file. parse_npz must give a Status or arrays; when it gives arrays, each holds
// exactly the bytes its dtype and shape need (and there is at least one).
#include <cstddef>
#include <cstdint>
#include <string_view>

#include "core/check.h"
#include "io/npz.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto a = aspen::io::parse_npz(std::string_view(reinterpret_cast<const char*>(data), size), "fuzz.npz");
  if (!a.is_ok()) {
    ASPEN_CHECK(!a.status().message().empty());
    return 0;
  }
  ASPEN_CHECK(!a->empty());
  for (const auto& [name, t] : *a)
    ASPEN_CHECK(t.nbytes() == size_t(t.numel()) * size_t(aspen::dtype_size(t.dtype()))) << name;
  return 0;
}
