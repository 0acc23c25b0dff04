#include "io/npy.h"

#include <cstring>
#include <vector>

#include "core/atomic_file.h"
#include "core/file.h"

namespace aspen::io {

namespace {

constexpr std::string_view kMagic("\x93NUMPY", 6);
constexpr size_t kMaxHeader = 1 << 16;

Status corrupt(const std::string& name, const std::string& what, const std::string& expected,
               const std::string& found) {
  return Status::error(Code::kCorrupt, name + ": " + what, expected, found);
}

// The value of 'key' in numpy's header dict: the text up to the next top-level comma or '}'.
Result<std::string> field(const std::string& name, std::string_view h, const char* key) {
  const std::string k = std::string("'") + key + "':";
  const size_t at = h.find(k);
  if (at == std::string_view::npos) return corrupt(name, "header", std::string("a '") + key + "' entry", "none");
  size_t i = at + k.size();
  while (i < h.size() && h[i] == ' ') ++i;
  const size_t start = i;
  int depth = 0;
  for (; i < h.size(); ++i) {
    if (h[i] == '(') ++depth;
    if (h[i] == ')') --depth;
    if (depth == 0 && (h[i] == ',' || h[i] == '}')) break;
  }
  if (depth != 0 || i >= h.size()) return corrupt(name, "header", "a well-formed dict", std::string(h));
  return std::string(h.substr(start, i - start));
}

}  // namespace

Result<Tensor> parse_npy(std::string_view b, const std::string& name) {
  if (b.size() < 10 || b.substr(0, 6) != kMagic)
    return corrupt(name, "file", "a .npy file (magic \\x93NUMPY)", std::to_string(b.size()) + " bytes without it");
  const int major = uint8_t(b[6]);
  size_t header_len = 0, offset = 0;
  if (major == 1) {
    header_len = uint8_t(b[8]) | (size_t(uint8_t(b[9])) << 8);
    offset = 10;
  } else if (major == 2 || major == 3) {
    if (b.size() < 12) return corrupt(name, "file", "a version 2 header length", "a short file");
    header_len = 0;
    for (int i = 3; i >= 0; --i) header_len = (header_len << 8) | uint8_t(b[8 + size_t(i)]);
    offset = 12;
  } else {
    return corrupt(name, "format version", "1, 2 or 3", std::to_string(major));
  }
  if (header_len > kMaxHeader || header_len > b.size() - offset)
    return corrupt(name, "header length",
                   "at most " + std::to_string(std::min(kMaxHeader, b.size() - offset)) + " bytes",
                   std::to_string(header_len));
  const std::string h(b.substr(offset, header_len));
  ASPEN_ASSIGN_OR_RETURN(const std::string descr, field(name, h, "descr"));
  ASPEN_ASSIGN_OR_RETURN(const std::string order, field(name, h, "fortran_order"));
  ASPEN_ASSIGN_OR_RETURN(const std::string shape_text, field(name, h, "shape"));
  DType dt;
  if (descr == "'<f4'" || descr == "'=f4'") {
    dt = DType::f32;
  } else if (descr == "'<f2'" || descr == "'=f2'") {
    dt = DType::f16;
  } else if (descr == "'<i4'" || descr == "'=i4'") {
    dt = DType::i32;
  } else if (descr == "'<i8'" || descr == "'=i8'") {
    dt = DType::i64;
  } else if (descr == "'|u1'") {
    dt = DType::u8;
  } else if (descr == "'|b1'") {
    dt = DType::boolean;
  } else {
    return Status::error(Code::kUnimplemented, name + ": dtype",
                         "one aspen reads ('<f4', '<f2', '<i4', '<i8', '|u1', '|b1')", descr,
                         descr == "'<f8'" ? "aspen has no float64: save the array as float32 (a.astype(np.float32))"
                                          : "");
  }
  if (order != "False") return Status::error(Code::kUnimplemented, name + ": fortran_order", "False (C order)", order);
  if (shape_text.size() < 2 || shape_text.front() != '(' || shape_text.back() != ')')
    return corrupt(name, "shape", "a tuple", shape_text);
  std::vector<int64_t> dims;
  const std::string inner = shape_text.substr(1, shape_text.size() - 2);
  size_t i = 0;
  while (i < inner.size()) {
    while (i < inner.size() && (inner[i] == ' ' || inner[i] == ',')) ++i;
    if (i >= inner.size()) break;
    size_t j = i;
    while (j < inner.size() && inner[j] >= '0' && inner[j] <= '9') ++j;
    if (j == i || j - i > 15) return corrupt(name, "shape", "non-negative integer extents", shape_text);
    dims.push_back(std::stoll(inner.substr(i, j - i)));
    i = j;
  }
  Result<Shape> s = Shape::make(dims.data(), int(dims.size()));
  if (!s.is_ok()) return corrupt(name, "shape", "rank at most 8", shape_text);
  const size_t data = offset + header_len;
  const uint64_t want = uint64_t(s->numel()) * uint64_t(dtype_size(dt));
  if (b.size() - data != want)
    return corrupt(name, "data", std::to_string(want) + " bytes (shape " + shape_text + ")",
                   std::to_string(b.size() - data) + " bytes");
  ASPEN_ASSIGN_OR_RETURN(Tensor t, Tensor::make(dt, *s));
  std::memcpy(t.raw(), b.data() + data, size_t(want));
  if (dt == DType::boolean) {
    uint8_t* p = static_cast<uint8_t*>(t.raw());
    for (int64_t k = 0; k < t.numel(); ++k)
      if (p[k] > 1) return corrupt(name, "data", "bools (bytes 0 or 1)", "byte " + std::to_string(p[k]));
  }
  return t;
}

Result<Tensor> read_npy(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(const std::string bytes, read_regular_file(path, kMaxBinaryFileBytes));
  return parse_npy(bytes, path);
}

std::string npy_bytes(const Tensor& t) {
  const char* descr = "<f4";
  switch (t.dtype()) {
    case DType::f16:
      descr = "<f2";
      break;
    case DType::i32:
      descr = "<i4";
      break;
    case DType::i64:
      descr = "<i8";
      break;
    case DType::u8:
      descr = "|u1";
      break;
    case DType::boolean:
      descr = "|b1";
      break;
    default:
      break;
  }
  std::string shape = "(";
  for (int i = 0; i < t.shape().rank(); ++i)
    shape += std::to_string(t.shape()[i]) + (t.shape().rank() == 1 ? "," : i + 1 < t.shape().rank() ? ", " : "");
  shape += ")";
  std::string header = std::string("{'descr': '") + descr + "', 'fortran_order': False, 'shape': " + shape + ", }";
  const bool v2 = header.size() + 11 > 65535;
  const size_t pre = v2 ? 12 : 10;
  header.append((64 - (pre + header.size() + 1) % 64) % 64, ' ');
  header += '\n';
  std::string out(kMagic);
  out += char(v2 ? 2 : 1);
  out += char(0);
  const size_t n = header.size();
  for (size_t i = 0; i < (v2 ? 4u : 2u); ++i) out += char((n >> (8 * i)) & 0xff);
  out += header;
  if (t.dtype() == DType::bf16) {
    std::vector<float> f(size_t(t.numel()));
    const uint16_t* p = static_cast<const uint16_t*>(t.raw());
    for (size_t i = 0; i < f.size(); ++i) {
      const uint32_t bits = uint32_t(p[i]) << 16;
      std::memcpy(&f[i], &bits, 4);
    }
    out.append(reinterpret_cast<const char*>(f.data()), f.size() * 4);
  } else {
    out.append(static_cast<const char*>(t.raw()), t.nbytes());
  }
  return out;
}

Status write_npy(const std::string& path, const Tensor& t) { return write_file_atomic(path, npy_bytes(t)); }

}  // namespace aspen::io
