#include "kernels/norm.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <memory>
#include <string>

#include "kernels/check_args.h"
#include "kernels/chunks.h"
#include "kernels/cpu.h"
#include "kernels/vec_math.h"

namespace aspen::kernels {

namespace {

// ---- argument checks -------------------------------------------------------

Status check_rows(const char* kernel, int64_t R, int64_t C) {
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "R", R));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "C", C, 1));
  if (R > INT64_MAX / C)
    return Status::invalid_argument(std::string(kernel) + ": R * C", "a product that fits in int64",
                                    std::to_string(R) + " * " + std::to_string(C));
  return Status();
}

Status check_eps(const char* kernel, float eps) {
  if (!(eps >= 0.0f) || std::isinf(eps))
    return Status::invalid_argument(std::string(kernel) + ": eps", "a finite value >= 0", std::to_string(eps));
  return Status();
}


constexpr int64_t kGrain = 1 << 14;  // elements per chunk
constexpr int64_t kMaxBlocks = 64;   // row blocks of a column reduction (dgamma, dbeta)

int64_t row_grain(int64_t C) { return std::max<int64_t>(1, kGrain / C); }
// Rows per block of a reduction over rows: a function of R and C only, so the
// partial sums, and the order they are combined in, do not depend on threads.
int64_t reduce_grain(int64_t R, int64_t C) { return std::max(row_grain(C), (R + kMaxBlocks - 1) / kMaxBlocks); }

// ---- forward ---------------------------------------------------------------

struct Fwd {
  const float *x, *residual, *gamma, *beta;
  float *h, *y, *mean, *rstd;
  int64_t C;
  float eps;
};

// LayerNorm of one row held in cache: mean, then variance about the mean, then y.
ASPEN_VM_INLINE void layernorm_row(const float* x, const float* gamma, const float* beta, float* y, float* mean,
                                   float* rstd, int64_t C, float eps) {
  const float m = vm::sum_of(C, [x](int64_t c) ASPEN_VM_LAMBDA { return x[c]; }) / float(C);
  const float v = vm::sum_of(C, [x, m](int64_t c) ASPEN_VM_LAMBDA {
    const float d = x[c] - m;
    return d * d;
  });
  const float rs = 1.0f / std::sqrt(v / float(C) + eps);
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * rs * gamma[c] + beta[c];
  *mean = m;
  *rstd = rs;
}

ASPEN_VM_INLINE void ln_fwd(const Fwd& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  for (int64_t r = r0; r < r1; ++r)
    layernorm_row(a.x + r * C, a.gamma, a.beta, a.y + r * C, a.mean + r, a.rstd + r, C, a.eps);
}

ASPEN_VM_INLINE void add_ln_fwd(const Fwd& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  for (int64_t r = r0; r < r1; ++r) {
    const float *x = a.x + r * C, *res = a.residual + r * C;
    float* h = a.h + r * C;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) h[c] = x[c] + res[c];
    layernorm_row(h, a.gamma, a.beta, a.y + r * C, a.mean + r, a.rstd + r, C, a.eps);
  }
}

ASPEN_VM_INLINE void rms_fwd(const Fwd& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  const float* gamma = a.gamma;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * C;
    float* y = a.y + r * C;
    const float ss = vm::sum_of(C, [x](int64_t c) ASPEN_VM_LAMBDA { return x[c] * x[c]; });
    const float rs = 1.0f / std::sqrt(ss / float(C) + a.eps);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] = x[c] * rs * gamma[c];
    a.rstd[r] = rs;
  }
}

ASPEN_STAMP_VARIANTS(ln_fwd, Fwd)
ASPEN_STAMP_VARIANTS(add_ln_fwd, Fwd)
ASPEN_STAMP_VARIANTS(rms_fwd, Fwd)

// ---- backward --------------------------------------------------------------

struct Bwd {
  const float *x, *gamma, *mean, *rstd, *dy;  // mean is null for RMSNorm
  float* dx;
  float *pg, *pb;  // one [C] row of dgamma (dbeta) partial sums per row block; pb null for RMSNorm
  int64_t C, grain;
};

// LayerNorm backward takes rows kRowBlock at a time in the dx sweep, so each
// dgamma and dbeta partial is loaded and stored once per block of rows rather
// than once per row; the rows are still added to it one after another, in
// order. (Bigger blocks stop fitting in L1 at C = 1024; for RMSNorm, with one
// partial, blocking measured no faster.)
constexpr int64_t kRowBlock = 2;

// mean_c(g) and mean_c(g xhat) of one LayerNorm row, g = gamma dy.
ASPEN_VM_INLINE void ln_row_means(const float* x, const float* dy, const float* gamma, float m, float rs, int64_t C,
                                  float* mg, float* mgx) {
  float sg, sgx;
  vm::sum2_of(
      C,
      [=](int64_t c) ASPEN_VM_LAMBDA {
        const float g = gamma[c] * dy[c];
        return vm::Sum2{g, g * ((x[c] - m) * rs)};
      },
      &sg, &sgx);
  *mg = sg / float(C);
  *mgx = sgx / float(C);
}

ASPEN_VM_INLINE void ln_bwd(const Bwd& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  const float* gamma = a.gamma;
  float* acc_g = a.pg + (r0 / a.grain) * C;
  float* acc_b = a.pb + (r0 / a.grain) * C;
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) {
    acc_g[c] = 0.0f;
    acc_b[c] = 0.0f;
  }
  int64_t r = r0;
  for (; r + kRowBlock <= r1; r += kRowBlock) {
    const float *x[kRowBlock], *dy[kRowBlock];
    float* dx[kRowBlock];
    float m[kRowBlock], rs[kRowBlock], mg[kRowBlock], mgx[kRowBlock];
    for (int64_t k = 0; k < kRowBlock; ++k) {
      x[k] = a.x + (r + k) * C;
      dy[k] = a.dy + (r + k) * C;
      dx[k] = a.dx + (r + k) * C;
      m[k] = a.mean[r + k];
      rs[k] = a.rstd[r + k];
      ln_row_means(x[k], dy[k], gamma, m[k], rs[k], C, &mg[k], &mgx[k]);
    }
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      float ag = acc_g[c], ab = acc_b[c];
      for (int64_t k = 0; k < kRowBlock; ++k) {
        const float xh = (x[k][c] - m[k]) * rs[k], d = dy[k][c];
        dx[k][c] = rs[k] * (gamma[c] * d - mg[k] - xh * mgx[k]);
        ag += d * xh;
        ab += d;
      }
      acc_g[c] = ag;
      acc_b[c] = ab;
    }
  }
  for (; r < r1; ++r) {
    const float *x = a.x + r * C, *dy = a.dy + r * C;
    float* dx = a.dx + r * C;
    const float m = a.mean[r], rs = a.rstd[r];
    float mg, mgx;
    ln_row_means(x, dy, gamma, m, rs, C, &mg, &mgx);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float xh = (x[c] - m) * rs, d = dy[c];
      dx[c] = rs * (gamma[c] * d - mg - xh * mgx);
      acc_g[c] += d * xh;
      acc_b[c] += d;
    }
  }
}

// mean_c(g xhat) of one RMSNorm row, g = gamma dy.
ASPEN_VM_INLINE float rms_row_mean(const float* x, const float* dy, const float* gamma, float rs, int64_t C) {
  return vm::sum_of(C, [=](int64_t c) ASPEN_VM_LAMBDA { return gamma[c] * dy[c] * (x[c] * rs); }) / float(C);
}

ASPEN_VM_INLINE void rms_bwd(const Bwd& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  const float* gamma = a.gamma;
  float* acc_g = a.pg + (r0 / a.grain) * C;
#pragma omp simd
  for (int64_t c = 0; c < C; ++c) acc_g[c] = 0.0f;
  for (int64_t r = r0; r < r1; ++r) {
    const float *x = a.x + r * C, *dy = a.dy + r * C;
    float* dx = a.dx + r * C;
    const float rs = a.rstd[r];
    const float mgx = rms_row_mean(x, dy, gamma, rs, C);
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) {
      const float xh = x[c] * rs, d = dy[c];
      dx[c] = rs * (gamma[c] * d - xh * mgx);
      acc_g[c] += d * xh;
    }
  }
}

ASPEN_STAMP_VARIANTS(ln_bwd, Bwd)
ASPEN_STAMP_VARIANTS(rms_bwd, Bwd)

using chunks::col_sum;
using chunks::ColSum;
ASPEN_STAMP_VARIANTS(col_sum, ColSum)

#undef ASPEN_STAMP_VARIANTS

// Runs a backward body over all rows; the column sums land in dgamma (and dbeta).
void run_backward(void (*run)(const Bwd&, int64_t, int64_t, int64_t), Bwd a, int64_t R, float* dgamma, float* dbeta) {
  const int64_t C = a.C;
  if (R == 0) {
    std::fill(dgamma, dgamma + C, 0.0f);
    if (dbeta) std::fill(dbeta, dbeta + C, 0.0f);
    return;
  }
  a.grain = reduce_grain(R, C);
  const int64_t blocks = (R + a.grain - 1) / a.grain;
  std::unique_ptr<float[]> scratch;
  if (blocks == 1) {  // a single block sums straight into the outputs
    a.pg = dgamma;
    a.pb = dbeta;
  } else {
    scratch.reset(new float[(dbeta ? 2 : 1) * blocks * C]);
    a.pg = scratch.get();
    a.pb = dbeta ? scratch.get() + blocks * C : nullptr;
  }
  run(a, R, a.grain, C);
  if (blocks > 1) {
    const int64_t cgrain = std::max<int64_t>(256, kGrain / blocks);
    col_sum_run(ColSum{a.pg, dgamma, blocks, C}, C, cgrain, blocks);
    if (dbeta) col_sum_run(ColSum{a.pb, dbeta, blocks, C}, C, cgrain, blocks);
  }
}

}  // namespace

// ---- reference ---------------------------------------------------------------

namespace ref {

template <class T>
static void layernorm_row(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t C, T eps) {
  T s = 0;
  for (int64_t c = 0; c < C; ++c) s += x[c];
  const T m = s / T(C);
  T v = 0;
  for (int64_t c = 0; c < C; ++c) v += (x[c] - m) * (x[c] - m);
  const T rs = T(1) / std::sqrt(v / T(C) + eps);
  for (int64_t c = 0; c < C; ++c) y[c] = (x[c] - m) * rs * gamma[c] + beta[c];
  *mean = m;
  *rstd = rs;
}

template <class T>
void layernorm_forward(const T* x, const T* gamma, const T* beta, T* y, T* mean, T* rstd, int64_t R, int64_t C, T eps) {
  for (int64_t r = 0; r < R; ++r) layernorm_row(x + r * C, gamma, beta, y + r * C, mean + r, rstd + r, C, eps);
}

template <class T>
void layernorm_backward(const T* x, const T* gamma, const T* mean, const T* rstd, const T* dy, T* dx, T* dgamma,
                        T* dbeta, int64_t R, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dgamma[c] = dbeta[c] = T(0);
  for (int64_t r = 0; r < R; ++r) {
    const T *xr = x + r * C, *dyr = dy + r * C;
    T sg = 0, sgx = 0;
    for (int64_t c = 0; c < C; ++c) {
      const T xh = (xr[c] - mean[r]) * rstd[r];
      sg += gamma[c] * dyr[c];
      sgx += gamma[c] * dyr[c] * xh;
    }
    for (int64_t c = 0; c < C; ++c) {
      const T xh = (xr[c] - mean[r]) * rstd[r];
      dx[r * C + c] = rstd[r] * (gamma[c] * dyr[c] - sg / T(C) - xh * sgx / T(C));
      dgamma[c] += dyr[c] * xh;
      dbeta[c] += dyr[c];
    }
  }
}

template <class T>
void add_layernorm_forward(const T* x, const T* residual, const T* gamma, const T* beta, T* h, T* y, T* mean, T* rstd,
                           int64_t R, int64_t C, T eps) {
  for (int64_t i = 0; i < R * C; ++i) h[i] = x[i] + residual[i];
  layernorm_forward(h, gamma, beta, y, mean, rstd, R, C, eps);
}

template <class T>
void rmsnorm_forward(const T* x, const T* gamma, T* y, T* rstd, int64_t R, int64_t C, T eps) {
  for (int64_t r = 0; r < R; ++r) {
    const T* xr = x + r * C;
    T ss = 0;
    for (int64_t c = 0; c < C; ++c) ss += xr[c] * xr[c];
    rstd[r] = T(1) / std::sqrt(ss / T(C) + eps);
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = xr[c] * rstd[r] * gamma[c];
  }
}

template <class T>
void rmsnorm_backward(const T* x, const T* gamma, const T* rstd, const T* dy, T* dx, T* dgamma, int64_t R, int64_t C) {
  for (int64_t c = 0; c < C; ++c) dgamma[c] = T(0);
  for (int64_t r = 0; r < R; ++r) {
    const T *xr = x + r * C, *dyr = dy + r * C;
    T sgx = 0;
    for (int64_t c = 0; c < C; ++c) sgx += gamma[c] * dyr[c] * xr[c] * rstd[r];
    for (int64_t c = 0; c < C; ++c) {
      const T xh = xr[c] * rstd[r];
      dx[r * C + c] = rstd[r] * (gamma[c] * dyr[c] - xh * sgx / T(C));
      dgamma[c] += dyr[c] * xh;
    }
  }
}

#define ASPEN_INSTANTIATE(T)                                                                                           \
  template void layernorm_forward<T>(const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t, T);                   \
  template void layernorm_backward<T>(const T*, const T*, const T*, const T*, const T*, T*, T*, T*, int64_t, int64_t); \
  template void add_layernorm_forward<T>(const T*, const T*, const T*, const T*, T*, T*, T*, T*, int64_t, int64_t, T); \
  template void rmsnorm_forward<T>(const T*, const T*, T*, T*, int64_t, int64_t, T);                                   \
  template void rmsnorm_backward<T>(const T*, const T*, const T*, const T*, T*, T*, int64_t, int64_t);
ASPEN_INSTANTIATE(float)
ASPEN_INSTANTIATE(double)
#undef ASPEN_INSTANTIATE

}  // namespace ref

// ---- public kernels ----------------------------------------------------------

Status layernorm_forward(std::span<const float> x, std::span<const float> gamma, std::span<const float> beta,
                         std::span<float> y, std::span<float> mean, std::span<float> rstd, int64_t R, int64_t C,
                         float eps) {
  constexpr const char* k = "layernorm_forward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, C));
  ASPEN_RETURN_IF_ERROR(check_eps(k, eps));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "gamma", gamma, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "beta", beta, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "mean", mean, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "rstd", rstd, R));
  if (reference_mode()) {
    ref::layernorm_forward(x.data(), gamma.data(), beta.data(), y.data(), mean.data(), rstd.data(), R, C, eps);
  } else {
    const Fwd a{x.data(), nullptr, gamma.data(), beta.data(), nullptr, y.data(), mean.data(), rstd.data(), C, eps};
    ln_fwd_run(a, R, row_grain(C), C);
  }
  return Status();
}

Status layernorm_backward(std::span<const float> x, std::span<const float> gamma, std::span<const float> mean,
                          std::span<const float> rstd, std::span<const float> dy, std::span<float> dx,
                          std::span<float> dgamma, std::span<float> dbeta, int64_t R, int64_t C) {
  constexpr const char* k = "layernorm_backward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "gamma", gamma, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "mean", mean, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "rstd", rstd, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dx", dx, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dgamma", dgamma, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dbeta", dbeta, C));
  if (reference_mode()) {
    ref::layernorm_backward(x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(), dgamma.data(),
                            dbeta.data(), R, C);
  } else {
    const Bwd a{x.data(), gamma.data(), mean.data(), rstd.data(), dy.data(), dx.data(), nullptr, nullptr, C, 0};
    run_backward(ln_bwd_run, a, R, dgamma.data(), dbeta.data());
  }
  return Status();
}

Status add_layernorm_forward(std::span<const float> x, std::span<const float> residual, std::span<const float> gamma,
                             std::span<const float> beta, std::span<float> h, std::span<float> y, std::span<float> mean,
                             std::span<float> rstd, int64_t R, int64_t C, float eps) {
  constexpr const char* k = "add_layernorm_forward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, C));
  ASPEN_RETURN_IF_ERROR(check_eps(k, eps));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "residual", residual, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "gamma", gamma, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "beta", beta, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "h", h, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "mean", mean, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "rstd", rstd, R));
  if (reference_mode()) {
    ref::add_layernorm_forward(x.data(), residual.data(), gamma.data(), beta.data(), h.data(), y.data(), mean.data(),
                               rstd.data(), R, C, eps);
  } else {
    const Fwd a{x.data(), residual.data(), gamma.data(), beta.data(), h.data(),
                y.data(), mean.data(),     rstd.data(),  C,           eps};
    add_ln_fwd_run(a, R, row_grain(C), C);
  }
  return Status();
}

Status rmsnorm_forward(std::span<const float> x, std::span<const float> gamma, std::span<float> y,
                       std::span<float> rstd, int64_t R, int64_t C, float eps) {
  constexpr const char* k = "rmsnorm_forward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, C));
  ASPEN_RETURN_IF_ERROR(check_eps(k, eps));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "gamma", gamma, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "rstd", rstd, R));
  if (reference_mode()) {
    ref::rmsnorm_forward(x.data(), gamma.data(), y.data(), rstd.data(), R, C, eps);
  } else {
    const Fwd a{x.data(), nullptr, gamma.data(), nullptr, nullptr, y.data(), nullptr, rstd.data(), C, eps};
    rms_fwd_run(a, R, row_grain(C), C);
  }
  return Status();
}

Status rmsnorm_backward(std::span<const float> x, std::span<const float> gamma, std::span<const float> rstd,
                        std::span<const float> dy, std::span<float> dx, std::span<float> dgamma, int64_t R, int64_t C) {
  constexpr const char* k = "rmsnorm_backward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "gamma", gamma, C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "rstd", rstd, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dx", dx, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dgamma", dgamma, C));
  if (reference_mode()) {
    ref::rmsnorm_backward(x.data(), gamma.data(), rstd.data(), dy.data(), dx.data(), dgamma.data(), R, C);
  } else {
    const Bwd a{x.data(), gamma.data(), nullptr, rstd.data(), dy.data(), dx.data(), nullptr, nullptr, C, 0};
    run_backward(rms_bwd_run, a, R, dgamma.data(), nullptr);
  }
  return Status();
}

}  // namespace aspen::kernels
