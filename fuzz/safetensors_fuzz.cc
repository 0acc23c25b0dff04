// fuzz/safetensors_fuzz.cc: libFuzzer target for the safetensors reader.
//
// The input is a whole file. SafetensorsFile::from_bytes runs the validation
// open() runs on a mapped file; any input must give a Status, and when it is
// ok every tensor it lists must be readable within the buffer.
#include <cstddef>
#include <cstdint>
#include <span>

#include "core/check.h"
#include "io/safetensors.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using aspen::io::SafetensorsFile;
  auto f = SafetensorsFile::from_bytes({reinterpret_cast<const std::byte*>(data), size}, "fuzz");
  if (!f.is_ok()) {
    ASPEN_CHECK(!f.status().message().empty());
    return 0;
  }
  for (const std::string& name : f->names()) {
    const aspen::io::TensorInfo* info = f->find(name);
    ASPEN_CHECK(info != nullptr) << name;
    ASPEN_CHECK(f->data(*info).size() == info->bytes) << name;
    // A copy of small tensors exercises read(); big ones would only cost time.
    if (info->bytes <= (1 << 16)) ASPEN_CHECK(f->read(name).is_ok()) << name;
  }
  return 0;
}
