// kernels/attention.cc: the attention drivers (FlashAttention-2 forward and backward, decode rows), the
// portable block operations, the argument checks and the entry points. The AVX2 and AVX-512 operations are
// in attention_avx2.cc and attention_avx512.cc, what the files share in attention_internal.h.
#include "kernels/attention.h"

#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <initializer_list>
#include <limits>
#include <string>
#include <tuple>
#include <vector>

#include "core/tensor.h"
#include "kernels/attention_avx2.h"
#include "kernels/attention_avx512.h"
#include "kernels/attention_internal.h"
#include "kernels/check_args.h"
#include "kernels/convert.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

namespace {

using namespace attn;  // NOLINT(google-build-using-namespace): the files of one kernel

struct Portable {
  static bool fused_tile(const float*, const float*, const float*, int64_t, int64_t, int64_t, const int*, const int*,
                         const float*, float*, float*, float*) {
    return false;  // NOTE [attention fused strips]: AVX-512 only
  }
  // Four rows of C per pass over B, sharing each load of B.
  static void gemm(const float* a, int64_t ars, int64_t aks, const float* b, int64_t ldb, float* c, int64_t ldc,
                   int64_t m, int64_t n, int64_t kk, bool accumulate) {
    int64_t i = 0;
    for (; i + 4 <= m; i += 4) {
      float *c0 = c + i * ldc, *c1 = c0 + ldc, *c2 = c1 + ldc, *c3 = c2 + ldc;
      if (!accumulate)
        for (int64_t j = 0; j < n; ++j) c0[j] = c1[j] = c2[j] = c3[j] = 0.0f;
      for (int64_t k = 0; k < kk; ++k) {
        const float* ak = a + i * ars + k * aks;
        const float a0 = ak[0], a1 = ak[ars], a2 = ak[2 * ars], a3 = ak[3 * ars];
        const float* bk = b + k * ldb;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) {
          c0[j] += a0 * bk[j];
          c1[j] += a1 * bk[j];
          c2[j] += a2 * bk[j];
          c3[j] += a3 * bk[j];
        }
      }
    }
    for (; i < m; ++i) {
      float* c0 = c + i * ldc;
      if (!accumulate) std::fill(c0, c0 + n, 0.0f);
      for (int64_t k = 0; k < kk; ++k) {
        const float a0 = a[i * ars + k * aks];
        const float* bk = b + k * ldb;
#pragma omp simd
        for (int64_t j = 0; j < n; ++j) c0[j] += a0 * bk[j];
      }
    }
  }

  static void transpose(const float* src, int64_t cols, int64_t D, float* dst) { transpose_impl(src, cols, D, dst); }

  static void softmax_tile(float* s, int64_t rows, int64_t cols, const int* lo, const int* hi, const float* kv,
                           float* m, float* l, float* o, int64_t D, bool /*partial*/) {
    softmax_tile_impl(s, rows, cols, lo, hi, kv, m, l, o, D);
  }
  static void decode_row(const float* q, const float* kh, const float* vh, int64_t lo, int64_t hi,
                         const uint8_t* valid, int64_t D, float cs, float* out, float* lse) {
    decode_row_impl(q, kh, vh, lo, hi, valid, D, cs, out, lse);
  }
  static void grad_tile(float* s, float* dp, int64_t rows, int64_t cols, const int* lo, const int* hi,
                        const float* kv, const float* lse2, const float* di, float cs) {
    grad_tile_impl(s, dp, rows, cols, lo, hi, kv, lse2, di, cs);
  }
};

// ---------------------------------------------------------------------------
// Drivers, shared by the ISAs.

// n floats, zeroed, as a tensor: its block comes from the tensor block cache when one of the size was freed.
Tensor scratch_tensor(int64_t n) { return Tensor(DType::f32, Shape{std::max<int64_t>(n, 1)}); }

int64_t forward_scratch_floats(int64_t D) { return 2 * kQuerySpan * D + D * kBk + 2 * kBq * kBk + 2 * kQuerySpan + kBk; }

// NOTE [attention decode rows]: each (b, h, row) is one task on its own.
template <class Ops>
void forward_decode(const Problem& pb, float* out, float* lse) {
  const int64_t D = pb.D, T = pb.T, S = pb.S, rows = pb.B * pb.H * T;
  const float cs = pb.scale * kLog2e;
  // NOTE [attention split-KV decoding]: a row over more than kDecodeChunk keys is cut into chunks of
  // absolute key positions [c * kDecodeChunk, (c + 1) * kDecodeChunk), each a task of its own (out_c, lse_c),
  // then combined per row in chunk order: lse = log sum_c e^lse_c, out = sum_c e^(lse_c - lse) out_c. The
  // chunks follow S alone, so the bits do not depend on the thread count.
  const int64_t chunks = decode_chunks(S);
  std::vector<float> part(chunks > 1 ? size_t(rows * chunks * (D + 1)) : 0);
  // NOTE [attention decode rows]: a KV cache is sized for the longest generation, and key_valid marks what is
  // written so far. Each batch row's keys past its last valid one are masked anyway: its range stops there, so
  // they are not read (generation with the default cache of n_positions read all of it every step; a step at
  // position 300 of 1024 spent 12 % of its time on masked keys). The same bits: a masked key adds nothing.
  std::vector<int64_t> valid_end;
  if (pb.key_valid) {
    valid_end.assign(size_t(pb.B), 0);
    for (int64_t b = 0; b < pb.B; ++b) {
      int64_t e = S;
      while (e > 0 && pb.key_valid[b * S + e - 1] == 0) --e;
      valid_end[size_t(b)] = e;
    }
  }
  const int64_t tasks = rows * chunks;
  const int nt = int(std::min<int64_t>(omp_get_max_threads(), tasks));
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t t = 0; t < tasks; ++t) {
    const int64_t row = t / chunks, c = t % chunks;
    const int64_t bh = row / T, i = row % T, b = bh / pb.H, kvh = pb.kv_head(bh);
    int64_t lo, hi;
    pb.geo.range(b, i, &lo, &hi);
    if (!valid_end.empty()) hi = std::min(hi, valid_end[size_t(b)]);
    if (chunks > 1) {
      lo = std::max(lo, c * kDecodeChunk);
      hi = std::min(hi, (c + 1) * kDecodeChunk);
    }
    float* o = chunks > 1 ? part.data() + t * (D + 1) : out + row * D;
    float* l = chunks > 1 ? o + D : lse + row;
    Ops::decode_row(pb.q + row * D, pb.k + kvh * S * D, pb.v + kvh * S * D, lo, std::max(lo, hi),
                    pb.key_valid ? pb.key_valid + b * S : nullptr, D, cs, o, l);
  }
  if (chunks == 1) return;
#pragma omp parallel for schedule(static) num_threads(int(std::min<int64_t>(omp_get_max_threads(), rows)))
  for (int64_t row = 0; row < rows; ++row) {
    const float* pr = part.data() + row * chunks * (D + 1);
    float m = kNegInf;
    for (int64_t c = 0; c < chunks; ++c) m = std::max(m, pr[c * (D + 1) + D]);
    float* o = out + row * D;
    std::fill_n(o, D, 0.0f);
    if (m == kNegInf) {  // no allowed key in any chunk
      lse[row] = kNegInf;
      continue;
    }
    float sum = 0.0f;
    for (int64_t c = 0; c < chunks; ++c) {
      const float lc = pr[c * (D + 1) + D];
      if (lc == kNegInf) continue;
      const float w = std::exp(lc - m);
      sum += w;
      for (int64_t d = 0; d < D; ++d) o[d] += w * pr[c * (D + 1) + d];
    }
    const float inv = 1.0f / sum;
    for (int64_t d = 0; d < D; ++d) o[d] *= inv;
    lse[row] = m + std::log(sum);
  }
}

// FlashAttention-2 forward. Per (b, h, query block): scores for one key block
// at a time, s = (q * scale * log2 e) k^T in the exp2 domain; running max m and
// sum l per row; o = o * 2^(m_old - m_new) + p v; at the end out = o / l and
// lse = (m + log2 l) ln 2.
template <class Ops>
void forward_fast(const Problem& pb, float* out, float* lse) {
  const int64_t D = pb.D, T = pb.T, S = pb.S;
  const int nt = omp_get_max_threads();
  const int64_t per = forward_scratch_floats(D);
  // Buffers as zeroed tensors: from the tensor block cache on the next call of the same size (NOTE [tensor
  // block cache]; a vector faulted its pages in again every call).
  Tensor scratch_t = scratch_tensor(per * nt);
  float* const scratch = scratch_t.data<float>();
  const int64_t nqb = (T + kBq - 1) / kBq;
  const int64_t span_blocks = query_span_blocks(pb.B * pb.H, nqb, nt);  // NOTE [attention query spans]
  const int64_t nspan = (nqb + span_blocks - 1) / span_blocks, tasks = pb.B * pb.H * nspan;
  const float cs = pb.scale * kLog2e;
  // NOTE [attention keys transposed once]: with several query blocks per head, every block would transpose
  // the same key blocks again; each key block's K^T [D, kBk] is made once, blocks one after another
  // ([B, Hk, S / kBk, D, kBk]: a tile reads its block contiguously, as it would its own copy; a [D, S] layout
  // strides rows by S floats, which alias in L1 when S is a multiple of 1024). The size of k, rounded up.
  const bool once = nqb > 1;
  const int64_t nkb = (S + kBk - 1) / kBk;
  Tensor k_t_t = scratch_tensor(once ? pb.B * pb.Hk * nkb * D * kBk : 0);
  float* const k_t = k_t_t.data<float>();
  if (once) {
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t u = 0; u < pb.B * pb.Hk * nkb; ++u) {
      const int64_t kvh = u / nkb, j0 = (u % nkb) * kBk;
      Ops::transpose(pb.k + (kvh * S + j0) * D, std::min(kBk, S - j0), D, k_t + u * D * kBk);
    }
  }
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t t = 0; t < tasks; ++t) {
    float* qs = scratch + per * omp_get_thread_num();
    float* o = qs + kQuerySpan * D;
    float* kt = o + kQuerySpan * D;
    float* s = kt + D * kBk;
    float* m = s + kBq * kBk;
    float* l = m + kQuerySpan;
    float* kv = l + kQuerySpan;
    float* z = kv + kBk;  // dropout's multipliers
    int lo[kBq], hi[kBq];
    int64_t sub_first[kSpanBlocks] = {}, sub_last[kSpanBlocks] = {};
    // NOTE [attention query spans]: the spans that visit the most key blocks (causal: the last) go first.
    const int64_t bh = t % (pb.B * pb.H), span = nspan - 1 - t / (pb.B * pb.H), b = bh / pb.H;
    const int64_t i_begin = span * span_blocks * kBq, n = std::min(span_blocks * kBq, T - i_begin);
    const float* kh = pb.k + pb.kv_head(bh) * S * D;
    const float* vh = pb.v + pb.kv_head(bh) * S * D;
    const float* qb = pb.q + (bh * T + i_begin) * D;
    for (int64_t x = 0; x < n * D; ++x) {
      qs[x] = qb[x] * cs;
      o[x] = 0.0f;
    }
    for (int64_t r = 0; r < n; ++r) {
      m[r] = kNegInf;
      l[r] = 0.0f;
    }
    const int64_t nsub = (n + kBq - 1) / kBq;
    for (int64_t u = 0; u < nsub; ++u)
      block_key_span(pb, b, i_begin + u * kBq, std::min(kBq, n - u * kBq), &sub_first[u], &sub_last[u]);
    const int64_t first = sub_first[0], last = sub_last[nsub - 1];  // the rows' ranges grow with the row
    for (int64_t j0 = first / kBk * kBk; j0 < last; j0 += kBk) {  // blocks outside [first, last) are masked out
      const int64_t cols = std::min(kBk, S - j0);
      if (!fill_key_valid(pb, b, j0, cols, kv)) continue;
      const bool all_valid = pb.key_valid == nullptr || std::all_of(kv, kv + cols, [](float x) { return x != 0.0f; });
      const float* ktile = kt;
      if (once)
        ktile = k_t + (pb.kv_head(bh) * nkb + j0 / kBk) * D * kBk;
      else
        Ops::transpose(kh + j0 * D, cols, D, kt);
      for (int64_t u = 0; u < nsub; ++u) {  // each 64-row block of the span on this key block
        if (j0 + cols <= sub_first[u] || j0 >= sub_last[u]) continue;
        const int64_t i0 = i_begin + u * kBq, rows = std::min(kBq, T - i0);
        const uint8_t state = pb.tile_state(bh, i0, j0);  // NOTE [attention block layouts]
        if (state == kSkipTile) continue;
        float *qu = qs + u * kBq * D, *ou = o + u * kBq * D, *mu = m + u * kBq, *lu = l + u * kBq;
        bool ranged = false;  // lo, hi hold this tile's ranges
        if (state == kFullTile && !pb.alibi && !pb.bias && !pb.drop_threshold) {  // NOTE [attention fused strips]
          const bool inside = RowRanges(pb, b, i0, rows).inside(j0, cols, all_valid);
          if (!inside) tile_ranges(pb, b, i0, rows, j0, cols, lo, hi), ranged = true;
          if (Ops::fused_tile(qu, ktile, vh + j0 * D, rows, cols, D, inside ? nullptr : lo, inside ? nullptr : hi,
                              inside ? nullptr : kv, mu, lu, ou))
            continue;
        }
        if (!ranged) tile_ranges(pb, b, i0, rows, j0, cols, lo, hi);
        Ops::gemm(qu, D, 1, ktile, kBk, s, kBk, rows, cols, D, false);
        pb.add_extras(bh, i0, rows, j0, cols, s, kLog2e, state);
        // A bias may hold -inf: rows of -inf take the masked path, as a layout's do.
        Ops::softmax_tile(s, rows, cols, lo, hi, kv, mu, lu, ou, D, state == kPartialTile || pb.bias);
        if (pb.drop_threshold) {  // p dropped for p v; l and m keep the undropped softmax
          pb.dropout_tile(bh, i0, rows, j0, cols, z);
          for (int64_t x = 0; x < rows * kBk; ++x) s[x] *= z[x];
        }
        Ops::gemm(s, kBk, 1, vh + j0 * D, D, ou, D, rows, D, cols, true);
      }
    }
    finish_rows(o, D, m, l, n, D, out + (bh * T + i_begin) * D, lse + bh * T + i_begin);
  }
}

int64_t backward_scratch_floats(int64_t D) { return 2 * D * kBk + 3 * kBq * kBk + kBk + 2 * kBq; }

// FlashAttention-2 backward, in two passes so that every output element is
// summed by one thread in a fixed order: pass 1 owns a key block of one kv
// head (dk, dv) and walks the query blocks of every query head that shares it
// (grouped-query attention: the group's heads in order); pass 2 owns a query
// block (dq) and walks the key blocks. Both recompute
// p = exp2(cs * q.k - lse log2 e) and ds per tile.
template <class Ops>
void backward_fast(const Problem& pb, const float* out, const float* lse, const float* dout, float* dq, float* dk,
                   float* dv, float* dbias) {
  const int64_t D = pb.D, T = pb.T, S = pb.S, BH = pb.B * pb.H;
  const int nt = omp_get_max_threads();
  const int64_t per = backward_scratch_floats(D);
  Tensor scratch_t = scratch_tensor(per * nt);  // as the forward's
  float* const scratch = scratch_t.data<float>();
  const float cs = pb.scale * kLog2e;

  if (dbias) {  // elements of skipped tiles (masked) stay 0
#pragma omp parallel for schedule(static) num_threads(nt)
    for (int64_t row = 0; row < BH * T; ++row) std::fill_n(dbias + row * S, S, 0.0f);
  }
  // di = rowsum(dout * out): the p-weighted mean of dp, per query row.
  std::vector<float> di(size_t(BH * T));
#pragma omp parallel for schedule(static) num_threads(nt)
  for (int64_t row = 0; row < BH * T; ++row) {
    float acc = 0.0f;
    for (int64_t d = 0; d < D; ++d) acc += dout[row * D + d] * out[row * D + d];
    di[size_t(row)] = acc;
  }

  struct Tile {
    float *kt, *vt, *s, *dp, *kv, *lse2, *dib, *z;
    int lo[kBq], hi[kBq];
  };
  auto carve = [&](Tile& w) {
    w.kt = scratch + per * omp_get_thread_num();
    w.vt = w.kt + D * kBk;
    w.s = w.vt + D * kBk;
    w.dp = w.s + kBq * kBk;
    w.kv = w.dp + kBq * kBk;
    w.lse2 = w.kv + kBk;
    w.dib = w.lse2 + kBq;
    w.z = w.dib + kBq;
  };
  // p into w.s and ds into w.dp for query rows [i0, i0 + rows) and keys
  // [j0, j0 + cols) of head bh; w.kt, w.vt and w.kv hold the key block.
  auto tile = [&](Tile& w, int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols) {
    tile_ranges(pb, bh / pb.H, i0, rows, j0, cols, w.lo, w.hi);
    for (int64_t r = 0; r < rows; ++r) {
      const float lr = lse[bh * T + i0 + r];
      if (lr == kNegInf) w.lo[r] = w.hi[r] = 0;  // a row with no allowed key has no gradient
      w.lse2[r] = lr * kLog2e;
      w.dib[r] = di[size_t(bh * T + i0 + r)];
    }
    const float* qb = pb.q + (bh * T + i0) * D;
    const float* gb = dout + (bh * T + i0) * D;
    Ops::gemm(qb, D, 1, w.kt, kBk, w.s, kBk, rows, cols, D, false);   // s = q k^T
    pb.add_extras(bh, i0, rows, j0, cols, w.s, 1.0f / pb.scale, pb.tile_state(bh, i0, j0));  // -inf: p = 0
    Ops::gemm(gb, D, 1, w.vt, kBk, w.dp, kBk, rows, cols, D, false);  // dp = dout v^T
    if (pb.drop_threshold) {  // out = (p z) v: dp = z (dout v^T), ds = p (dp - di), dv = (p z)^T dout
      pb.dropout_tile(bh, i0, rows, j0, cols, w.z);
      for (int64_t x = 0; x < rows * kBk; ++x) w.dp[x] *= w.z[x];
    }
    Ops::grad_tile(w.s, w.dp, rows, cols, w.lo, w.hi, w.kv, w.lse2, w.dib, cs);
    if (pb.drop_threshold)
      for (int64_t x = 0; x < rows * kBk; ++x) w.s[x] *= w.z[x];
  };
  // The key block j0 of kv head kvh (= b * Hk + kv head).
  auto load_keys = [&](Tile& w, int64_t kvh, int64_t j0, int64_t cols) {
    if (!fill_key_valid(pb, kvh / pb.Hk, j0, cols, w.kv)) return false;
    Ops::transpose(pb.k + (kvh * S + j0) * D, cols, D, w.kt);
    Ops::transpose(pb.v + (kvh * S + j0) * D, cols, D, w.vt);
    return true;
  };

  const int64_t nqb = (T + kBq - 1) / kBq, nkb = (S + kBk - 1) / kBk,
                group = pb.Hk > 0 ? pb.H / pb.Hk : 0, units = pb.B * pb.Hk;
  // The first query head of kv head kvh's group.
  auto first_head = [&](int64_t kvh) { return (kvh / pb.Hk) * pb.H + (kvh % pb.Hk) * group; };
  // Key block j0 of kv head kvh, loaded in w, against every query block of its group's heads, in order:
  // dk and dv accumulated for the block (dk unscaled), and with `dq` (the one-pass schedule) dq too.
  auto walk_queries = [&](Tile& w, int64_t kvh, int64_t j0, int64_t cols, float* dq_or_null) {
    float* dkb = dk + (kvh * S + j0) * D;
    float* dvb = dv + (kvh * S + j0) * D;
    for (int64_t bh = first_head(kvh); bh < first_head(kvh) + group; ++bh) {
      int64_t row_first, row_last;
      block_query_span(pb, bh / pb.H, j0, j0 + cols, &row_first, &row_last);
      for (int64_t i0 = row_first / kBq * kBq; i0 < row_last; i0 += kBq) {
        const int64_t rows = std::min(kBq, T - i0);
        int64_t first, last;
        block_key_span(pb, bh / pb.H, i0, rows, &first, &last);
        if (first >= j0 + cols || last <= j0 || pb.tile_state(bh, i0, j0) == kSkipTile) continue;
        tile(w, bh, i0, rows, j0, cols);
        if (dbias)  // ds is the scores' gradient, and the bias's; each tile is visited once here
          for (int64_t r = 0; r < rows; ++r)
            std::copy_n(w.dp + r * kBk, cols, dbias + (bh * T + i0 + r) * S + j0);
        const float* qb = pb.q + (bh * T + i0) * D;
        const float* gb = dout + (bh * T + i0) * D;
        Ops::gemm(w.s, 1, kBk, gb, D, dvb, D, cols, D, rows, true);   // dv += p^T dout
        Ops::gemm(w.dp, 1, kBk, qb, D, dkb, D, cols, D, rows, true);  // dk += ds^T q
        if (dq_or_null)                                               // dq += ds k
          Ops::gemm(w.dp, kBk, 1, pb.k + (kvh * S + j0) * D, D, dq_or_null + (bh * T + i0) * D, D, rows, D, cols,
                    true);
      }
    }
    for (int64_t x = 0; x < cols * D; ++x) dkb[x] *= pb.scale;
  };

  // NOTE [attention backward per head]: with enough kv heads for every thread
  // (B·Hk a multiple of the threads, or at least 4 per thread), a thread owns
  // whole kv heads and makes one pass: per key block, per query block of the
  // group's heads, s and ds once, then dv, dk and dq all from them (5 block
  // products instead of the two passes' 7). dq sums over the key blocks in
  // ascending order and dk, dv over the (head, query block) pairs in the same
  // order as the two passes do, with the same block products: the bits are
  // the two passes' bits, so the choice may follow the thread count.
  if (units >= nt && (units % nt == 0 || units >= 4 * int64_t(nt))) {
#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
    for (int64_t kvh = 0; kvh < units; ++kvh) {
      Tile w;
      carve(w);
      float* dq_group = dq + first_head(kvh) * T * D;
      std::fill(dk + kvh * S * D, dk + (kvh + 1) * S * D, 0.0f);
      std::fill(dv + kvh * S * D, dv + (kvh + 1) * S * D, 0.0f);
      std::fill(dq_group, dq_group + group * T * D, 0.0f);
      for (int64_t j0 = 0; j0 < S; j0 += kBk) {
        const int64_t cols = std::min(kBk, S - j0);
        if (load_keys(w, kvh, j0, cols)) walk_queries(w, kvh, j0, cols, dq);
      }
      for (float* x = dq_group; x < dq_group + group * T * D; ++x) *x *= pb.scale;
    }
    return;
  }

#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t t = 0; t < pb.B * pb.Hk * nkb; ++t) {
    Tile w;
    carve(w);
    const int64_t kvh = t / nkb, j0 = (t % nkb) * kBk, cols = std::min(kBk, S - j0);
    std::fill(dk + (kvh * S + j0) * D, dk + (kvh * S + j0 + cols) * D, 0.0f);
    std::fill(dv + (kvh * S + j0) * D, dv + (kvh * S + j0 + cols) * D, 0.0f);
    if (load_keys(w, kvh, j0, cols)) walk_queries(w, kvh, j0, cols, nullptr);
  }

#pragma omp parallel for schedule(dynamic, 1) num_threads(nt)
  for (int64_t t = 0; t < BH * nqb; ++t) {
    Tile w;
    carve(w);
    const int64_t bh = t / nqb, i0 = (t % nqb) * kBq, rows = std::min(kBq, T - i0);
    float* dqb = dq + (bh * T + i0) * D;
    std::fill(dqb, dqb + rows * D, 0.0f);
    int64_t first, last;
    block_key_span(pb, bh / pb.H, i0, rows, &first, &last);
    const int64_t kvh = pb.kv_head(bh);
    for (int64_t j0 = first / kBk * kBk; j0 < last; j0 += kBk) {
      const int64_t cols = std::min(kBk, S - j0);
      if (pb.tile_state(bh, i0, j0) == kSkipTile || !load_keys(w, kvh, j0, cols)) continue;
      tile(w, bh, i0, rows, j0, cols);
      Ops::gemm(w.dp, kBk, 1, pb.k + (kvh * S + j0) * D, D, dqb, D, rows, D, cols, true);  // dq += ds k
    }
    for (int64_t x = 0; x < rows * D; ++x) dqb[x] *= pb.scale;
  }
}

// ---------------------------------------------------------------------------
// Argument checks.

std::string i64(int64_t x) { return std::to_string(x); }

Status check_shape(const char* kernel, int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                   float scale, const AttentionMask& mask, int64_t* n_q, int64_t* n_k, int64_t* n_l) {
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "B", B));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "H", H));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "Hk", Hk));
  if ((Hk == 0) != (H == 0) || (Hk > 0 && H % Hk != 0))
    return Status::invalid_argument(std::string(kernel) + ": Hk", "a divisor of H = " + i64(H) + " (key/value heads)",
                                    i64(Hk));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "T", T));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "S", S));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "D", D));
  int64_t bh, bhk, bs;
  if (__builtin_mul_overflow(B, H, &bh) || __builtin_mul_overflow(bh, T, n_l) ||
      __builtin_mul_overflow(*n_l, D, n_q) || __builtin_mul_overflow(B, Hk, &bhk) ||
      __builtin_mul_overflow(bhk, S, n_k) || __builtin_mul_overflow(*n_k, D, n_k) ||
      __builtin_mul_overflow(B, S, &bs))
    return Status::invalid_argument(std::string(kernel) + ": extents", "B*H*T*D and B*H*S*D within int64",
                                    "B=" + i64(B) + " H=" + i64(H) + " T=" + i64(T) + " S=" + i64(S) + " D=" + i64(D));
  if (!std::isfinite(scale))
    return Status::invalid_argument(std::string(kernel) + ": scale", "a finite number", std::to_string(scale));
  if (mask.kind != Kind::none && mask.kind != Kind::causal && mask.kind != Kind::local)
    return Status::invalid_argument(std::string(kernel) + ": mask.kind", "none, causal or local",
                                    i64(int(mask.kind)));
  if (mask.kind == Kind::local) {
    ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.window", mask.window, 1));
    ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.window_right", mask.window_right, 0));
    if (mask.window > (int64_t(1) << 53) || mask.window_right > (int64_t(1) << 53))
      return Status::invalid_argument(std::string(kernel) + ": mask.window, mask.window_right", "at most 2^53",
                                      i64(mask.window) + ", " + i64(mask.window_right));
  } else if (mask.window_right != 0) {
    return Status::invalid_argument(std::string(kernel) + ": mask.window_right", "0 unless the kind is local",
                                    i64(mask.window_right));
  }
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.kv_offset", mask.kv_offset, 0));
  if (mask.kv_offset > std::numeric_limits<int64_t>::max() - T)
    return Status::invalid_argument(std::string(kernel) + ": mask.kv_offset",
                                    "kv_offset + T within int64", i64(mask.kv_offset));
  if (!mask.key_valid.empty() && int64_t(mask.key_valid.size()) != bs)
    return Status::invalid_argument(std::string(kernel) + ": argument 'mask.key_valid'",
                                    "empty (all keys valid) or exactly " + i64(bs) + " elements ([B, S])",
                                    i64(int64_t(mask.key_valid.size())));
  if (!mask.alibi_slopes.empty()) {
    if (int64_t(mask.alibi_slopes.size()) != H)
      return Status::invalid_argument(std::string(kernel) + ": argument 'mask.alibi_slopes'",
                                      "exactly H = " + i64(H) + " slopes", i64(int64_t(mask.alibi_slopes.size())));
    if (!(scale > 0))
      return Status::invalid_argument(std::string(kernel) + ": scale", "> 0 with ALiBi slopes", std::to_string(scale));
    for (float s : mask.alibi_slopes)
      if (!std::isfinite(s))
        return Status::invalid_argument(std::string(kernel) + ": mask.alibi_slopes", "finite slopes",
                                        std::to_string(s));
  }
  if (!mask.bias.empty()) {
    if ((mask.bias_batch != 1 && mask.bias_batch != B) || (mask.bias_heads != 1 && mask.bias_heads != H))
      return Status::invalid_argument(std::string(kernel) + ": mask.bias_batch, mask.bias_heads",
                                      "1 or B = " + i64(B) + ", 1 or H = " + i64(H),
                                      i64(mask.bias_batch) + ", " + i64(mask.bias_heads));
    int64_t cells = 0;
    if (__builtin_mul_overflow(mask.bias_batch * mask.bias_heads, T, &cells) ||
        __builtin_mul_overflow(cells, S, &cells) || int64_t(mask.bias.size()) != cells)
      return Status::invalid_argument(std::string(kernel) + ": argument 'mask.bias'",
                                      "exactly " + i64(mask.bias_batch) + " x " + i64(mask.bias_heads) + " x " + i64(T) +
                                          " x " + i64(S) + " elements ([bias_batch, bias_heads, T, S])",
                                      i64(int64_t(mask.bias.size())));
    if (!(scale > 0))
      return Status::invalid_argument(std::string(kernel) + ": scale", "> 0 with a bias", std::to_string(scale));
  }
  if (!(mask.dropout >= 0.0f && mask.dropout < 1.0f))
    return Status::invalid_argument(std::string(kernel) + ": mask.dropout", "a probability in [0, 1)",
                                    std::to_string(mask.dropout));
  if (mask.dropout_heads != 0 &&
      (mask.dropout_head_offset < 0 || mask.dropout_head_offset + H > mask.dropout_heads))
    return Status::invalid_argument(std::string(kernel) + ": mask.dropout_head_offset",
                                    "heads offset .. offset + H = " + i64(H) + " within dropout_heads = " +
                                        i64(mask.dropout_heads),
                                    i64(mask.dropout_head_offset));
  if (!mask.layout.empty()) {
    ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.layout_block", mask.layout_block, 1));
    if (mask.layout_heads != 1 && mask.layout_heads != H)
      return Status::invalid_argument(std::string(kernel) + ": mask.layout_heads", "1 or H = " + i64(H),
                                      i64(mask.layout_heads));
    const bool positions = !mask.layout_query_positions.empty() || !mask.layout_key_positions.empty();
    if (positions) {
      if (int64_t(mask.layout_query_positions.size()) != B * T || int64_t(mask.layout_key_positions.size()) != bs)
        return Status::invalid_argument(std::string(kernel) + ": mask.layout_query_positions, layout_key_positions",
                                        i64(B * T) + " and " + i64(bs) + " elements ([B, T] and [B, S])",
                                        i64(int64_t(mask.layout_query_positions.size())) + " and " +
                                            i64(int64_t(mask.layout_key_positions.size())));
      ASPEN_RETURN_IF_ERROR(check_extent(kernel, "mask.layout_blocks", mask.layout_blocks, 1));
      const int64_t end = mask.layout_blocks * mask.layout_block;
      for (const auto& [name, pos] : {std::pair{"mask.layout_query_positions", mask.layout_query_positions},
                                      std::pair{"mask.layout_key_positions", mask.layout_key_positions}})
        for (size_t n = 0; n < pos.size(); ++n)
          if (pos[n] >= end)
            return Status::invalid_argument(std::string(kernel) + ": " + name + " element " + i64(int64_t(n)),
                                            "a position below layout_blocks x layout_block = " + i64(end),
                                            i64(pos[n]));
    }
    const int64_t rows = positions ? mask.layout_blocks : (mask.kv_offset + T + mask.layout_block - 1) / mask.layout_block,
                  cols = positions ? mask.layout_blocks : (S + mask.layout_block - 1) / mask.layout_block;
    int64_t cells = 0;
    if (__builtin_mul_overflow(rows, cols, &cells) || __builtin_mul_overflow(cells, mask.layout_heads, &cells) ||
        int64_t(mask.layout.size()) != cells)
      return Status::invalid_argument(std::string(kernel) + ": argument 'mask.layout'",
                                      i64(mask.layout_heads * rows * cols) + " elements ([" + i64(mask.layout_heads) +
                                          ", " + i64(rows) + ", " + i64(cols) + "]: layout heads, query blocks, key "
                                          "blocks of " + i64(mask.layout_block) + ")",
                                      i64(int64_t(mask.layout.size())));
  }
  if (!mask.segments.empty()) {
    if (int64_t(mask.segments.size()) != bs)
      return Status::invalid_argument(std::string(kernel) + ": argument 'mask.segments'",
                                      "empty (one segment) or exactly " + i64(bs) + " elements ([B, S])",
                                      i64(int64_t(mask.segments.size())));
    if (T > 0 && mask.kv_offset + T > S)
      return Status::invalid_argument(std::string(kernel) + ": mask.kv_offset",
                                      "kv_offset + T <= S = " + i64(S) + " with segments (each query's segment is "
                                      "its position's)", i64(mask.kv_offset) + " + " + i64(T));
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 1; j < S; ++j)
        if (mask.segments[size_t(b * S + j)] < mask.segments[size_t(b * S + j - 1)])
          return Status::invalid_argument(std::string(kernel) + ": mask.segments row " + i64(b),
                                          "non-decreasing segment ids (documents one after another)",
                                          i64(mask.segments[size_t(b * S + j - 1)]) + " then " +
                                              i64(mask.segments[size_t(b * S + j)]) + " at key " + i64(j));
  }
  return Status();
}

template <class E>
Status check_qkv(const char* kernel, std::span<const E> q, std::span<const E> k, std::span<const E> v, int64_t nq,
                 int64_t nk) {
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "q", q, nq));
  ASPEN_RETURN_IF_ERROR(check_buffer(kernel, "k", k, nk));
  return check_buffer(kernel, "v", v, nk);
}

using NamedBuffer = std::tuple<const char*, std::span<const float>, int64_t>;

Status check_buffers(const char* kernel, std::initializer_list<NamedBuffer> buffers) {
  for (const auto& [name, buf, n] : buffers) ASPEN_RETURN_IF_ERROR(check_buffer(kernel, name, buf, n));
  return Status();
}

// attention_forward's checks; the element counts of q, k and lse into *nq, *nk, *nl.
template <class E>
Status check_forward(std::span<const E> q, std::span<const E> k, std::span<const E> v, std::span<float> out,
                     std::span<float> lse, int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                     float scale, const AttentionMask& mask, int64_t* nq, int64_t* nk, int64_t* nl) {
  constexpr const char* kName = "attention_forward";
  ASPEN_RETURN_IF_ERROR(check_shape(kName, B, H, Hk, T, S, D, scale, mask, nq, nk, nl));
  ASPEN_RETURN_IF_ERROR(check_qkv(kName, q, k, v, *nq, *nk));
  return check_buffers(kName, {{"out", out, *nq}, {"lse", lse, *nl}});
}

// The top 24 bits of a Philox element at or above which dropout keeps it: bits_to_unit_float(x) >= p
// exactly when (x >> 8) >= ceil(p 2^24) (both sides exact).
uint32_t dropout_threshold(float p) { return uint32_t(std::ceil(double(p) * 16777216.0)); }

// Per (layout head, query tile, key tile): skipped, full or partial (NOTE
// [attention block layouts]), from the layout blocks each tile overlaps.
void layout_tiles(Problem& pb, std::vector<uint8_t>& tiles) {
  pb.nqt = (pb.T + kBq - 1) / kBq;
  pb.nkt = (pb.S + kBk - 1) / kBk;
  // With each row's positions a state per batch row too; the layout blocks a tile's rows or keys span
  // (lowest, highest): their positions' blocks (a superset when positions jump, so "full" stays exact), else
  // the slots' (kv_offset + i for queries, j for keys).
  using Span = std::pair<int64_t, int64_t>;
  auto span = [&pb](auto block_of, int64_t b, int64_t from, int64_t to) {
    Span r{INT64_MAX, 0};
    for (int64_t e = from; e < to; ++e) {
      const int64_t blk = (pb.*block_of)(b, e);
      r = {std::min(r.first, blk), std::max(r.second, blk)};
    }
    return r;
  };
  const int64_t bs = pb.lblock, rows = pb.lq ? pb.B : 1;
  tiles.assign(size_t(rows * pb.lheads * pb.nqt * pb.nkt), kSkipTile);
  std::vector<Span> keys(size_t(pb.nkt));
  for (int64_t b = 0; b < rows; ++b) {
    for (int64_t kt = 0; kt < pb.nkt; ++kt) {
      const int64_t j1 = std::min(pb.S, (kt + 1) * kBk);
      keys[size_t(kt)] = pb.lk ? span(&Problem::lk_block, b, kt * kBk, j1) : Span{kt * kBk / bs, (j1 - 1) / bs};
    }
    for (int64_t qt = 0; qt < pb.nqt; ++qt) {
      const int64_t i1 = std::min(pb.T, (qt + 1) * kBq);
      const auto [q_lo, q_hi] = pb.lq ? span(&Problem::lq_block, b, qt * kBq, i1)
                                      : Span{(pb.geo.offset + qt * kBq) / bs, (pb.geo.offset + i1 - 1) / bs};
      for (int64_t kt = 0; kt < pb.nkt; ++kt)
        for (int64_t h = 0; h < pb.lheads; ++h) {
          bool any = false, all = true;
          for (int64_t qb = q_lo; qb <= q_hi; ++qb)
            for (int64_t kb = keys[size_t(kt)].first; kb <= keys[size_t(kt)].second; ++kb) {
              const bool on = pb.layout[(h * pb.lrows + qb) * pb.lcols + kb] != 0;
              any |= on;
              all &= on;
            }
          tiles[size_t(((b * pb.lheads + h) * pb.nqt + qt) * pb.nkt + kt)] =
              !any ? kSkipTile : all ? kFullTile : kPartialTile;
        }
    }
  }
  pb.tiles = tiles.data();
}

// The problem of one call; with segments, `seg` receives each key's segment
// bounds ([B, S] starts, then [B, S] ends), which the geometry reads; with a
// layout, `tiles` its tiles' states.
Problem make_problem(const float* q, const float* k, const float* v, int64_t B, int64_t H, int64_t Hk, int64_t T,
                     int64_t S, int64_t D, float scale, const AttentionMask& mask, std::vector<int32_t>& seg,
                     std::vector<uint8_t>& tiles) {
  Problem pb{q, k, v, B, H, Hk, T, S, D, scale,
             Geometry{mask.kind, mask.window, mask.window_right, mask.kv_offset, S},
             mask.key_valid.empty() ? nullptr : mask.key_valid.data()};
  if (!mask.alibi_slopes.empty()) pb.alibi = mask.alibi_slopes.data();
  if (mask.dropout > 0.0f) {
    pb.drop_threshold = dropout_threshold(mask.dropout);
    pb.drop_scale = 1.0f / (1.0f - mask.dropout);
    pb.drop_seed = mask.dropout_seed;
    pb.drop_stream = mask.dropout_stream;
    pb.drop_heads = mask.dropout_heads > 0 ? mask.dropout_heads : H;
    pb.drop_head_offset = mask.dropout_head_offset;
  }
  if (!mask.bias.empty()) {
    pb.bias = mask.bias.data();
    pb.bias_batch = mask.bias_batch;
    pb.bias_heads = mask.bias_heads;
  }
  if (!mask.layout.empty()) {
    pb.layout = mask.layout.data();
    pb.lblock = mask.layout_block;
    pb.lheads = mask.layout_heads;
    pb.lcols = (S + mask.layout_block - 1) / mask.layout_block;
    pb.lrows = (mask.kv_offset + T + mask.layout_block - 1) / mask.layout_block;
    if (!mask.layout_query_positions.empty()) {
      pb.lq = mask.layout_query_positions.data();
      pb.lk = mask.layout_key_positions.data();
      pb.lrows = pb.lcols = mask.layout_blocks;
    }
    layout_tiles(pb, tiles);
  }
  if (mask.segments.empty()) return pb;
  seg.resize(size_t(2 * B * S));
  int32_t* lo = seg.data();
  int32_t* hi = lo + B * S;
  for (int64_t b = 0; b < B; ++b) {
    const int32_t* id = mask.segments.data() + b * S;
    for (int64_t j = 0; j < S; ++j) lo[b * S + j] = int32_t(j > 0 && id[j] == id[j - 1] ? lo[b * S + j - 1] : j);
    for (int64_t j = S - 1; j >= 0; --j)
      hi[b * S + j] = int32_t(j + 1 < S && id[j] == id[j + 1] ? hi[b * S + j + 1] : j + 1);
  }
  pb.geo.seg_lo = lo;
  pb.geo.seg_hi = hi;
  return pb;
}

// attention_backward's checks; the element counts of q, k and lse into *nq, *nk, *nl.
template <class E>
Status check_backward(std::span<const E> q, std::span<const E> k, std::span<const E> v, std::span<const float> out,
                      std::span<const float> lse, std::span<const float> dout, std::span<float> dq,
                      std::span<float> dk, std::span<float> dv, std::span<float> dbias, int64_t B, int64_t H,
                      int64_t Hk, int64_t T, int64_t S, int64_t D, float scale, const AttentionMask& mask, int64_t* nq,
                      int64_t* nk, int64_t* nl) {
  constexpr const char* kName = "attention_backward";
  if (!mask.layout_query_positions.empty() || !mask.layout_key_positions.empty())
    return Status::error(Code::kUnimplemented, std::string(kName) + ": mask.layout_query_positions",
                         "none (a layout by each row's positions is for generation: forward only)", "positions");
  ASPEN_RETURN_IF_ERROR(check_shape(kName, B, H, Hk, T, S, D, scale, mask, nq, nk, nl));
  ASPEN_RETURN_IF_ERROR(check_qkv(kName, q, k, v, *nq, *nk));
  ASPEN_RETURN_IF_ERROR(check_buffers(kName, {{"out", out, *nq}, {"lse", lse, *nl}, {"dout", dout, *nq},
                                              {"dq", dq, *nq}, {"dk", dk, *nk}, {"dv", dv, *nk}}));
  if (dbias.empty()) return Status();
  if (mask.bias.empty())
    return Status::invalid_argument(std::string(kName) + ": dbias", "empty without mask.bias (pass a bias of zeros)",
                                    i64(int64_t(dbias.size())) + " elements");
  int64_t nb = 0;
  if (__builtin_mul_overflow(*nl, S, &nb))
    return Status::invalid_argument(std::string(kName) + ": dbias", "B*H*T*S within int64", "more");
  return check_buffers(kName, {{"dbias", dbias, nb}});
}

// NOTE [attention bf16 dot]: bf16 q, k and v go to the bf16 kernel (attention_amx.cc) where the CPU multiplies
// bf16 pairs: AMX tiles, or AVX512-BF16 dot products (decoding rows excepted: their split-KV f32 path reads the
// cache once, where the tiles would pad one row to 32); elsewhere the f32 kernel runs on the widened values.
bool bf16_kernel(int64_t T) {
  if (reference_mode()) return false;
  return active_isa() >= Isa::amx || (active_isa() >= Isa::avx512_bf16 && T > kDecodeRows);
}

// The f32 copies of q, k and v the bf16 entry points make without the bf16 kernel.
int64_t widened_bytes(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D) {
  return (B * H * T + 2 * B * Hk * S) * D * int64_t(sizeof(float));
}

// q, k and v widened to f32 (the bf16 entry points without the bf16 kernel: bf16_kernel).
// Tensors, not vectors: uninitialized (a vector zeroed megabytes first) and from the tensor block cache (NOTE
// [tensor block cache]: a training step widens the same sizes every layer and step, and fresh vectors faulted
// their pages in each time: a bf16 causal forward at 4k on AVX2 took 9 ms more than the f32 one).
struct Widened {
  Tensor q, k, v;
  Status of(std::span<const bf16> q16, std::span<const bf16> k16, std::span<const bf16> v16, int64_t nq, int64_t nk) {
    ASPEN_ASSIGN_OR_RETURN(q, Tensor::make_uninitialized(DType::f32, Shape{nq}));
    ASPEN_ASSIGN_OR_RETURN(k, Tensor::make_uninitialized(DType::f32, Shape{nk}));
    ASPEN_ASSIGN_OR_RETURN(v, Tensor::make_uninitialized(DType::f32, Shape{nk}));
    ASPEN_RETURN_IF_ERROR(convert_bf16_to_f32(q16, q.span<float>(), nq));
    ASPEN_RETURN_IF_ERROR(convert_bf16_to_f32(k16, k.span<float>(), nk));
    return convert_bf16_to_f32(v16, v.span<float>(), nk);
  }
};

}  // namespace

Status check_attention_mask(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D, float scale,
                            const AttentionMask& mask) {
  int64_t nq, nk, nl;
  return check_shape("attention", B, H, Hk, T, S, D, scale, mask, &nq, &nk, &nl);
}

void attn::Problem::dropout_tile(int64_t bh, int64_t i0, int64_t rows, int64_t j0, int64_t cols, float* z) const {
  for (int64_t r = 0; r < rows; ++r) {
    const uint64_t n0 = uint64_t(((bh / H * drop_heads + drop_head_offset + bh % H) * T + i0 + r) * S + j0);
    PhiloxBlock block{};
    uint64_t at = ~uint64_t(0);
    for (int64_t c = 0; c < cols; ++c) {
      const uint64_t n = n0 + uint64_t(c);
      if (n / 4 != at) block = philox_block(drop_seed, drop_stream, at = n / 4);
      z[r * kBk + c] = (block[n % 4] >> 8) >= drop_threshold ? drop_scale : 0.0f;
    }
    std::fill(z + r * kBk + cols, z + (r + 1) * kBk, 0.0f);
  }
}

float attention_dropout_multiplier(const AttentionMask& mask, int64_t H, int64_t T, int64_t S, int64_t b, int64_t h,
                                   int64_t i, int64_t j) {
  if (!(mask.dropout > 0.0f)) return 1.0f;
  const int64_t heads = mask.dropout_heads > 0 ? mask.dropout_heads : H;
  const uint32_t bits = philox_bits(mask.dropout_seed, mask.dropout_stream,
                                    uint64_t(((b * heads + mask.dropout_head_offset + h) * T + i) * S + j));
  return (bits >> 8) >= dropout_threshold(mask.dropout) ? 1.0f / (1.0f - mask.dropout) : 0.0f;
}

std::vector<float> alibi_slopes(int64_t heads, double bias_max) {
  int64_t n = 1;
  while (n < heads) n *= 2;
  std::vector<float> all(static_cast<size_t>(n)), out;
  for (int64_t k = 1; k <= n; ++k) all[size_t(k - 1)] = float(std::exp2(-bias_max * double(k) / double(n)));
  if (n == heads) return all;
  for (int64_t k = 1; k < n; k += 2) out.push_back(all[size_t(k)]);
  for (int64_t k = 0; k < n; k += 2) out.push_back(all[size_t(k)]);
  out.resize(size_t(heads));
  return out;
}

int64_t attention_forward_scratch_bytes(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                                        int threads, DType dtype) {
  if (dtype == DType::bf16) {
    if (bf16_kernel(T)) return forward_bf16_scratch_bytes(B, Hk, S, D, threads);
    return widened_bytes(B, H, Hk, T, S, D) + attention_forward_scratch_bytes(B, H, Hk, T, S, D, threads);
  }
  if (T <= kDecodeRows) {  // NOTE [attention split-KV decoding]
    const int64_t chunks = decode_chunks(S);
    return chunks > 1 ? B * H * T * chunks * (D + 1) * int64_t(sizeof(float)) : 0;
  }
  const int64_t keys_t = T > kBq ? B * Hk * ((S + kBk - 1) / kBk) * kBk * D : 0;  // NOTE [attention keys transposed once]
  return (forward_scratch_floats(D) * int64_t(std::max(threads, 1)) + keys_t) * int64_t(sizeof(float));
}

int64_t attention_backward_scratch_bytes(int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                                         int threads, DType dtype) {
  if (dtype == DType::bf16) {
    if (bf16_kernel(T)) return backward_bf16_scratch_bytes(B, H, Hk, T, S, D, threads);
    return widened_bytes(B, H, Hk, T, S, D) + attention_backward_scratch_bytes(B, H, Hk, T, S, D, threads);
  }
  return (backward_scratch_floats(D) * int64_t(std::max(threads, 1)) + B * H * T) * int64_t(sizeof(float));
}

Status attention_forward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                         std::span<float> out, std::span<float> lse, int64_t B, int64_t H, int64_t Hk, int64_t T,
                         int64_t S, int64_t D, float scale, const AttentionMask& mask) {
  int64_t nq, nk, nl;
  ASPEN_RETURN_IF_ERROR(check_forward(q, k, v, out, lse, B, H, Hk, T, S, D, scale, mask, &nq, &nk, &nl));
  if (nl == 0) return Status();
  if (reference_mode()) {
    ref::attention_forward<float>(q.data(), k.data(), v.data(), out.data(), lse.data(), B, H, Hk, T, S, D, scale, mask);
    return Status();
  }
  std::vector<int32_t> seg;
  std::vector<uint8_t> tiles;
  const Problem pb = make_problem(q.data(), k.data(), v.data(), B, H, Hk, T, S, D, scale, mask, seg, tiles);
  const auto run = [&](auto ops) {
    using Ops = decltype(ops);
    if (T <= kDecodeRows && mask.layout.empty() && mask.alibi_slopes.empty() && mask.bias.empty() &&
        mask.dropout == 0.0f)  // NOTE [attention decode rows]
      forward_decode<Ops>(pb, out.data(), lse.data());
    else
      forward_fast<Ops>(pb, out.data(), lse.data());
  };
  if (active_isa() >= Isa::avx512)
    run(Avx512{});
  else if (active_isa() >= Isa::avx2)
    run(Avx2{});
  else
    run(Portable{});
  return Status();
}

Status attention_forward(std::span<const bf16> q, std::span<const bf16> k, std::span<const bf16> v,
                         std::span<float> out, std::span<float> lse, int64_t B, int64_t H, int64_t Hk, int64_t T,
                         int64_t S, int64_t D, float scale, const AttentionMask& mask) {
  int64_t nq, nk, nl;
  ASPEN_RETURN_IF_ERROR(check_forward(q, k, v, out, lse, B, H, Hk, T, S, D, scale, mask, &nq, &nk, &nl));
  if (nl == 0) return Status();
  if (!bf16_kernel(T)) {  // the f32 kernel on the widened values
    Widened w;
    ASPEN_RETURN_IF_ERROR(w.of(q, k, v, nq, nk));
    return attention_forward(std::span<const float>(w.q.span<float>()), std::span<const float>(w.k.span<float>()),
                             std::span<const float>(w.v.span<float>()), out, lse, B, H, Hk, T, S, D, scale, mask);
  }
  std::vector<int32_t> seg;
  std::vector<uint8_t> tiles;
  const Problem pb = make_problem(nullptr, nullptr, nullptr, B, H, Hk, T, S, D, scale, mask, seg, tiles);
  forward_bf16(pb, q.data(), k.data(), v.data(), out.data(), lse.data(), active_isa() >= Isa::amx);
  return Status();
}

Status attention_backward(std::span<const float> q, std::span<const float> k, std::span<const float> v,
                          std::span<const float> out, std::span<const float> lse, std::span<const float> dout,
                          std::span<float> dq, std::span<float> dk, std::span<float> dv, int64_t B, int64_t H,
                          int64_t Hk, int64_t T, int64_t S, int64_t D, float scale, const AttentionMask& mask,
                          std::span<float> dbias) {
  int64_t nq, nk, nl;
  ASPEN_RETURN_IF_ERROR(
      check_backward(q, k, v, out, lse, dout, dq, dk, dv, dbias, B, H, Hk, T, S, D, scale, mask, &nq, &nk, &nl));
  float* db = dbias.empty() ? nullptr : dbias.data();
  if (reference_mode()) {
    ref::attention_backward<float>(q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(),
                                   dk.data(), dv.data(), B, H, Hk, T, S, D, scale, mask, db);
    return Status();
  }
  std::vector<int32_t> seg;
  std::vector<uint8_t> tiles;
  const Problem pb = make_problem(q.data(), k.data(), v.data(), B, H, Hk, T, S, D, scale, mask, seg, tiles);
  if (active_isa() >= Isa::avx512)
    backward_fast<Avx512>(pb, out.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(), db);
  else if (active_isa() >= Isa::avx2)
    backward_fast<Avx2>(pb, out.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(), db);
  else
    backward_fast<Portable>(pb, out.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(), db);
  return Status();
}

Status attention_backward(std::span<const bf16> q, std::span<const bf16> k, std::span<const bf16> v,
                          std::span<const float> out, std::span<const float> lse, std::span<const float> dout,
                          std::span<float> dq, std::span<float> dk, std::span<float> dv, int64_t B, int64_t H,
                          int64_t Hk, int64_t T, int64_t S, int64_t D, float scale, const AttentionMask& mask,
                          std::span<float> dbias) {
  int64_t nq, nk, nl;
  ASPEN_RETURN_IF_ERROR(
      check_backward(q, k, v, out, lse, dout, dq, dk, dv, dbias, B, H, Hk, T, S, D, scale, mask, &nq, &nk, &nl));
  if (!bf16_kernel(T)) {  // the f32 kernel on the widened values
    Widened w;
    ASPEN_RETURN_IF_ERROR(w.of(q, k, v, nq, nk));
    return attention_backward(std::span<const float>(w.q.span<float>()), std::span<const float>(w.k.span<float>()),
                              std::span<const float>(w.v.span<float>()), out, lse, dout, dq, dk, dv, B, H, Hk, T, S, D,
                              scale, mask, dbias);
  }
  std::vector<int32_t> seg;
  std::vector<uint8_t> tiles;
  const Problem pb = make_problem(nullptr, nullptr, nullptr, B, H, Hk, T, S, D, scale, mask, seg, tiles);
  backward_bf16(pb, q.data(), k.data(), v.data(), out.data(), lse.data(), dout.data(), dq.data(), dk.data(), dv.data(),
                dbias.empty() ? nullptr : dbias.data(), active_isa() >= Isa::amx);
  return Status();
}

}  // namespace aspen::kernels
