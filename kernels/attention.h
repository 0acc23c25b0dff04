// kernels/attention.h: scaled dot-product attention, forward and backward,
// without materializing the [T, S] score matrix.
//
// Per batch b and head h, with q [T, D], k and v [S, D]:
//   s[i, j]  = scale * q[i] . k[j]           if the mask allows (i, j), else -inf
//   lse[i]   = log sum_j exp(s[i, j])        (natural log; -inf when no key is allowed)
//   p[i, j]  = exp(s[i, j] - lse[i])
//   out[i]   = sum_j p[i, j] v[j]            (0 when no key is allowed)
//
// Layout, all f32, row-major and contiguous:
//   q, out, dq, dout  [B, H, T, D]     k, v, dk, dv  [B, Hk, S, D]     lse  [B, H, T]
// Hk (the key/value heads) divides H: query head h reads kv head h / (H / Hk),
// so grouped-query (Hk < H) and multi-query (Hk = 1) attention need no copy of
// k and v per query head; dk and dv sum over the heads of each group.
//
// The fast path is FlashAttention-2 (Dao, 2023): blocks of queries against
// blocks of keys with an online softmax, parallel over (b, h, query block);
// blocks the mask removes entirely are skipped. The backward recomputes the
// probabilities blockwise from the saved lse. Results do not depend on the
// thread count (each output element is reduced by one thread in a fixed order).
#pragma once

#include <cstdint>
#include <span>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace aspen::kernels {

// Which keys a query may attend (xformers' attn_bias family). Query row i
// sits at absolute position pos = kv_offset + i, key j at position j
// (decoding with a KV cache: T new queries after kv_offset cached keys,
// usually S = kv_offset + T; xformers' "from bottom right" alignment is
// kv_offset = S - T, "top left" 0).
//   none:   every key
//   causal: j <= pos
//   local:  pos - window < j <= pos + window_right  (window_right 0: a causal
//           sliding window; > 0: keys ahead too, xformers' local attention)
// Two conditions apply on top of the kind:
//   key_valid, when non-empty, holds [B, S] flags (1 = attend, 0 = padding);
//   segments, when non-empty, holds [B, S] segment ids, non-decreasing along
//     each row (packed sequences, documents one after another: xformers'
//     BlockDiagonalMask from sequence lengths); query i attends only keys of
//     the segment of position pos (kv_offset + T <= S then). With causal or
//     local this is the block-diagonal causal (local) mask.
//   layout, when non-empty, is a block-sparse layout (DeepSpeed's and
//     xformers' sparsity layouts, kernels/attention_layout.h): [layout_heads,
//     ceil((kv_offset + T) / layout_block), ceil(S / layout_block)] flags,
//     layout_heads 1 (every head) or H; query i of head h may attend key j
//     only where layout[h][(kv_offset + i) / layout_block][j / layout_block]
//     is nonzero. With layout_query_positions and layout_key_positions
//     (both or neither; [B, T] and [B, S] i32; the forward only) the lookup
//     takes each row's own positions instead of kv_offset + i and j: a
//     generator's left-padded rows, whose cache slots are not positions.
//     The layout is then [layout_heads, layout_blocks, layout_blocks] (the
//     model's whole context), every position below layout_blocks *
//     layout_block; a negative position (padding) looks up block 0, and
//     key_valid is what keeps padding out.
// Each row's allowed keys form one range [lo, hi) before key_valid and the
// layout, so whole key blocks outside every row's range are skipped, and so
// are blocks the layout leaves empty: the work follows the visited blocks. A
// query with no allowed key gets out = 0, lse = -inf and zero gradients.
struct AttentionMask {
  enum class Kind { none, causal, local };
  Kind kind = Kind::none;
  int64_t window = 0;        // local only; >= 1
  int64_t window_right = 0;  // local only; >= 0
  int64_t kv_offset = 0;     // >= 0
  std::span<const uint8_t> key_valid = {};
  std::span<const int32_t> segments = {};
  std::span<const uint8_t> layout = {};
  int64_t layout_block = 0;  // >= 1 with a layout
  int64_t layout_heads = 1;  // 1 or H
  std::span<const int32_t> layout_query_positions = {}, layout_key_positions = {};  // see above
  int64_t layout_blocks = 0;  // with the positions: the layout's query and key blocks
  // ALiBi (Press et al., as BLOOM and MPT add it): H slopes; head h's score of
  // key j for query i gains slopes[h] * (j - (kv_offset + i)) after the scale
  // (scale must then be > 0). A fixed bias: no gradient flows to it.
  std::span<const float> alibi_slopes = {};
  // An additive bias on the scores, after the scale (xformers' tensor
  // attn_bias; T5's relative position bias gathered from its table):
  // [bias_batch, bias_heads, T, S], bias_batch 1 or B and bias_heads 1 or H
  // broadcast; scale must then be > 0. -inf entries mask their element (a
  // row of them gets out 0, lse -inf). attention_backward writes its gradient
  // to dbias when given one.
  std::span<const float> bias = {};
  int64_t bias_batch = 1, bias_heads = 1;
  // Dropout on the probabilities (training; 0 <= dropout < 1): element (b, h, i, j) of p enters out = p v
  // times attention_dropout_multiplier (1 / (1 - dropout) or 0, from Philox: deterministic, any thread
  // count); lse is the undropped softmax's. attention_backward regenerates the same elements from the
  // same seed and stream. Not with decoding's split-KV rows: such calls take the tiles.
  float dropout = 0.0f;
  uint64_t dropout_seed = 0, dropout_stream = 0;
  // A tensor shard's heads (Megatron): this call's head h is head dropout_head_offset + h of a model with
  // dropout_heads heads, so every shard draws the pattern the whole model would for its heads. 0: H, 0.
  int64_t dropout_heads = 0, dropout_head_offset = 0;
};

// Dropout's multiplier for element (b, h, i, j) of a call with H heads, T queries and S keys: 1 / (1 -
// mask.dropout) when element ((b H' + h') T + i) S + j of Philox stream dropout_stream under dropout_seed
// (H' = dropout_heads or H, h' = dropout_head_offset + h),
// as bits_to_unit_float (core/philox.h), is >= mask.dropout; else 0. 1 without dropout.
float attention_dropout_multiplier(const AttentionMask& mask, int64_t H, int64_t T, int64_t S, int64_t b, int64_t h,
                                   int64_t i, int64_t j);

// Query rows per (b, h) up to which the forward takes its decode rows (NOTE [attention decode rows];
// f32 only, split-KV over long caches) instead of blocks of rows.
inline constexpr int64_t kAttentionDecodeRows = 4;

// Writes out [B, H, T, D] and lse [B, H, T].
[[nodiscard]] Status attention_forward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                                       std::span<float> out, std::span<float> lse, int64_t B, int64_t H, int64_t Hk,
                                       int64_t T, int64_t S, int64_t D, float scale, const AttentionMask& mask = {});

// Gradients of a loss L given dout = dL/dout; overwrites dq, dk, dv. Needs the
// forward's out and lse. Differentiates, per (b, h):
//   s = scale * q k^T + bias (masked),  p = exp(s - lse),  out = p v
// as
//   dv = p^T dout,  dp = dout v^T,  ds = p * (dp - rowsum(dout * out)),
//   dq = scale * ds k,  dk = scale * ds^T q,  dbias = ds.
// dbias, when non-empty, is [B, H, T, S] (every element written; masked ones
// 0): the caller sums it over the dimensions mask.bias broadcasts. It needs
// mask.bias (a bias of zeros when only the gradient is wanted).
[[nodiscard]] Status attention_backward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                                        std::span<const float> out, std::span<const float> lse,
                                        std::span<const float> dout, std::span<float> dq, std::span<float> dk,
                                        std::span<float> dv, int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S,
                                        int64_t D, float scale, const AttentionMask& mask = {},
                                        std::span<float> dbias = {});

// bf16 q, k and v (a program compiled with compute = bf16, compiler/precision.cc): the two block products
// take bf16 operands with f32 accumulation (p rounded to bf16 for p v), the softmax runs in f32, and out and
// lse are f32, as a bf16 matmul's output is. The same masks, layouts and biases as the f32 kernel. On a CPU
// with AMX (NOTE [attention amx], kernels/attention_amx.cc) the products run in tiles; elsewhere, and in
// reference mode, q, k and v are widened to f32 and the f32 kernel runs (memory: their f32 copies).
[[nodiscard]] Status attention_forward(std::span<const bf16> q, std::span<const bf16> k, std::span<const bf16> v,
                                       std::span<float> out, std::span<float> lse, int64_t B, int64_t H, int64_t Hk,
                                       int64_t T, int64_t S, int64_t D, float scale, const AttentionMask& mask = {});

// The backward of the bf16 forward: q, k and v bf16, out, lse and dout f32, gradients f32; the products in
// bf16 (dout, p and ds rounded to bf16) with f32 accumulation, in AMX tiles where the CPU has them (NOTE
// [attention amx backward]), else the f32 backward on the widened values.
[[nodiscard]] Status attention_backward(std::span<const bf16> q, std::span<const bf16> k, std::span<const bf16> v,
                                        std::span<const float> out, std::span<const float> lse,
                                        std::span<const float> dout, std::span<float> dq, std::span<float> dk,
                                        std::span<float> dv, int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S,
                                        int64_t D, float scale, const AttentionMask& mask = {},
                                        std::span<float> dbias = {});

// The checks attention_forward and attention_backward make of the extents,
// the scale and the mask (errors name "attention"), for callers of ref::.
[[nodiscard]] Status check_attention_mask(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                                          float scale, const AttentionMask& mask);

// ALiBi's slopes for `heads` heads as MPT's gen_slopes makes them (BLOOM's
// too when heads is a power of two and bias_max 8): with n = heads rounded up
// to a power of two, m_k = 2^(-bias_max * k / n) for k = 1..n; when n >
// heads, the odd-indexed slopes first, then the even ones, cut to heads.
std::vector<float> alibi_slopes(int64_t heads, double bias_max = 8.0);

// Bytes of scratch attention_forward's fast path allocates for one call on a
// team of `threads` (its only memory beyond the arguments): per-thread tiles,
// and with more than one block of query rows (T > 64) the keys transposed
// once (B·Hk·S·D floats, S rounded up to 64). Decoding (T <= 4, no layout,
// ALiBi or bias) splits rows over more than 1024 keys into chunks of 1024
// (split-KV, so one long row keeps every thread busy): B·H·T·chunks·(D + 1)
// floats, nothing below. With mask.segments, both directions allocate 8·B·S
// bytes more (each key's segment bounds).
// With dtype bf16, the bf16 kernel's: on AMX the packed K and V (B·Hk·S·(D + D) bf16, S rounded up to 64
// and D to 32 and 16) and per-thread buffers; elsewhere f32 copies of q, k and v plus the f32 kernel's.
int64_t attention_forward_scratch_bytes(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                                        int threads, DType dtype = DType::f32);
// The same for attention_backward: per-thread tiles and one f32 per query row (B·H·T). With dtype bf16, on
// AMX: q and dout in bf16 and transposed (4·B·H·T·D bf16), K and V packed three ways (3·B·Hk·S·D bf16),
// dq's f32 accumulator (B·H·T·D), per-thread tiles; elsewhere f32 copies of q, k and v plus the f32 kernel's.
int64_t attention_backward_scratch_bytes(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                                         int threads, DType dtype = DType::f32);

namespace ref {
// F is float or double. The definition: for each (b, h), materializes the [T, S] scores, softmax,
// then a matmul. Scratch: one [T, S] matrix of F (reused across (b, h)). `bias`, when non-null, gives
// the bias's values in F (shaped by mask.bias_batch and mask.bias_heads) in place of mask.bias: the
// interpreter's f64 values, so that finite differences see no f32 rounding.
template <class F>
void attention_forward(const F* q, const F* k, const F* v, F* out, F* lse, int64_t B, int64_t H, int64_t Hk,
                       int64_t T, int64_t S, int64_t D, F scale, const AttentionMask& mask, const F* bias = nullptr);
// Materialized backward: recomputes p from q and k (it does not read out or
// lse), then dv = p^T dout, dp = dout v^T, ds = p * (dp - rowsum(p * dp)),
// dq = scale * ds k, dk = scale * ds^T q, and dbias [B, H, T, S] = ds when non-null.
template <class F>
void attention_backward(const F* q, const F* k, const F* v, const F* out, const F* lse, const F* dout, F* dq,
                        F* dk, F* dv, int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                        F scale, const AttentionMask& mask, F* dbias = nullptr, const F* bias = nullptr);
}  // namespace ref

}  // namespace aspen::kernels
