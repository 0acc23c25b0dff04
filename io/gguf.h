// io/gguf.h: llama.cpp's GGUF files (format versions 2 and 3): metadata, tensor descriptions, and tensor
// values, quantized blocks dequantized exactly as ggml dequantizes them.
//
// A GGUF file is, little-endian: the magic "GGUF", u32 version, u64 tensor count, u64 metadata count; the
// metadata (a string key, a u32 value type, the value: integers of 8 to 64 bits, f32, f64, bool, strings
// (u64 length + bytes) and arrays of one of these); the tensor descriptions (name, u32 rank, u64 extents
// innermost first, u32 ggml type, u64 offset into the data section); then, at the next multiple of
// `general.alignment` (32 when absent), the data section.
//
// GgufFile memory-maps a file read-only and validates everything before open() returns: the header, every
// value's bounds, each tensor's extents (each >= 1, the innermost a whole number of its type's blocks) and
// bytes (inside the data section, at an aligned offset, not overlapping another). Every error is Corrupt (or
// Unimplemented for a valid type aspen does not read) naming the file, and the key or tensor.
//
// read_f32() gives a tensor's values as f32 in torch's order (extents reversed: a [rows, columns] weight is
// GGUF's [columns, rows]): F32 as stored, F16 and BF16 widened, and the block formats dequantized as ggml's
// reference (ggml-quants.c) does, value for value (tested against the `gguf` package's dequantization):
//   Q8_0 (32 values, 34 bytes): f16 d, 32 x i8 q            -> d * q
//   Q4_0 (32 values, 18 bytes): f16 d, 16 bytes of nibbles  -> d * (q - 8), low nibbles first, then high
//   Q4_K (256 values, 144 bytes): f16 d, f16 dmin, 12 bytes of 6-bit scales and mins, 128 bytes of nibbles
//        -> 8 sub-blocks of 32: (d * sc) * q - (dmin * m)
//
// Thread-safety: an opened file is immutable; const methods may be called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <span>
#include <string>
#include <vector>

#include "core/file.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/tensor.h"

namespace aspen::io {

// ggml's tensor types (the ones aspen reads, and the others by number for error messages).
enum class GgmlType : uint32_t {
  f32 = 0, f16 = 1, q4_0 = 2, q4_1 = 3, q5_0 = 6, q5_1 = 7, q8_0 = 8, q8_1 = 9, q2_k = 10, q3_k = 11,
  q4_k = 12, q5_k = 13, q6_k = 14, q8_k = 15, bf16 = 30,
};
// "F32", "Q4_K", ... ("type 17" for a number without a name here).
std::string ggml_type_name(uint32_t type);

struct GgufValue {
  enum class Kind { integer, unsigned_integer, real, boolean, string, array };
  Kind kind = Kind::integer;
  uint32_t type = 0;  // GGUF's value type (0 .. 12)
  int64_t i = 0;      // integer
  uint64_t u = 0;     // unsigned_integer
  double f = 0.0;     // real
  bool b = false;
  std::string s;
  std::vector<GgufValue> items;  // array
};

struct GgufTensor {
  std::string name;
  std::vector<int64_t> extents;  // GGUF's order: extents[0] is the innermost (a row's length)
  uint32_t type = 0;             // ggml type
  uint64_t offset = 0;           // from the start of the data section
  uint64_t bytes = 0;
  Shape shape() const;           // torch's order: the extents reversed
  int64_t numel() const;
};

class GgufFile {
 public:
  static Result<GgufFile> open(const std::string& path);
  // The same validation over a copy of `bytes`; `name` stands in for the path in errors.
  static Result<GgufFile> from_bytes(std::span<const std::byte> bytes, const std::string& name = "<memory>");

  GgufFile(GgufFile&&) noexcept = default;  // the bytes stay where they are (FileBytes)
  GgufFile& operator=(GgufFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  uint32_t version() const { return version_; }
  const std::map<std::string, GgufValue>& metadata() const { return metadata_; }
  const GgufValue* find_metadata(const std::string& key) const;
  const std::vector<GgufTensor>& tensors() const { return tensors_; }  // in the file's order
  const GgufTensor* find(const std::string& name) const;
  std::span<const std::byte> data(const GgufTensor& t) const;
  // Its pages dropped from resident memory once copied elsewhere (NOTE [pages read once], core/file.h).
  void release(const GgufTensor& t) const { file_.release(data(t)); }
  // The tensor's values as f32 (see the file comment); NotFound naming the tensor, Unimplemented naming a
  // type aspen does not dequantize.
  Result<Tensor> read_f32(const std::string& name) const;

 private:
  GgufFile() = default;
  Status parse();  // validates file_ and fills the rest

  std::string path_;
  FileBytes file_;  // open(): the mapping; from_bytes(): the copy
  uint64_t data_start_ = 0;
  uint32_t version_ = 0;
  std::map<std::string, GgufValue> metadata_;
  std::vector<GgufTensor> tensors_;
  std::map<std::string, size_t> index_;
};

// ggml's dequantization of `n` values (a multiple of the type's block) from `blocks` into `out`; the block
// types Q8_0, Q4_0 and Q4_K, and F32, F16, BF16. InvalidArgument for another type or a bad count.
[[nodiscard]] Status dequantize_ggml(uint32_t type, std::span<const std::byte> blocks, int64_t n, float* out);
// Values per block and bytes per block of a ggml type (1 and the element size for the plain ones); {0, 0}
// for a type without a known layout.
std::pair<int64_t, int64_t> ggml_block_layout(uint32_t type);

}  // namespace aspen::io
