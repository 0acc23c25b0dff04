// io/safetensors.h: reading and writing safetensors checkpoints.
//
// A safetensors file is: an 8-byte little-endian u64 N, then N bytes of UTF-8
// JSON mapping tensor names to {"dtype", "shape", "data_offsets": [begin, end]}
// (offsets relative to the first byte after the header) plus an optional
// "__metadata__" object of string -> string, then the data.
//
// SafetensorsFile memory-maps a file read-only and validates the whole header
// before open() returns, so every accessor afterwards is safe: each tensor's
// byte range lies inside the file and matches its dtype and shape, and no two
// ranges overlap. Every error names the file and, where there is one, the tensor.
// from_bytes() runs the same validation over a copy of bytes in memory (tests,
// fuzzing, files fetched over the network).
//
// SafetensorsIndex reads a sharded checkpoint through its
// model.safetensors.index.json. write_safetensors writes a file atomically
// (temp file in the same directory, fsync, rename), laid out as Hugging Face
// does: header padded with spaces to a multiple of 8, data contiguous from 0.
//
// Thread-safety: an opened file or index is immutable; const methods may be
// called from many threads at once.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "core/checksum.h"
#include "core/dtype.h"
#include "core/file.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/tensor.h"

namespace aspen::io {

struct TensorInfo {
  std::string name;
  DType dtype = DType::f32;
  Shape shape;
  size_t offset = 0;  // from the start of the data section
  size_t bytes = 0;
};

class SafetensorsFile {
 public:
  // Maps `path` and validates it; a failed Status names the file and the tensor.
  static Result<SafetensorsFile> open(const std::string& path);
  // Copies `bytes` and validates them exactly as open() validates a file;
  // `name` stands in for the path in errors and path().
  static Result<SafetensorsFile> from_bytes(std::span<const std::byte> bytes, const std::string& name = "<memory>");

  SafetensorsFile(SafetensorsFile&&) noexcept = default;  // the bytes stay where they are (FileBytes)
  SafetensorsFile& operator=(SafetensorsFile&&) noexcept = default;

  const std::string& path() const { return path_; }
  // Tensor names, sorted.
  std::vector<std::string> names() const;
  size_t size() const { return tensors_.size(); }
  // nullptr when there is no tensor of that name.
  const TensorInfo* find(const std::string& name) const;
  // The tensor's bytes inside the mapping (valid while this object lives).
  std::span<const std::byte> data(const TensorInfo& info) const;
  // A copy of the tensor (its pages then dropped from resident memory: NOTE [pages read once],
  // core/file.h); NotFound naming the tensor and the file.
  Result<Tensor> read(const std::string& name) const;
  // The tensor's pages, or the whole file's, dropped from resident memory once read (NOTE [pages read once]).
  void release(const TensorInfo& info) const { file_.release(data(info)); }
  void release(std::span<const std::byte> part_of_data) const { file_.release(part_of_data); }
  void release_all() const { file_.release(file_.bytes()); }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  // The whole file as mapped (or as from_bytes copied it): a checksum over exactly the bytes read.
  std::span<const std::byte> file_bytes() const { return file_.bytes(); }

 private:
  SafetensorsFile() = default;
  // Validates the whole file (file_) and fills data_, tensors_ and metadata_; shared by open() and
  // from_bytes().
  Status parse();

  std::string path_;
  FileBytes file_;  // open(): the mapping; from_bytes(): the copy
  const std::byte* data_ = nullptr;  // first byte after the header
  size_t data_size_ = 0;
  std::map<std::string, TensorInfo> tensors_;
  std::map<std::string, std::string> metadata_;
};

class SafetensorsIndex {
 public:
  // Reads the index JSON, opens each shard (relative to the index's
  // directory) once and checks each mapped tensor exists in its shard.
  static Result<SafetensorsIndex> open(const std::string& index_path);

  const std::string& path() const { return path_; }
  std::vector<std::string> names() const;  // sorted
  // (shard, tensor) or (nullptr, nullptr) when the name is not in the index.
  std::pair<const SafetensorsFile*, const TensorInfo*> find(const std::string& name) const;
  Result<Tensor> read(const std::string& name) const;
  // The index's "metadata"; non-string values (e.g. total_size) as their JSON text.
  const std::map<std::string, std::string>& metadata() const { return metadata_; }
  size_t num_shards() const { return shards_.size(); }

 private:
  SafetensorsIndex() = default;

  std::string path_;
  std::vector<std::unique_ptr<SafetensorsFile>> shards_;  // stable addresses
  std::map<std::string, size_t> shard_of_;                // tensor name -> index into shards_
  std::map<std::string, std::string> metadata_;
};

// Writes `tensors` (names unique, sorted in the header, data in that order) and
// `metadata` to `path` atomically. Duplicate or reserved names and null tensors
// are InvalidArgument; OS failures are IoError naming the path and strerror.
// When `digest` is given it receives the size and CRC-32C of the bytes written
// (computed from memory, so nothing is read back).
Status write_safetensors(const std::string& path,
                         const std::vector<std::pair<std::string, const Tensor*>>& tensors,
                         const std::map<std::string, std::string>& metadata = {}, FileDigest* digest = nullptr);

}  // namespace aspen::io
