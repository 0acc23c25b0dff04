// fuzz/gguf_fuzz.cc: libFuzzer target for the GGUF reader.
//
// The input is a whole file. GgufFile::from_bytes runs the validation open() runs on a mapped file; any
// input must give a Status, and when it is ok every tensor it lists lies within the buffer, and small ones
// dequantize (or are a type aspen names as not read), and the tokenizer it holds loads or is refused by name.
#include <cstddef>
#include <cstdint>
#include <span>
#include <vector>

#include "core/check.h"
#include "io/gguf.h"
#include "io/tokenizer.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  using aspen::io::GgufFile;
  auto f = GgufFile::from_bytes({reinterpret_cast<const std::byte*>(data), size}, "fuzz");
  if (!f.is_ok()) {
    ASPEN_CHECK(!f.status().message().empty());
    return 0;
  }
  for (const aspen::io::GgufTensor& t : f->tensors()) {
    ASPEN_CHECK(f->find(t.name) == &t) << t.name;
    ASPEN_CHECK(f->data(t).size() == t.bytes) << t.name;
    if (t.numel() <= (1 << 16)) {
      auto r = f->read_f32(t.name);
      ASPEN_CHECK(r.is_ok() || r.status().code() == aspen::Code::kUnimplemented) << r.status().to_string();
    }
  }
  if (auto tok = aspen::io::load_gguf_tokenizer(*f); tok.is_ok()) {
    const std::vector<aspen::io::TokenId> ids = (*tok)->encode("Hello, fuzz <|endoftext|> 12");
    (void)(*tok)->decode(ids);
  } else {
    ASPEN_CHECK(!tok.status().message().empty());
  }
  return 0;
}
