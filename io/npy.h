// io/npy.h: NumPy's .npy files (format versions 1.0, 2.0 and 3.0) as tensors.
//
// read_npy accepts what np.load reads, of a dtype aspen has: '<f4' (f32), '<f2' (f16), '<i4' (i32),
// '<i8' (i64), '|u1' (u8), '|b1' (bool), with np.dtype's aliases ('f4', 'float32', '?', ...), any byte
// order ('>' is swapped) and C or Fortran order (Fortran is copied into C order). The header is
// bounded and parsed as the Python literal numpy reads (a dict of exactly 'descr', 'fortran_order' and
// 'shape'), and the data must be exactly what the shape needs. Every error names the file. write_npy writes version 1.0
// (2.0 when the header needs it) atomically.
#pragma once

#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"

namespace aspen::io {

Result<Tensor> read_npy(const std::string& path);
// The same parsing over bytes in memory; `name` stands in for the path in errors.
Result<Tensor> parse_npy(std::string_view bytes, const std::string& name);
// bf16 has no numpy dtype: a bf16 tensor is written as '<f4' (its values, exactly).
[[nodiscard]] Status write_npy(const std::string& path, const Tensor& t);
std::string npy_bytes(const Tensor& t);

}  // namespace aspen::io
