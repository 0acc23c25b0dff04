// kernels/attention_ref.cc: the definition of attention (attention.h's ref::):
// scores, masks and softmax materialized in plain loops, forward and backward.
// The fast kernels in attention.cc are tested against these.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/attention.h"

namespace aspen::kernels {

using Kind = AttentionMask::Kind;

namespace ref {
namespace {

// The mask, literally: may query row i of batch b attend key j?
bool allowed(const AttentionMask& mask, int64_t T, int64_t S, int64_t b, int64_t h, int64_t i, int64_t j) {
  if (!mask.key_valid.empty() && mask.key_valid[size_t(b * S + j)] == 0) return false;
  const int64_t pos = mask.kv_offset + i;
  if (!mask.layout.empty()) {
    const int64_t bs = mask.layout_block;
    const bool positions = !mask.layout_query_positions.empty();
    const int64_t nk = positions ? mask.layout_blocks : (S + bs - 1) / bs;
    const int64_t rows = (int64_t(mask.layout.size()) / mask.layout_heads) / nk;  // query blocks (validated)
    const int64_t lh = mask.layout_heads == 1 ? 0 : h;
    // A row's own positions (a negative one, padding, looks up block 0), else the slots.
    const int64_t qp = positions ? std::max<int64_t>(0, mask.layout_query_positions[size_t(b * T + i)]) : pos;
    const int64_t kp = positions ? std::max<int64_t>(0, mask.layout_key_positions[size_t(b * S + j)]) : j;
    if (mask.layout[size_t((lh * rows + qp / bs) * nk + kp / bs)] == 0) return false;
  }
  if (!mask.segments.empty() && mask.segments[size_t(b * S + j)] != mask.segments[size_t(b * S + pos)]) return false;
  switch (mask.kind) {
    case Kind::none: return true;
    case Kind::causal: return j <= pos;
    case Kind::local: return j <= pos + mask.window_right && j > pos - mask.window;
  }
  return false;
}

// The element of mask.bias [bias_batch, bias_heads, T, S] that (b, h, i, j) reads (broadcast).
int64_t bias_index(const AttentionMask& mask, int64_t b, int64_t h, int64_t T, int64_t S, int64_t i, int64_t j) {
  const int64_t bb = mask.bias_batch == 1 ? 0 : b, hh = mask.bias_heads == 1 ? 0 : h;
  return ((bb * mask.bias_heads + hh) * T + i) * S + j;
}

// p [T, S] = softmax over allowed keys of scale * q k^T for one (b, h); rows
// with no allowed key are 0. Writes lse when non-null.
template <class F>
void probs(const F* qh, const F* kh, int64_t b, int64_t h, int64_t T, int64_t S, int64_t D, F scale,
           const AttentionMask& mask, const F* bias, F* p, F* lse) {
  const F neg_inf = -std::numeric_limits<F>::infinity();
  for (int64_t i = 0; i < T; ++i) {
    F* pi = p + i * S;
    F mx = neg_inf;
    for (int64_t j = 0; j < S; ++j) {
      F s = neg_inf;
      if (allowed(mask, T, S, b, h, i, j)) {
        s = 0;
        for (int64_t d = 0; d < D; ++d) s += qh[i * D + d] * kh[j * D + d];
        s *= scale;
        if (!mask.alibi_slopes.empty())
          s += F(mask.alibi_slopes[size_t(h)]) * F(j - (mask.kv_offset + i));
        if (bias) s += bias[bias_index(mask, b, h, T, S, i, j)];
        else if (!mask.bias.empty()) s += F(mask.bias[size_t(bias_index(mask, b, h, T, S, i, j))]);
      }
      pi[j] = s;
      mx = std::max(mx, s);
    }
    if (mx == neg_inf) {
      for (int64_t j = 0; j < S; ++j) pi[j] = 0;
      if (lse) lse[i] = neg_inf;
      continue;
    }
    F sum = 0;
    for (int64_t j = 0; j < S; ++j) sum += std::exp(pi[j] - mx);
    for (int64_t j = 0; j < S; ++j) pi[j] = std::exp(pi[j] - mx) / sum;
    if (lse) lse[i] = mx + std::log(sum);
  }
}

}  // namespace

template <class F>
void attention_forward(const F* q, const F* k, const F* v, F* out, F* lse, int64_t B, int64_t H, int64_t Hk,
                       int64_t T, int64_t S, int64_t D, F scale, const AttentionMask& mask, const F* bias) {
  std::vector<F> p(size_t(T * S));
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h, kvh = b * Hk + h / (H / Hk);
      probs(q + bh * T * D, k + kvh * S * D, b, h, T, S, D, scale, mask, bias, p.data(), lse + bh * T);
      const F* vh = v + kvh * S * D;
      for (int64_t i = 0; i < T; ++i) {
        F* o = out + (bh * T + i) * D;
        for (int64_t d = 0; d < D; ++d) o[d] = 0;
        for (int64_t j = 0; j < S; ++j) {
          const F pz = p[size_t(i * S + j)] * F(attention_dropout_multiplier(mask, H, T, S, b, h, i, j));
          for (int64_t d = 0; d < D; ++d) o[d] += pz * vh[j * D + d];
        }
      }
    }
}

template <class F>
void attention_backward(const F* q, const F* k, const F* v, const F* out, const F* lse, const F* dout, F* dq,
                        F* dk, F* dv, int64_t B, int64_t H, int64_t Hk, int64_t T, int64_t S, int64_t D,
                        F scale, const AttentionMask& mask, F* dbias, const F* bias) {
  std::vector<F> p(size_t(T * S)), ds(size_t(T * S));
  for (int64_t x = 0; x < B * Hk * S * D; ++x) dk[x] = dv[x] = 0;  // summed over each kv head's group
  for (int64_t b = 0; b < B; ++b)
    for (int64_t h = 0; h < H; ++h) {
      const int64_t bh = b * H + h, kvh = b * Hk + h / (H / Hk);
      const F* qh = q + bh * T * D;
      const F* kh = k + kvh * S * D;
      const F* vh = v + kvh * S * D;
      const F* gh = dout + bh * T * D;
      F* dqh = dq + bh * T * D;
      F* dkh = dk + kvh * S * D;
      F* dvh = dv + kvh * S * D;
      probs(qh, kh, b, h, T, S, D, scale, mask, bias, p.data(), static_cast<F*>(nullptr));
      // dp = z (dout v^T) (z: dropout's multipliers, 1 without), then ds = p * (dp - rowsum(p * dp)).
      std::vector<F> z(size_t(T * S));
      for (int64_t i = 0; i < T; ++i)
        for (int64_t j = 0; j < S; ++j) z[size_t(i * S + j)] = F(attention_dropout_multiplier(mask, H, T, S, b, h, i, j));
      for (int64_t i = 0; i < T; ++i) {
        F rowsum = 0;
        for (int64_t j = 0; j < S; ++j) {
          F dp = 0;
          for (int64_t d = 0; d < D; ++d) dp += gh[i * D + d] * vh[j * D + d];
          dp *= z[size_t(i * S + j)];
          ds[size_t(i * S + j)] = dp;
          rowsum += p[size_t(i * S + j)] * dp;
        }
        for (int64_t j = 0; j < S; ++j) ds[size_t(i * S + j)] = p[size_t(i * S + j)] * (ds[size_t(i * S + j)] - rowsum);
      }
      if (dbias)  // ds is the gradient of the scores, and so of the bias added to them
        for (int64_t x = 0; x < T * S; ++x) dbias[bh * T * S + x] = ds[size_t(x)];
      for (int64_t i = 0; i < T; ++i)
        for (int64_t d = 0; d < D; ++d) {
          F acc = 0;
          for (int64_t j = 0; j < S; ++j) acc += ds[size_t(i * S + j)] * kh[j * D + d];
          dqh[i * D + d] = scale * acc;
        }
      for (int64_t j = 0; j < S; ++j)
        for (int64_t i = 0; i < T; ++i) {
          const F pij = p[size_t(i * S + j)] * z[size_t(i * S + j)], dsij = ds[size_t(i * S + j)];
          for (int64_t d = 0; d < D; ++d) {
            dvh[j * D + d] += pij * gh[i * D + d];
            dkh[j * D + d] += scale * dsij * qh[i * D + d];
          }
        }
    }
}

#define ASPEN_ATTENTION_INSTANTIATE(F)                                                                            \
  template void attention_forward<F>(const F*, const F*, const F*, F*, F*, int64_t, int64_t, int64_t, int64_t,   \
                                     int64_t, int64_t, F, const AttentionMask&, const F*);                       \
  template void attention_backward<F>(const F*, const F*, const F*, const F*, const F*, const F*, F*, F*, F*,     \
                                      int64_t, int64_t, int64_t, int64_t, int64_t, int64_t, F,                   \
                                      const AttentionMask&, F*, const F*);
ASPEN_ATTENTION_INSTANTIATE(float)
ASPEN_ATTENTION_INSTANTIATE(double)
#undef ASPEN_ATTENTION_INSTANTIATE

}  // namespace ref

}  // namespace aspen::kernels
