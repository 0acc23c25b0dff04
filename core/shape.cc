#include "core/shape.h"

#include "core/check.h"

namespace aspen {

Shape::Shape(std::initializer_list<int64_t> dims) {
  ASPEN_CHECK(int(dims.size()) <= kMaxRank) << "rank " << dims.size();
  for (int64_t d : dims) {
    ASPEN_CHECK(d >= 0) << "negative extent " << d;
    dims_[rank_++] = d;
  }
}

Result<Shape> Shape::make(const int64_t* dims, int rank) {
  if (rank < 0 || rank > kMaxRank)
    return Status::invalid_argument("shape", "rank 0.." + std::to_string(kMaxRank), "rank " + std::to_string(rank));
  Shape s;
  for (int i = 0; i < rank; ++i) {
    if (dims[i] < 0)
      return Status::invalid_argument("shape", "non-negative extents",
                                      "extent " + std::to_string(dims[i]) + " at dimension " + std::to_string(i));
    s.dims_[i] = dims[i];
  }
  s.rank_ = rank;
  // The product of the non-zero extents must fit too: strides are computed from them.
  int64_t product = 1;
  bool overflow = false;
  for (int i = 0; i < rank; ++i)
    if (dims[i] != 0) overflow = overflow || __builtin_mul_overflow(product, dims[i], &product);
  if (overflow)
    return Status::invalid_argument("shape", "an element count that fits in 63 bits", "an overflow");
  return s;
}

int64_t Shape::operator[](int i) const {
  if (i < 0) i += rank_;
  ASPEN_CHECK(i >= 0 && i < rank_) << "dimension " << i << " of " << to_string();
  return dims_[i];
}

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int i = 0; i < rank_; ++i) {
    if (__builtin_mul_overflow(n, dims_[i], &n)) return -1;
  }
  return n;
}

int64_t Shape::stride(int i) const {
  if (i < 0) i += rank_;
  ASPEN_CHECK(i >= 0 && i < rank_);
  int64_t s = 1;
  for (int j = rank_ - 1; j > i; --j) s *= dims_[j];
  return s;
}

bool Shape::operator==(const Shape& o) const {
  if (rank_ != o.rank_) return false;
  for (int i = 0; i < rank_; ++i)
    if (dims_[i] != o.dims_[i]) return false;
  return true;
}

std::string Shape::to_string() const { return dims_string({begin(), end()}); }

std::string dims_string(std::span<const int64_t> dims) {
  std::string s = "[";
  for (size_t i = 0; i < dims.size(); ++i) s += (i ? ", " : "") + std::to_string(dims[i]);
  return s + "]";
}

}  // namespace aspen
