// core/shape.h: the dimensions of a dense, row-major tensor.
//
// A Shape is a short list of non-negative extents (rank <= kMaxRank). The last
// dimension is contiguous. Printing gives "[2, 3, 4]", the form every error
// message uses.
#pragma once

#include <array>
#include <cstdint>
#include <initializer_list>
#include <span>
#include <string>

#include "core/status.h"

namespace aspen {

class Shape {
 public:
  static constexpr int kMaxRank = 8;

  Shape() = default;  // rank 0: a scalar with one element
  Shape(std::initializer_list<int64_t> dims);
  // Validates rank and extents (user input goes through here).
  static Result<Shape> make(const int64_t* dims, int rank);

  int rank() const { return rank_; }
  int64_t operator[](int i) const;  // negative i counts from the back
  int64_t dim(int i) const { return (*this)[i]; }
  const int64_t* begin() const { return dims_.data(); }
  const int64_t* end() const { return dims_.data() + rank_; }
  int64_t numel() const;
  // Row-major stride of dimension i, in elements.
  int64_t stride(int i) const;

  bool operator==(const Shape& o) const;
  bool operator!=(const Shape& o) const { return !(*this == o); }
  std::string to_string() const;

 private:
  std::array<int64_t, kMaxRank> dims_{};
  int rank_ = 0;
};

// "[2, 3, 5]": a list of extents (or axes, strides, pads) as shapes print, for messages.
std::string dims_string(std::span<const int64_t> dims);

}  // namespace aspen
