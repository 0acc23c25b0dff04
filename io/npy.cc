#include "io/npy.h"

#include <algorithm>
#include <cstring>
#include <map>
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

// numpy's header is a Python dict literal (numpy reads it with ast.literal_eval): string keys in either
// quote, whitespace anywhere between tokens, and values that are strings, True/False or tuples of
// integers. A bracketed value (a structured dtype's list) is kept as text so that it can be named.
struct HeaderValue {
  enum Kind { kString, kBool, kTuple, kOther } kind = kOther;
  std::string text;             // as written, for messages
  std::string str;              // kString
  bool flag = false;            // kBool
  std::vector<int64_t> ints;    // kTuple
};

class HeaderReader {
 public:
  HeaderReader(const std::string& name, std::string_view h) : name_(name), h_(h) {}

  Result<std::map<std::string, HeaderValue>> dict() {
    std::map<std::string, HeaderValue> out;
    skip();
    if (!eat('{')) return bad("a dict '{...}'");
    for (;;) {
      skip();
      if (eat('}')) break;
      std::string key;
      if (!string(key)) return bad("a quoted key");
      skip();
      if (!eat(':')) return bad("':' after " + quoted(key));
      skip();
      ASPEN_ASSIGN_OR_RETURN(out[key], value());
      skip();
      if (eat(',')) continue;
      if (eat('}')) break;
      return bad("',' or '}'");
    }
    skip();
    if (i_ != h_.size()) return bad("the header's end after the dict");
    return out;
  }

 private:
  static std::string quoted(const std::string& s) { return "'" + s + "'"; }
  Status bad(const std::string& expected) const {
    std::string rest(h_.substr(i_, 40));
    while (!rest.empty() && (rest.back() == ' ' || rest.back() == '\n')) rest.pop_back();
    return corrupt(name_, "header", expected + " at byte " + std::to_string(i_),
                   rest.empty() ? "its end" : "'" + rest + "'");
  }
  void skip() {
    while (i_ < h_.size() && (h_[i_] == ' ' || h_[i_] == '\t' || h_[i_] == '\n' || h_[i_] == '\r')) ++i_;
  }
  bool eat(char c) {
    if (i_ < h_.size() && h_[i_] == c) return ++i_, true;
    return false;
  }
  bool string(std::string& out) {
    if (i_ >= h_.size() || (h_[i_] != '\'' && h_[i_] != '"')) return false;
    const char q = h_[i_];
    const size_t end = h_.find(q, i_ + 1);
    if (end == std::string_view::npos) return false;
    out = std::string(h_.substr(i_ + 1, end - i_ - 1));
    i_ = end + 1;
    return true;
  }
  Result<HeaderValue> value() {
    HeaderValue v;
    const size_t from = i_;
    if (string(v.str)) {
      v.kind = HeaderValue::kString;
    } else if (h_.substr(i_, 4) == "True" || h_.substr(i_, 5) == "False") {
      v.kind = HeaderValue::kBool;
      v.flag = h_[i_] == 'T';
      i_ += v.flag ? 4 : 5;
    } else if (eat('(')) {
      v.kind = HeaderValue::kTuple;
      for (;;) {
        skip();
        if (eat(')')) break;
        int64_t n = 0;
        if (!integer(n)) return bad("a non-negative integer extent");
        v.ints.push_back(n);
        skip();
        if (eat(')')) break;
        if (!eat(',')) return bad("',' or ')' in the shape");
      }
    } else if (i_ < h_.size() && h_[i_] == '[') {
      int depth = 0;  // kept whole: only named in the dtype's error
      for (; i_ < h_.size(); ++i_) {
        depth += h_[i_] == '[' ? 1 : h_[i_] == ']' ? -1 : 0;
        if (depth == 0) break;
      }
      if (!eat(']')) return bad("a closing ']'");
    } else if (i_ < h_.size() && (h_[i_] == '-' || (h_[i_] >= '0' && h_[i_] <= '9'))) {
      while (i_ < h_.size() && h_[i_] != ',' && h_[i_] != '}' && h_[i_] != ' ') ++i_;  // named, never used
    } else {
      return bad("a string, True, False or a tuple");
    }
    v.text = std::string(h_.substr(from, i_ - from));
    return v;
  }
  // A decimal (or 0x hexadecimal) integer with an optional '+', below 2^53.
  bool integer(int64_t& n) {
    eat('+');
    int base = 10;
    if (h_.substr(i_, 2) == "0x" || h_.substr(i_, 2) == "0X") base = 16, i_ += 2;
    const size_t start = i_;
    n = 0;
    for (; i_ < h_.size(); ++i_) {
      const char c = h_[i_];
      const int d = c >= '0' && c <= '9' ? c - '0'
                    : base == 16 && c >= 'a' && c <= 'f' ? c - 'a' + 10
                    : base == 16 && c >= 'A' && c <= 'F' ? c - 'A' + 10
                                                         : -1;
      if (d < 0) break;
      if (n > (int64_t(1) << 53) / base) return false;
      n = n * base + d;
    }
    return i_ > start;
  }

  const std::string& name_;
  std::string_view h_;
  size_t i_ = 0;
};

// A numpy dtype string as np.dtype reads it ('<f4', 'f4', 'float32', '?', ...): aspen's dtype and
// whether the bytes are big-endian ('>'). False when aspen has no such dtype.
bool dtype_of(std::string s, DType& dt, bool& big) {
  big = false;
  if (!s.empty() && (s[0] == '<' || s[0] == '>' || s[0] == '=' || s[0] == '|')) {
    big = s[0] == '>';
    s = s.substr(1);
  }
  static const std::pair<const char*, DType> kNames[] = {
      {"f4", DType::f32},   {"f", DType::f32},    {"float32", DType::f32}, {"f2", DType::f16},
      {"e", DType::f16},    {"float16", DType::f16}, {"i4", DType::i32},   {"i", DType::i32},
      {"int32", DType::i32}, {"i8", DType::i64},  {"q", DType::i64},       {"l", DType::i64},
      {"int64", DType::i64}, {"u1", DType::u8},   {"B", DType::u8},        {"uint8", DType::u8},
      {"b1", DType::boolean}, {"?", DType::boolean}, {"bool", DType::boolean}};
  for (const auto& [n, d] : kNames)
    if (s == n) return dt = d, true;
  return false;
}

// Fortran order to C order: element (i0, .., ik) sits at sum i_j * (d0 * .. * d{j-1}) in `src`.
void fortran_to_c(const char* src, char* dst, const Shape& s, size_t elem) {
  const int rank = s.rank();
  std::vector<int64_t> idx(size_t(rank), 0), fstride(size_t(rank), 1);
  for (int j = 1; j < rank; ++j) fstride[size_t(j)] = fstride[size_t(j - 1)] * s[j - 1];
  const int64_t n = s.numel();
  for (int64_t c = 0; c < n; ++c) {
    int64_t f = 0;
    for (int j = 0; j < rank; ++j) f += idx[size_t(j)] * fstride[size_t(j)];
    std::memcpy(dst + size_t(c) * elem, src + size_t(f) * elem, elem);
    for (int j = rank - 1; j >= 0; --j) {  // the next C-order index
      if (++idx[size_t(j)] < s[j]) break;
      idx[size_t(j)] = 0;
    }
  }
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
  HeaderReader reader(name, b.substr(offset, header_len));
  ASPEN_ASSIGN_OR_RETURN(const auto dict, reader.dict());
  for (const char* key : {"descr", "fortran_order", "shape"})
    if (!dict.count(key)) return corrupt(name, "header", std::string("a '") + key + "' entry", "none");
  for (const auto& [key, v] : dict)
    if (key != "descr" && key != "fortran_order" && key != "shape")
      return corrupt(name, "header", "the keys 'descr', 'fortran_order' and 'shape' (numpy's)", "'" + key + "'");
  const HeaderValue& descr = dict.at("descr");
  const HeaderValue& order = dict.at("fortran_order");
  const HeaderValue& shape = dict.at("shape");
  DType dt = DType::f32;
  bool big = false;
  if (descr.kind != HeaderValue::kString || !dtype_of(descr.str, dt, big)) {
    const bool f8 = descr.kind == HeaderValue::kString && (descr.str == "<f8" || descr.str == "f8" ||
                                                           descr.str == "=f8" || descr.str == "float64");
    return Status::error(Code::kUnimplemented, name + ": dtype",
                         "one aspen reads (float32, float16, int32, int64, uint8 or bool, as '<f4', '<f2', '<i4', "
                         "'<i8', '|u1', '|b1')",
                         descr.kind == HeaderValue::kOther ? "a structured dtype " + descr.text : descr.text,
                         f8 ? "aspen has no float64: save the array as float32 (a.astype(np.float32))" : "");
  }
  if (order.kind != HeaderValue::kBool)
    return corrupt(name, "fortran_order", "True or False", order.text);
  if (shape.kind != HeaderValue::kTuple) return corrupt(name, "shape", "a tuple", shape.text);
  Result<Shape> s = Shape::make(shape.ints.data(), int(shape.ints.size()));
  if (!s.is_ok()) return corrupt(name, "shape", "rank at most 8", shape.text);
  const size_t data = offset + header_len;
  const size_t elem = dtype_size(dt);
  uint64_t want = elem;
  for (int64_t d : shape.ints) {  // the product checked as it grows: no extent's product may wrap
    if (d != 0 && want > (uint64_t(1) << 62) / uint64_t(d))
      return corrupt(name, "shape", "at most 2^62 bytes of data", shape.text);
    want *= uint64_t(d);
  }
  if (b.size() - data != want)
    return corrupt(name, "data", std::to_string(want) + " bytes (shape " + shape.text + ")",
                   std::to_string(b.size() - data) + " bytes");
  ASPEN_ASSIGN_OR_RETURN(Tensor t, Tensor::make(dt, *s));
  if (order.flag && s->rank() > 1)
    fortran_to_c(b.data() + data, static_cast<char*>(t.raw()), *s, elem);
  else
    std::memcpy(t.raw(), b.data() + data, size_t(want));
  if (big && elem > 1) {  // numpy writes '>' only when asked; this machine is little-endian
    char* p = static_cast<char*>(t.raw());
    for (size_t k = 0; k < size_t(want); k += elem) std::reverse(p + k, p + k + elem);
  }
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
