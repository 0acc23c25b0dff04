// parallel/reduce.h: the arithmetic every backend shares (internal to parallel/).
//
// Reductions add in f32 in the order the inputs are given, and round a bf16
// result once at the end; `divisor` (the group size for ReduceOp::mean, else
// 1) divides the f32 sum before that rounding. These loops decide the bits of
// every collective, so all backends call them rather than their own.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <span>

#include "core/dtype.h"

namespace aspen::parallel::detail {

// Chunk boundaries are multiples of this many elements (64 bytes of f32), so
// two owners never write one cache line.
inline constexpr int64_t kChunkAlign = 16;

struct Range {
  int64_t begin = 0, end = 0;
  int64_t size() const { return end - begin; }
};
// The elements owned by chunk i of n over `count`: near-equal shares with
// aligned boundaries; later chunks may be empty when count is small.
Range chunk_range(int64_t count, int n, int i);

inline void* at(void* p, DType t, int64_t i) { return static_cast<char*>(p) + i * dtype_size(t); }
inline const void* at(const void* p, DType t, int64_t i) { return static_cast<const char*>(p) + i * dtype_size(t); }

// out[i] = (((in[0][i] + in[1][i]) + in[2][i]) + ...) / divisor, as out_dtype.
// Inputs are in_dtype (f32 or bf16); out may alias any input (blocks are summed
// into a temporary before they are written).
void reduce_rows(std::span<const void* const> in, DType in_dtype, int64_t count, void* out, DType out_dtype,
                 float divisor);

// reduce_rows writing the same result to every buffer of `outs` (each may
// alias an input): one pass that reads each input once and writes each output
// once (the threads backend's all-reduce, each rank its own chunk).
void reduce_rows_to_all(std::span<const void* const> in, DType in_dtype, int64_t count, std::span<void* const> outs,
                        DType out_dtype, float divisor);

// out[i] = in[i] / divisor converted from in_dtype to out_dtype (f32 <-> bf16, rounding to nearest even).
void convert(const void* in, DType in_dtype, int64_t count, void* out, DType out_dtype, float divisor = 1.0f);

}  // namespace aspen::parallel::detail
