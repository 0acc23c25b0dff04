#include "kernels/lstm.h"

#include <omp.h>

#include <algorithm>
#include <cmath>
#include <string>

#include "kernels/check_args.h"
#include "kernels/chunks.h"
#include "kernels/cpu.h"
#include "kernels/vec_math.h"

namespace aspen::kernels {

namespace {

Status check(const char* k, const LstmShape& s) {
  ASPEN_RETURN_IF_ERROR(check_extent(k, "T", s.T, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "B", s.B, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "H", s.H, 1));
  return Status();
}

// The step before t in processing order, and whether t is the first step processed.
inline int64_t prev_step(const LstmShape& s, int64_t t) { return s.reverse ? t + 1 : t - 1; }
inline bool first_step(const LstmShape& s, int64_t t) { return s.reverse ? t == s.T - 1 : t == 0; }

// ---- fast kernels: chunks of batch rows [b0, b1) over the whole sequence ----

struct Fwd {
  LstmShape s;
  const float *xw, *rt, *h0, *c0;  // rt: Rᵀ [H, 4H]
  float *y, *c, *g;
};

ASPEN_VM_INLINE void lstm_fwd(const Fwd& a, int64_t b0, int64_t b1) {
  const int64_t T = a.s.T, B = a.s.B, H = a.s.H, G = 4 * H;
  for (int64_t step = 0; step < T; ++step) {
    const int64_t t = a.s.reverse ? T - 1 - step : step, tp = prev_step(a.s, t);
    const bool first = step == 0;
    // z = xw[t] + h_{t-1} Rᵀ, written into gates[t]: Rᵀ's row k scaled by h_{t-1}[k], for every row of the chunk.
    for (int64_t j = b0; j < b1; ++j) {
      float* z = a.g + (t * B + j) * G;
      const float* x = a.xw + (t * B + j) * G;
#pragma omp simd
      for (int64_t q = 0; q < G; ++q) z[q] = x[q];
    }
    for (int64_t k = 0; k < H; ++k) {
      const float* rk = a.rt + k * G;
      for (int64_t j = b0; j < b1; ++j) {
        const float hk = first ? a.h0[j * H + k] : a.y[(tp * B + j) * H + k];
        float* z = a.g + (t * B + j) * G;
#pragma omp simd
        for (int64_t q = 0; q < G; ++q) z[q] += hk * rk[q];
      }
    }
    for (int64_t j = b0; j < b1; ++j) {
      float* z = a.g + (t * B + j) * G;
      const float* cp = first ? a.c0 + j * H : a.c + (tp * B + j) * H;
      float* ct = a.c + (t * B + j) * H;
      float* ht = a.y + (t * B + j) * H;
#pragma omp simd
      for (int64_t k = 0; k < H; ++k) {
        const float i = vm::sigmoid(z[k]), o = vm::sigmoid(z[H + k]), f = vm::sigmoid(z[2 * H + k]);
        const float cc = vm::tanh(z[3 * H + k]);
        z[k] = i, z[H + k] = o, z[2 * H + k] = f, z[3 * H + k] = cc;
        const float cn = f * cp[k] + i * cc;
        ct[k] = cn;
        ht[k] = o * vm::tanh(cn);
      }
    }
  }
}

struct Bwd {
  LstmShape s;
  const float *dy, *dc, *r, *c0, *c, *g;
  float *dxw, *dh0, *dc0;  // dh0, dc0 hold the running dh_{t-1}, dc_{t-1} until the end
};

ASPEN_VM_INLINE void lstm_bwd(const Bwd& a, int64_t b0, int64_t b1) {
  const int64_t T = a.s.T, B = a.s.B, H = a.s.H, G = 4 * H;
  for (int64_t j = b0; j < b1; ++j) {
#pragma omp simd
    for (int64_t k = 0; k < H; ++k) a.dh0[j * H + k] = 0.0f, a.dc0[j * H + k] = 0.0f;
  }
  for (int64_t step = 0; step < T; ++step) {
    const int64_t t = a.s.reverse ? step : T - 1 - step, tp = prev_step(a.s, t);
    const bool first = first_step(a.s, t);
    for (int64_t j = b0; j < b1; ++j) {
      const int64_t row = t * B + j;
      const float *gz = a.g + row * G, *ct = a.c + row * H, *dyt = a.dy + row * H;
      const float* dct = a.dc ? a.dc + row * H : nullptr;
      const float* cp = first ? a.c0 + j * H : a.c + (tp * B + j) * H;
      float *dz = a.dxw + row * G, *dhn = a.dh0 + j * H, *dcn = a.dc0 + j * H;
#pragma omp simd
      for (int64_t k = 0; k < H; ++k) {
        const float i = gz[k], o = gz[H + k], f = gz[2 * H + k], cc = gz[3 * H + k];
        const float dh = dyt[k] + dhn[k];
        const float tc = vm::tanh(ct[k]);
        const float dcv = dcn[k] + dh * o * (1.0f - tc * tc) + (dct ? dct[k] : 0.0f);
        dz[k] = dcv * cc * i * (1.0f - i);
        dz[H + k] = dh * tc * o * (1.0f - o);
        dz[2 * H + k] = dcv * cp[k] * f * (1.0f - f);
        dz[3 * H + k] = dcv * i * (1.0f - cc * cc);
        dcn[k] = dcv * f;
      }
    }
    // dh_{t-1} = dz R: R's row q scaled by dz[q].
    for (int64_t j = b0; j < b1; ++j) {
      float* dhn = a.dh0 + j * H;
#pragma omp simd
      for (int64_t k = 0; k < H; ++k) dhn[k] = 0.0f;
    }
    for (int64_t q = 0; q < G; ++q) {
      const float* rq = a.r + q * H;
      for (int64_t j = b0; j < b1; ++j) {
        const float dq = a.dxw[(t * B + j) * G + q];
        float* dhn = a.dh0 + j * H;
#pragma omp simd
        for (int64_t k = 0; k < H; ++k) dhn[k] += dq * rq[k];
      }
    }
  }
}

ASPEN_STAMP_VARIANTS(lstm_fwd, Fwd)
ASPEN_STAMP_VARIANTS(lstm_bwd, Bwd)

// Rows per chunk: the team's share, at most 8 (a chunk's rows share each row of R as it streams past). Any
// chunking gives the same values: rows do not interact.
int64_t row_grain(int64_t B) {
  const int64_t threads = std::max(1, omp_get_max_threads());
  return std::clamp<int64_t>((B + threads - 1) / threads, 1, 8);
}

template <class T>
T sigmoid_ref(T x) {
  return T(1) / (T(1) + std::exp(-x));
}

}  // namespace

namespace ref {
template <class T>
void lstm_forward(const LstmShape& s, const T* xw, const T* r, const T* h0, const T* c0, T* y, T* c, T* gates) {
  const int64_t B = s.B, H = s.H, G = 4 * H;
  for (int64_t step = 0; step < s.T; ++step) {
    const int64_t t = s.reverse ? s.T - 1 - step : step, tp = prev_step(s, t);
    for (int64_t j = 0; j < B; ++j) {
      const T* hp = step == 0 ? h0 + j * H : y + (tp * B + j) * H;
      const T* cp = step == 0 ? c0 + j * H : c + (tp * B + j) * H;
      T* z = gates + (t * B + j) * G;
      for (int64_t q = 0; q < G; ++q) {
        T acc = xw[(t * B + j) * G + q];
        for (int64_t k = 0; k < H; ++k) acc += hp[k] * r[q * H + k];
        z[q] = acc;
      }
      for (int64_t k = 0; k < H; ++k) {
        const T i = sigmoid_ref(z[k]), o = sigmoid_ref(z[H + k]), f = sigmoid_ref(z[2 * H + k]);
        const T cc = std::tanh(z[3 * H + k]);
        z[k] = i, z[H + k] = o, z[2 * H + k] = f, z[3 * H + k] = cc;
        c[(t * B + j) * H + k] = f * cp[k] + i * cc;
        y[(t * B + j) * H + k] = o * std::tanh(c[(t * B + j) * H + k]);
      }
    }
  }
}

template <class T>
void lstm_backward(const LstmShape& s, const T* dy, const T* dc, const T* r, const T* c0, const T* c,
                   const T* gates, T* dxw, T* dh0, T* dc0) {
  const int64_t B = s.B, H = s.H, G = 4 * H;
  std::fill(dh0, dh0 + B * H, T(0));
  std::fill(dc0, dc0 + B * H, T(0));
  for (int64_t step = 0; step < s.T; ++step) {
    const int64_t t = s.reverse ? step : s.T - 1 - step, tp = prev_step(s, t);
    for (int64_t j = 0; j < B; ++j) {
      const int64_t row = t * B + j;
      const T* gz = gates + row * G;
      const T* cp = first_step(s, t) ? c0 + j * H : c + (tp * B + j) * H;
      T* dz = dxw + row * G;
      for (int64_t k = 0; k < H; ++k) {
        const T i = gz[k], o = gz[H + k], f = gz[2 * H + k], cc = gz[3 * H + k];
        const T dh = dy[row * H + k] + dh0[j * H + k];
        const T tc = std::tanh(c[row * H + k]);
        const T dcv = dc0[j * H + k] + dh * o * (T(1) - tc * tc) + (dc ? dc[row * H + k] : T(0));
        dz[k] = dcv * cc * i * (T(1) - i);
        dz[H + k] = dh * tc * o * (T(1) - o);
        dz[2 * H + k] = dcv * cp[k] * f * (T(1) - f);
        dz[3 * H + k] = dcv * i * (T(1) - cc * cc);
        dc0[j * H + k] = dcv * f;
      }
      for (int64_t k = 0; k < H; ++k) {
        T acc = 0;
        for (int64_t q = 0; q < G; ++q) acc += dz[q] * r[q * H + k];
        dh0[j * H + k] = acc;
      }
    }
  }
}

template void lstm_forward<float>(const LstmShape&, const float*, const float*, const float*, const float*, float*,
                                  float*, float*);
template void lstm_forward<double>(const LstmShape&, const double*, const double*, const double*, const double*,
                                   double*, double*, double*);
template void lstm_backward<float>(const LstmShape&, const float*, const float*, const float*, const float*,
                                   const float*, const float*, float*, float*, float*);
template void lstm_backward<double>(const LstmShape&, const double*, const double*, const double*, const double*,
                                    const double*, const double*, double*, double*, double*);
}  // namespace ref

Status lstm_forward(const LstmShape& s, const float* xw, const float* r, const float* h0, const float* c0, float* y,
                    float* c, float* gates, float* work) {
  ASPEN_RETURN_IF_ERROR(check("lstm_forward", s));
  if (reference_mode()) {
    ref::lstm_forward<float>(s, xw, r, h0, c0, y, c, gates);
    return Status();
  }
  const int64_t H = s.H, G = 4 * H;
  for (int64_t q = 0; q < G; ++q)
    for (int64_t k = 0; k < H; ++k) work[k * G + q] = r[q * H + k];
  const Fwd a{s, xw, work, h0, c0, y, c, gates};
  lstm_fwd_run(a, s.B, row_grain(s.B), s.T * G * H);
  return Status();
}

Status lstm_backward(const LstmShape& s, const float* dy, const float* dc, const float* r, const float* c0,
                     const float* c, const float* gates, float* dxw, float* dh0, float* dc0) {
  ASPEN_RETURN_IF_ERROR(check("lstm_backward", s));
  if (reference_mode()) {
    ref::lstm_backward<float>(s, dy, dc, r, c0, c, gates, dxw, dh0, dc0);
    return Status();
  }
  const Bwd a{s, dy, dc, r, c0, c, gates, dxw, dh0, dc0};
  lstm_bwd_run(a, s.B, row_grain(s.B), s.T * 4 * s.H * s.H);
  return Status();
}

}  // namespace aspen::kernels
