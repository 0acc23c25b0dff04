#include "kernels/sampling.h"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <functional>
#include <limits>
#include <string>
#include <vector>

#include "core/philox.h"
#include "kernels/check_args.h"
#include "kernels/cpu.h"
#include "kernels/vec_math.h"

namespace aspen::kernels {

namespace {

constexpr float kNegInf = -std::numeric_limits<float>::infinity();

// Shortest round-trip form of a value for messages: "-1", "0.5", "nan", "inf".
std::string num(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%.9g", v);
  return buf;
}

std::string row_arg(const char* who, const char* name, int64_t b) {
  return std::string(who) + ": argument '" + name + "' row " + std::to_string(b);
}

// z[h] for a history id h: HF's repetition penalty applied to x[h].
template <class T>
inline T penalized(T x, T p) {
  return x < 0 ? x * p : x / p;
}

}  // namespace

double sample_uniform(uint64_t seed, uint64_t step, int64_t b) {
  const uint64_t n = 2 * uint64_t(b);
  const uint32_t hi = philox_bits(seed, step, n) >> 5, lo = philox_bits(seed, step, n + 1) >> 6;
  return (double(hi) * 67108864.0 + double(lo)) * (1.0 / 9007199254740992.0);
}

// ---- value checks --------------------------------------------------------------

template <class T>
Status check_sampling_values(const char* who, const T* logits, const int32_t* history, const T* temperature,
                             const int32_t* top_k, const T* top_p, const T* repetition_penalty, int64_t B, int64_t V,
                             int64_t L) {
  constexpr T kInf = std::numeric_limits<T>::infinity();
  for (int64_t b = 0; b < B; ++b) {
    const T t = temperature[b], q = top_p[b], p = repetition_penalty[b];
    if (!(t >= 0 && t < kInf))
      return Status::invalid_argument(row_arg(who, "temperature", b), "a finite number >= 0 (0: greedy)", num(t));
    if (top_k[b] < 0)
      return Status::invalid_argument(row_arg(who, "top_k", b), "a number >= 0 (0: off)", std::to_string(top_k[b]));
    if (!(q > 0 && q <= 1))
      return Status::invalid_argument(row_arg(who, "top_p", b), "a number in (0, 1] (1: off)", num(q));
    if (!(p > 0 && p < kInf))
      return Status::invalid_argument(row_arg(who, "repetition_penalty", b), "a finite number > 0 (1: off)",
                                      num(p));
    for (int64_t l = 0; l < L; ++l)
      if (history[b * L + l] >= V)
        return Status::error(Code::kOutOfRange, row_arg(who, "history", b) + " position " + std::to_string(l),
                             "a token id < V = " + std::to_string(V) + " (negative: padding)",
                             std::to_string(history[b * L + l]));
    const T* x = logits + b * V;
    int bad = 0, finite = 0;
#pragma omp simd reduction(| : bad, finite)
    for (int64_t v = 0; v < V; ++v) {
      bad |= !(x[v] < kInf);
      finite |= x[v] > -kInf;
    }
    if (bad)
      for (int64_t v = 0; v < V; ++v)
        if (!(x[v] < kInf))
          return Status::invalid_argument(row_arg(who, "logits", b) + " column " + std::to_string(v),
                                          "a number or -inf", num(x[v]));
    if (!finite && t > 0)
      return Status::invalid_argument(row_arg(who, "logits", b), "at least one logit > -inf (temperature > 0)",
                                      "all -inf");
  }
  return Status();
}

template Status check_sampling_values<float>(const char*, const float*, const int32_t*, const float*, const int32_t*,
                                             const float*, const float*, int64_t, int64_t, int64_t);
template Status check_sampling_values<double>(const char*, const double*, const int32_t*, const double*,
                                              const int32_t*, const double*, const double*, int64_t, int64_t, int64_t);

// ---- reference -------------------------------------------------------------------

namespace ref {

namespace {
template <class T>
int32_t sample_row(const T* x, const int32_t* hist, T t, int32_t k, T q, T pen, double u, int64_t V, int64_t L) {
  std::vector<T> z(x, x + V);
  for (int64_t l = 0; l < L; ++l)
    if (hist[l] >= 0) z[size_t(hist[l])] = penalized(x[hist[l]], pen);
  auto greedy = [&] {
    int64_t best = 0;
    for (int64_t v = 1; v < V; ++v)
      if (z[size_t(v)] > z[size_t(best)]) best = v;
    return int32_t(best);
  };
  if (t == 0) return greedy();
  std::vector<T> scaled = z;
  for (T& zv : scaled) zv = zv / t;
  // NOTE [tiny temperatures]: when logits / t overflows (t = 1e-45), the
  // distribution is, to the precision of T, all on the largest logit: greedy.
  if (!std::isfinite(*std::max_element(scaled.begin(), scaled.end()))) return greedy();
  z = std::move(scaled);
  const T m = *std::max_element(z.begin(), z.end());
  T cut = -std::numeric_limits<T>::infinity();  // the kept set is {v : z[v] >= cut}
  if (k > 0 && k < V) {
    std::vector<T> s = z;
    std::sort(s.begin(), s.end(), std::greater<T>());
    cut = s[size_t(k - 1)];
  }
  if (q < 1) {
    std::vector<T> kept;
    double S = 0;
    for (T zv : z)
      if (zv >= cut) {
        kept.push_back(zv);
        S += std::exp(double(zv) - double(m));
      }
    std::sort(kept.begin(), kept.end(), std::greater<T>());
    // Tie groups in descending order; a group is kept iff the mass above it is < q.
    double above = 0;
    for (size_t i = 0; i < kept.size() && above < double(q);) {
      const T g = kept[i];
      cut = g;
      for (; i < kept.size() && kept[i] == g; ++i) above += std::exp(double(g) - double(m)) / S;
    }
  }
  double W = 0;
  for (T zv : z)
    if (zv >= cut) W += std::exp(double(zv) - double(m));
  const double target = u * W;
  double acc = 0;
  int32_t last = -1;
  for (int64_t v = 0; v < V; ++v) {
    if (!(z[size_t(v)] >= cut)) continue;
    const double w = std::exp(double(z[size_t(v)]) - double(m));
    if (w > 0) {
      acc += w;
      last = int32_t(v);
      if (acc > target) break;
    }
  }
  return last;
}
}  // namespace

template <class T>
void sample_tokens(const T* logits, const int32_t* history, const T* temperature, const int32_t* top_k,
                   const T* top_p, const T* repetition_penalty, uint64_t seed, uint64_t step, int32_t* ids, int64_t B,
                   int64_t V, int64_t L) {
  for (int64_t b = 0; b < B; ++b)
    ids[b] = sample_row(logits + b * V, history + b * L, temperature[b], top_k[b], top_p[b], repetition_penalty[b],
                        sample_uniform(seed, step, b), V, L);
}

template void sample_tokens<float>(const float*, const int32_t*, const float*, const int32_t*, const float*,
                                   const float*, uint64_t, uint64_t, int32_t*, int64_t, int64_t, int64_t);
template void sample_tokens<double>(const double*, const int32_t*, const double*, const int32_t*, const double*,
                                    const double*, uint64_t, uint64_t, int32_t*, int64_t, int64_t, int64_t);

}  // namespace ref

// ---- fast path ----------------------------------------------------------------------

namespace {

constexpr int64_t kBlock = 256;    // elements per block of the full-row inverse-CDF walk
constexpr int64_t kSortMax = 1024;  // more top-p candidates than this: bisection instead of a sort

int64_t round64(int64_t bytes) { return (bytes + 63) / 64 * 64; }

// One slot's arrays, each 64-byte aligned: z, e (f32 [V]), idx, ord (i32 [V]), cv, cw (f32 [V]), block
// sums (f64).
struct Slot {
  float* z = nullptr;      // the processed logits
  float* e = nullptr;      // exp(z - max), or the top-k heap
  int32_t* idx = nullptr;  // candidates, ascending
  int32_t* ord = nullptr;  // candidates, by z descending
  float* cv = nullptr;     // candidates' z, gathered
  float* cw = nullptr;     // candidates' e, gathered
  double* blocks = nullptr;
};

int64_t slot_bytes(int64_t V) { return 6 * round64(V * 4) + round64((V + kBlock - 1) / kBlock * 8); }

Slot slot_at(std::byte* base, int64_t V, int64_t s) {
  std::byte* p = base + s * slot_bytes(V);
  const int64_t a = round64(V * 4);
  Slot r;
  r.z = reinterpret_cast<float*>(p);
  r.e = reinterpret_cast<float*>(p + a);
  r.idx = reinterpret_cast<int32_t*>(p + 2 * a);
  r.ord = reinterpret_cast<int32_t*>(p + 3 * a);
  r.cv = reinterpret_cast<float*>(p + 4 * a);
  r.cw = reinterpret_cast<float*>(p + 5 * a);
  r.blocks = reinterpret_cast<double*>(p + 6 * a);
  return r;
}

struct Job {
  const float* logits = nullptr;
  const int32_t* history = nullptr;
  const SamplingParams* params = nullptr;
  int64_t V = 0, L = 0;
};

// Replaces the smallest of a min-heap of k floats by x (> it); returns the new smallest.
inline float heap_replace_min(float* h, int64_t k, float x) {
  int64_t i = 0;
  for (;;) {
    const int64_t l = 2 * i + 1, r = l + 1;
    if (l >= k) break;
    const int64_t c = r < k && h[r] < h[l] ? r : l;
    if (!(h[c] < x)) break;
    h[i] = h[c];
    i = c;
  }
  h[i] = x;
  return h[0];
}

inline float heap_init(const float* z, int64_t k, float* h) {
  std::copy(z, z + k, h);
  std::make_heap(h, h + k, std::greater<float>());
  return h[0];
}

// The k-th largest of z[0, V) (with multiplicity), 0 < k < V; heap holds k floats.
float kth_largest_portable(const float* z, int64_t V, int64_t k, float* heap) {
  float lo = heap_init(z, k, heap);
  for (int64_t v = k; v < V; ++v)
    if (z[v] > lo) lo = heap_replace_min(heap, k, z[v]);
  return lo;
}

// Writes the v with z[v] >= c to idx in ascending order; returns their count.
int64_t collect_ge_portable(const float* z, int64_t V, float c, int32_t* idx) {
  int64_t n = 0;
  for (int64_t v = 0; v < V; ++v) {
    idx[n] = int32_t(v);  // n <= v: in bounds; kept only if counted
    n += z[v] >= c;
  }
  return n;
}

// AVX-512: 16 lanes compared against the heap's smallest at once (most blocks have no lane above it).
ASPEN_TARGET_AVX512 float kth_largest_avx512(const float* z, int64_t V, int64_t k, float* heap) {
  float lo = heap_init(z, k, heap);
  int64_t v = k;
  for (; v + 16 <= V; v += 16) {
    __mmask16 mk = _mm512_cmp_ps_mask(_mm512_loadu_ps(z + v), _mm512_set1_ps(lo), _CMP_GT_OQ);
    while (mk) {
      const int j = __builtin_ctz(mk);
      mk = __mmask16(mk & (mk - 1));
      if (z[v + j] > lo) lo = heap_replace_min(heap, k, z[v + j]);
    }
  }
  for (; v < V; ++v)
    if (z[v] > lo) lo = heap_replace_min(heap, k, z[v]);
  return lo;
}

ASPEN_TARGET_AVX512 int64_t collect_ge_avx512(const float* z, int64_t V, float c, int32_t* idx) {
  int64_t n = 0, v = 0;
  const __m512 vc = _mm512_set1_ps(c);
  __m512i vi = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i sixteen = _mm512_set1_epi32(16);
  for (; v + 16 <= V; v += 16) {
    const __mmask16 mk = _mm512_cmp_ps_mask(_mm512_loadu_ps(z + v), vc, _CMP_GE_OQ);
    _mm512_mask_compressstoreu_epi32(idx + n, mk, vi);
    n += __builtin_popcount(mk);
    vi = _mm512_add_epi32(vi, sixteen);
  }
  for (; v < V; ++v) {
    idx[n] = int32_t(v);
    n += z[v] >= c;
  }
  return n;
}

template <Isa I>
ASPEN_VM_INLINE float kth_largest(const float* z, int64_t V, int64_t k, float* heap) {
  if constexpr (I >= Isa::avx512) return kth_largest_avx512(z, V, k, heap);
  else return kth_largest_portable(z, V, k, heap);
}

template <Isa I>
ASPEN_VM_INLINE int64_t collect_ge(const float* z, int64_t V, float c, int32_t* idx) {
  if constexpr (I >= Isa::avx512) return collect_ge_avx512(z, V, c, idx);
  else return collect_ge_portable(z, V, c, idx);
}

// The inverse-CDF walk over the candidates idx[0, n) with z >= cut, in ascending index order, summing
// weights w(v) = exp(z[v] - m) in f64 (computed in f64 as the reference does, or read from e).
template <class W>
int32_t draw_from_list(const float* z, const int32_t* idx, int64_t n, float cut, double u, W w) {
  double total = 0;
  for (int64_t i = 0; i < n; ++i)
    if (z[idx[i]] >= cut) total += w(idx[i]);
  const double target = u * total;
  double acc = 0;
  int32_t last = -1;
  for (int64_t i = 0; i < n; ++i) {
    const int32_t v = idx[i];
    if (!(z[v] >= cut)) continue;
    const double wv = w(v);
    if (wv > 0) {
      acc += wv;
      last = v;
      if (acc > target) break;
    }
  }
  return last;
}

// The top-p cut among candidates idx[0, n) that hold the nucleus: sorts them by z descending (index
// ascending among ties) into ord and walks the tie groups as the reference does. w(v) is P(v) * S.
template <class W>
float nucleus_cut_sorted(const float* z, const int32_t* idx, int32_t* ord, int64_t n, double S, float q, W w) {
  std::copy(idx, idx + n, ord);
  std::sort(ord, ord + n, [z](int32_t a, int32_t b) { return z[a] > z[b] || (z[a] == z[b] && a < b); });
  double above = 0;
  float cut = kNegInf;
  for (int64_t i = 0; i < n && above < double(q);) {
    const float g = z[ord[i]];
    cut = g;
    for (; i < n && z[ord[i]] == g; ++i) above += w(ord[i]) / S;
  }
  return cut;
}

// Floats in order as integers: a < b iff key(a) < key(b) (not NaN; -0 and +0 share 0).
inline int64_t order_key(float f) {
  const int32_t i = std::bit_cast<int32_t>(f);
  return i >= 0 ? int64_t(i) : int64_t(INT32_MIN) - int64_t(i);
}
inline float from_key(int64_t k) {
  return k >= 0 ? std::bit_cast<float>(int32_t(k)) : std::bit_cast<float>(uint32_t(0x80000000u) | uint32_t(-k));
}

// The mass of the gathered candidates with value > c, f32.
ASPEN_VM_INLINE float mass_above(const float* cv, const float* cw, int64_t n, float c) {
  return vm::sum_of(n, [cv, cw, c](int64_t i) ASPEN_VM_LAMBDA { return vm::select(cv[i] > c, cw[i], 0.0f); });
}

// The same cut without sorting, for many candidates (cv, cw gathered, lowest value lo, mass >= q S): the
// kept groups are those with mass above < q S, and mass_above(c) only changes at candidate values, so the
// smallest float c with mass_above(c) < q S is the smallest kept value. Bisection over the floats in order:
// at most 32 masked sums of the candidates.
ASPEN_VM_INLINE float nucleus_cut_bisect(const float* cv, const float* cw, int64_t n, float lo, float m, float qS) {
  // lo: every candidate is >= lo (-inf when all tokens are candidates).
  int64_t bad = order_key(lo) - 1, good = order_key(m);  // mass_above(bad) >= qS > mass_above(good)
  while (good - bad > 1) {
    const int64_t mid = bad + (good - bad) / 2;
    if (mass_above(cv, cw, n, from_key(mid)) < qS) good = mid;
    else bad = mid;
  }
  return from_key(good);
}

template <Isa I>
ASPEN_VM_INLINE int32_t fast_row(const Job& j, int64_t b, const Slot& s) {
  const int64_t V = j.V, L = j.L;
  const SamplingParams& p = *j.params;
  const float* x = j.logits + b * V;
  const int32_t* hist = j.history + b * L;
  const float t = p.temperature[size_t(b)], q = p.top_p[size_t(b)], pen = p.repetition_penalty[size_t(b)];
  const int32_t k = p.top_k[size_t(b)];
  const bool penalize = pen != 1.0f && L > 0;
  float* z = s.z;
  float* e = s.e;

  const auto greedy = [&] {  // the first maximum of the (penalized) logits
    const float* y = x;
    if (penalize) {
      std::memcpy(z, x, size_t(V) * sizeof(float));
      for (int64_t l = 0; l < L; ++l)
        if (hist[l] >= 0) z[hist[l]] = penalized(x[hist[l]], pen);
      y = z;
    }
    const float mx = vm::max_of(V, [y](int64_t v) ASPEN_VM_LAMBDA { return y[v]; });
    return int32_t(std::find(y, y + V, mx) - y);
  };
  if (t == 0) return greedy();

#pragma omp simd
  for (int64_t v = 0; v < V; ++v) z[v] = x[v] / t;
  if (penalize)
    for (int64_t l = 0; l < L; ++l)
      if (hist[l] >= 0) z[hist[l]] = penalized(x[hist[l]], pen) / t;
  const float m = vm::max_of(V, [z](int64_t v) ASPEN_VM_LAMBDA { return z[v]; });
  if (!std::isfinite(m)) return greedy();  // NOTE [tiny temperatures] in ref::sample_row
  const double u = sample_uniform(p.seed, p.step, b);

  float cut = kNegInf;
  int64_t n = -1;  // candidates in s.idx; -1: every token is still kept
  if (k > 0 && k < V) {
    cut = kth_largest<I>(z, V, k, e);
    n = collect_ge<I>(z, V, cut, s.idx);
  }
  const auto exact_w = [z, m](int32_t v) { return std::exp(double(z[v]) - double(m)); };
  const auto e_w = [e](int32_t v) { return double(e[v]); };
  if (q < 1.0f && n >= 0) {  // top-k then top-p: the candidates are few, weights in f64 as the reference
    double S = 0;
    for (int64_t i = 0; i < n; ++i) S += exact_w(s.idx[i]);
    cut = nucleus_cut_sorted(z, s.idx, s.ord, n, S, q, exact_w);
  } else if (q < 1.0f) {
    // Candidates are the tokens with probability >= level (z >= cz); level falls until they hold the
    // nucleus (at the end every token is a candidate).
    const float S = vm::sum_of(V, [z, e, m](int64_t v) ASPEN_VM_LAMBDA {
      const float w = vm::exp(z[v] - m);
      e[v] = w;
      return w;
    });
    const float qS = q * S;
    for (double level = 1.0 / 1024;; level *= 1.0 / 64) {
      const float cz = level < 1e-40 ? kNegInf : float(double(m) + std::log(level * double(S)));
      if (cz > kNegInf) {
        const float mass = vm::sum_of(V, [z, e, cz](int64_t v) ASPEN_VM_LAMBDA {
          return vm::select(z[v] >= cz, e[v], 0.0f);
        });
        if (mass < qS) continue;
      }
      n = collect_ge<I>(z, V, cz, s.idx);
      if (n <= kSortMax) {
        cut = nucleus_cut_sorted(z, s.idx, s.ord, n, double(S), q, e_w);
      } else {
        const int32_t* idx = s.idx;
        float *cv = s.cv, *cw = s.cw;
#pragma omp simd
        for (int64_t i = 0; i < n; ++i) {
          cv[i] = z[idx[i]];
          cw[i] = e[idx[i]];
        }
        cut = nucleus_cut_bisect(cv, cw, n, cz, m, qS);
      }
      return draw_from_list(z, s.idx, n, cut, u, e_w);
    }
  }
  if (n >= 0) return draw_from_list(z, s.idx, n, cut, u, exact_w);

  // Every token kept: e = exp(z - m) in f32, summed per block in f64; the walk finds the block, then the token.
  const int64_t nb = (V + kBlock - 1) / kBlock;
  double W = 0;
  for (int64_t blk = 0; blk < nb; ++blk) {
    const int64_t v0 = blk * kBlock, v1 = std::min(V, v0 + kBlock);
    double bs = 0;
#pragma omp simd reduction(+ : bs)
    for (int64_t v = v0; v < v1; ++v) {
      const float w = vm::exp(z[v] - m);
      e[v] = w;
      bs += double(w);
    }
    s.blocks[blk] = bs;
    W += bs;
  }
  const double target = u * W;
  double acc = 0;
  int32_t last = -1;
  for (int64_t blk = 0; blk < nb; ++blk) {
    if (s.blocks[blk] <= 0) continue;
    if (acc + s.blocks[blk] <= target && blk + 1 < nb) {
      acc += s.blocks[blk];
      continue;
    }
    const int64_t v0 = blk * kBlock, v1 = std::min(V, v0 + kBlock);
    for (int64_t v = v0; v < v1; ++v)
      if (e[v] > 0) {
        acc += double(e[v]);
        last = int32_t(v);
        if (acc > target) return last;
      }
  }
  // Rounding left the target past the last weight: the last token with one (m's token has weight 1).
  for (int64_t v = V - 1; v >= 0; --v)
    if (e[v] > 0) return int32_t(v);
  return last;
}

using RowFn = int32_t (*)(const Job&, int64_t, const Slot&);
ASPEN_TARGET_AVX512 int32_t fast_row_avx512(const Job& j, int64_t b, const Slot& s) {
  return fast_row<Isa::avx512>(j, b, s);
}
ASPEN_TARGET_AVX2 int32_t fast_row_avx2(const Job& j, int64_t b, const Slot& s) { return fast_row<Isa::avx2>(j, b, s); }
int32_t fast_row_portable(const Job& j, int64_t b, const Slot& s) { return fast_row<Isa::scalar>(j, b, s); }

RowFn pick_row_fn() {
  const Isa isa = active_isa();
  if (isa >= Isa::avx512) return fast_row_avx512;
  if (isa == Isa::avx2) return fast_row_avx2;
  return fast_row_portable;
}

}  // namespace

int64_t sample_tokens_workspace_bytes(int64_t V, int64_t slots) { return 64 + slots * slot_bytes(V); }

Status sample_tokens(std::span<const float> logits, std::span<const int32_t> history, const SamplingParams& params,
                     std::span<int32_t> ids, int64_t B, int64_t V, int64_t L, std::span<std::byte> workspace) {
  constexpr const char* k = "sample_tokens";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "B", B));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "V", V, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "L", L));
  if (V > std::numeric_limits<int32_t>::max())
    return Status::invalid_argument(std::string(k) + ": V", "a vocabulary that int32 ids can index (<= 2147483647)",
                                    std::to_string(V));
  if (B > INT64_MAX / V || (L > 0 && B > INT64_MAX / L))
    return Status::invalid_argument(std::string(k) + ": B * V, B * L", "products that fit in int64",
                                    std::to_string(B) + " * " + std::to_string(V) + ", " + std::to_string(B) + " * " +
                                        std::to_string(L));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "logits", logits, B * V));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "history", history, B * L));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "temperature", params.temperature, B));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "top_k", params.top_k, B));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "top_p", params.top_p, B));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "repetition_penalty", params.repetition_penalty, B));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "ids", ids, B));
  ASPEN_RETURN_IF_ERROR(check_sampling_values<float>(k, logits.data(), history.data(), params.temperature.data(),
                                                     params.top_k.data(), params.top_p.data(),
                                                     params.repetition_penalty.data(), B, V, L));
  if (B == 0) return Status();
  if (reference_mode()) {
    ref::sample_tokens<float>(logits.data(), history.data(), params.temperature.data(), params.top_k.data(),
                              params.top_p.data(), params.repetition_penalty.data(), params.seed, params.step,
                              ids.data(), B, V, L);
    return Status();
  }
  const int64_t team = std::min<int64_t>(B, omp_get_max_threads());
  std::vector<std::byte> own;
  if (workspace.empty()) {
    own.resize(size_t(sample_tokens_workspace_bytes(V, team)));
    workspace = own;
  } else if (int64_t(workspace.size()) < sample_tokens_workspace_bytes(V, 1)) {
    return Status::invalid_argument(std::string(k) + ": argument 'workspace'",
                                    "at least " + std::to_string(sample_tokens_workspace_bytes(V, 1)) +
                                        " bytes (one slot for V = " + std::to_string(V) + ")",
                                    std::to_string(workspace.size()));
  }
  // Slots start at the first 64-byte boundary of the workspace.
  std::byte* base = workspace.data();
  const uintptr_t mis = reinterpret_cast<uintptr_t>(base) % 64;
  if (mis) base += 64 - mis;
  const int64_t slots = (int64_t(workspace.size()) - 64) / slot_bytes(V);
  const int threads = int(std::min<int64_t>(slots, team));
  const Job job{logits.data(), history.data(), &params, V, L};
  const RowFn fn = pick_row_fn();
#pragma omp parallel num_threads(threads) if (threads > 1)
  {
    const Slot s = slot_at(base, V, omp_get_thread_num());
#pragma omp for schedule(static)
    for (int64_t b = 0; b < B; ++b) ids[size_t(b)] = fn(job, b, s);
  }
  return Status();
}

}  // namespace aspen::kernels
