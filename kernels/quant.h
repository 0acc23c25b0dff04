// kernels/quant.h: products with weights in ggml's Q8_0 and Q4_0 blocks (llama.cpp's 8- and 4-bit formats;
// io/gguf.h reads them from GGUF files), on int8 dot products: decode against quantized weights.
//
// A Q8_0 block is 32 values: an f16 scale d and 32 int8 q, value = d · q (34 bytes). For
//   y[m, n] = Σ_k x[m, k] · W[n, k]        W [N, K] in Q8_0 blocks, row n = K / 32 blocks, K % 32 == 0
// each row of x is first quantized to Q8_0 as ggml's reference does (quantize_row_q8_0: d = max|x| / 127,
// q = roundf(x · (1 / d)), d stored as f16), then, block by block in order,
//   acc = fma(float(Σ_j qw[j] · qx[j]), f32(dw) · f32(dx), acc)
// with the block's integer sum exact (int32) and the scale product and the accumulation rounded in f32 in
// that fixed order. So every ISA (the scalar reference, AVX2, AVX512-VNNI) gives the same bits, and so does
// every thread count (threads split the rows n). llama.cpp's own order of the float additions differs by ISA; its values
// differ from these by the f32 rounding of the sums only.
//
// Thread-safety: gemv_q8_0 runs on the calling thread's OpenMP team and touches only its arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string_view>

#include "core/status.h"

namespace aspen::kernels {

struct BlockQ8_0 {
  uint16_t d;      // f16 bits
  int8_t qs[32];
};
static_assert(sizeof(BlockQ8_0) == 34, "ggml's Q8_0 block is 34 bytes");

// ggml's Q4_0 block: 32 values d · (q - 8), q the low nibbles of qs (values 0..15) then the high ones (16..31).
struct BlockQ4_0 {
  uint16_t d;      // f16 bits
  uint8_t qs[16];
};
static_assert(sizeof(BlockQ4_0) == 18, "ggml's Q4_0 block is 18 bytes");

// ggml's Q4_K super-block: 256 values in 8 sub-blocks of 32, sub-block s's value (d · sc_s) · q - (dmin · m_s)
// with 6-bit sc_s, m_s packed in `scales` (ggml's get_scale_min_k4) and q the nibbles of qs (sub-blocks 2g and
// 2g + 1: the low and high nibbles of qs[32g .. 32g + 31]).
struct BlockQ4_K {
  uint16_t d, dmin;  // f16 bits
  uint8_t scales[12];
  uint8_t qs[128];
};
static_assert(sizeof(BlockQ4_K) == 144, "ggml's Q4_K block is 144 bytes");

// x [K] (K % 32 == 0) as K / 32 Q8_0 blocks, as ggml's quantize_row_q8_0_ref makes them.
void quantize_row_q8_0(const float* x, int64_t K, BlockQ8_0* out);

// y [M, N] (overwritten) = x [M, K] times W^T, W [N, K] in Q8_0 blocks. InvalidArgument naming the shape or
// buffer that does not fit (K % 32, spans too short).
[[nodiscard]] Status gemv_q8_0(std::span<const float> x, std::span<const BlockQ8_0> w, std::span<float> y, int64_t M,
                               int64_t N, int64_t K);

// Weights for gemv_q8_0_rows8: W's blocks regrouped so each group of 8 rows is one contiguous stream, for each
// block column b one chunk of the 8 rows' block b with their quants interleaved four bytes per row (NOTE
// [interleaved rows8] in quant.cc; rows past the last whole group follow as stored). The same bytes, made once
// when weights are loaded: the product then reads one stream per thread instead of 8 (8 strided streams read
// at half the bandwidth here) and sums 8 rows in the lanes of one vector.
void pack_q8_0_rows8(std::span<const BlockQ8_0> w, int64_t N, int64_t K, std::span<BlockQ8_0> out);
// gemv_q8_0 on packed weights: the same bits as gemv_q8_0 on W.
[[nodiscard]] Status gemv_q8_0_rows8(std::span<const float> x, std::span<const BlockQ8_0> packed, std::span<float> y,
                                     int64_t M, int64_t N, int64_t K);

// The same products with Q4_0 weights (the activations still Q8_0; the nibbles less 8 are the int8 weights).
[[nodiscard]] Status gemv_q4_0(std::span<const float> x, std::span<const BlockQ4_0> w, std::span<float> y, int64_t M,
                               int64_t N, int64_t K);
void pack_q4_0_rows8(std::span<const BlockQ4_0> w, int64_t N, int64_t K, std::span<BlockQ4_0> out);
[[nodiscard]] Status gemv_q4_0_rows8(std::span<const float> x, std::span<const BlockQ4_0> packed, std::span<float> y,
                                     int64_t M, int64_t N, int64_t K);

// Q4_K weights (K % 256 == 0), activations in Q8_0 (x's block 8B + s is sub-block s of super-block B): per
// sub-block, in order, acc = fma(float(Σ q · qx), (d · sc) · dx, acc), then acc = fma(float(-Σ qx), (dmin · m) · dx,
// acc), every product and sum as written, so the AVX2 path equals the reference bitwise.
[[nodiscard]] Status gemv_q4_k(std::span<const float> x, std::span<const BlockQ4_K> w, std::span<float> y, int64_t M,
                               int64_t N, int64_t K);
void pack_q4_k_rows8(std::span<const BlockQ4_K> w, int64_t N, int64_t K, std::span<BlockQ4_K> out);
[[nodiscard]] Status gemv_q4_k_rows8(std::span<const float> x, std::span<const BlockQ4_K> packed, std::span<float> y,
                                     int64_t M, int64_t N, int64_t K);

// One product of a group on packed weights (QuantFormat::gemv_rows8_group): w packed by pack_rows8 (N rows),
// y [M, N] overwritten.
struct QuantGroupCall {
  const uint8_t* w;
  float* y;
  int64_t N;
};

// One block format by its name ("q8_0", "q4_0", "q4_k": the graph's matmul_q attribute), with the products
// above on raw bytes (row n's blocks at w + n · row_bytes(K), or packed by pack_rows8): the table the graph and
// the model builders read instead of a switch over the formats each.
struct QuantFormat {
  const char* name;
  int64_t block_values, block_bytes;
  int64_t row_bytes(int64_t K) const { return K / block_values * block_bytes; }
  Status (*gemv)(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K);
  Status (*gemv_rows8)(const float* x, const uint8_t* packed, float* y, int64_t M, int64_t N, int64_t K);
  void (*pack_rows8)(const uint8_t* w, int64_t N, int64_t K, uint8_t* out);
  // Several products of one x on packed weights (a layer's q, k and v; NOTE [gemv groups]): x quantized once,
  // the groups of 8 rows of all of them cut among the team as one list; each y has gemv_rows8's bits. At most
  // 16 calls; InvalidArgument as gemv_rows8.
  Status (*gemv_rows8_group)(const float* x, const QuantGroupCall* calls, size_t count, int64_t M, int64_t K);
  void (*reference)(const float* x, const uint8_t* w, float* y, int64_t M, int64_t N, int64_t K);
};
// nullptr for another name.
const QuantFormat* quant_format(std::string_view name);

namespace ref {
// The scalar product of the file comment, row by row.
void gemv_q8_0(const float* x, const BlockQ8_0* w, float* y, int64_t M, int64_t N, int64_t K);
void gemv_q4_0(const float* x, const BlockQ4_0* w, float* y, int64_t M, int64_t N, int64_t K);
void gemv_q4_k(const float* x, const BlockQ4_K* w, float* y, int64_t M, int64_t N, int64_t K);
}  // namespace ref

}  // namespace aspen::kernels
