#include "models/tensor_parallel.h"

#include <cstring>

namespace aspen::models {

namespace {

bool ends_with(const std::string& s, const char* suffix) {
  const size_t n = std::strlen(suffix);
  return s.size() >= n && s.compare(s.size() - n, n, suffix) == 0;
}

Shape with_dim(const Shape& s, int axis, int64_t v) {
  std::vector<int64_t> d(s.begin(), s.end());
  d[size_t(axis)] = v;
  return Shape::make(d.data(), int(d.size())).value();
}

// Copies columns [from, from + n) of every row of `src` ([rows, src_cols]) to
// columns [to, to + n) of `dst` ([rows, dst_cols]).
void copy_columns(const Tensor& src, int64_t src_cols, int64_t from, Tensor& dst, int64_t dst_cols, int64_t to,
                  int64_t n, int64_t rows) {
  const size_t e = dtype_size(src.dtype());
  for (int64_t r = 0; r < rows; ++r)
    std::memcpy(static_cast<char*>(dst.raw()) + (size_t(r * dst_cols + to)) * e,
                static_cast<const char*>(src.raw()) + (size_t(r * src_cols + from)) * e, size_t(n) * e);
}

}  // namespace

ShardKind gpt2_shard_kind(const std::string& name) {
  if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) return ShardKind::qkv_columns;
  if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias")) return ShardKind::columns;
  if (ends_with(name, "attn.c_proj.weight") || ends_with(name, "mlp.c_proj.weight")) return ShardKind::rows;
  return ShardKind::replicated;
}

Result<Tensor> shard_weight(const std::string& name, const Tensor& full, int rank, int shards) {
  if (shards < 1 || rank < 0 || rank >= shards)
    return Status::invalid_argument("tensor parallel: rank of '" + name + "'", "in [0, " + std::to_string(shards) + ")",
                                    std::to_string(rank));
  const ShardKind kind = gpt2_shard_kind(name);
  if (kind == ShardKind::replicated || shards == 1) return full.clone();
  const Shape& s = full.shape();
  const int64_t cols = s[-1], rows = full.numel() / cols;
  if (kind == ShardKind::rows) {
    if (s.rank() != 2 || s[0] % shards != 0)
      return Status::invalid_argument("tensor parallel: '" + name + "'", "rows divisible by " + std::to_string(shards),
                                      s.to_string());
    const int64_t n = s[0] / shards;
    Tensor out(full.dtype(), with_dim(s, 0, n));
    const size_t row = size_t(cols) * dtype_size(full.dtype());
    std::memcpy(out.raw(), static_cast<const char*>(full.raw()) + size_t(rank * n) * row, size_t(n) * row);
    return out;
  }
  const int64_t blocks = kind == ShardKind::qkv_columns ? 3 : 1;  // q | k | v each split
  if (cols % (blocks * shards) != 0)
    return Status::invalid_argument("tensor parallel: '" + name + "'",
                                    "a last dimension divisible by " + std::to_string(blocks * shards), s.to_string());
  const int64_t block = cols / blocks, n = block / shards;
  Tensor out(full.dtype(), with_dim(s, s.rank() - 1, blocks * n));
  for (int64_t k = 0; k < blocks; ++k) copy_columns(full, cols, k * block + rank * n, out, blocks * n, k * n, n, rows);
  return out;
}

Result<Tensor> gather_weight(const std::string& name, std::span<const Tensor* const> parts) {
  const int shards = int(parts.size());
  if (shards < 1) return Status::invalid_argument("tensor parallel: gather '" + name + "'", "at least one part", "none");
  const ShardKind kind = gpt2_shard_kind(name);
  const Tensor& first = *parts[0];
  if (kind == ShardKind::replicated || shards == 1) return first.clone();
  const Shape& s = first.shape();
  const int64_t cols = s[-1], rows = first.numel() / cols;
  if (kind == ShardKind::rows) {
    Tensor out(first.dtype(), with_dim(s, 0, s[0] * shards));
    for (int r = 0; r < shards; ++r)
      std::memcpy(static_cast<char*>(out.raw()) + size_t(r) * first.nbytes(), parts[size_t(r)]->raw(), first.nbytes());
    return out;
  }
  const int64_t blocks = kind == ShardKind::qkv_columns ? 3 : 1, n = cols / blocks, block = n * shards;
  Tensor out(first.dtype(), with_dim(s, s.rank() - 1, cols * shards));
  for (int r = 0; r < shards; ++r)
    for (int64_t k = 0; k < blocks; ++k)
      copy_columns(*parts[size_t(r)], cols, k * n, out, cols * shards, k * block + r * n, n, rows);
  return out;
}

}  // namespace aspen::models
