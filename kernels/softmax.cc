#include "kernels/softmax.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>

#include "kernels/check_args.h"
#include "kernels/chunks.h"
#include "kernels/cpu.h"
#include "kernels/vec_math.h"

namespace aspen::kernels {

namespace {

// ---- argument checks -------------------------------------------------------

Status check_rows(const char* kernel, int64_t R, const char* cname, int64_t C) {
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, "R", R));
  ASPEN_RETURN_IF_ERROR(check_extent(kernel, cname, C, 1));
  if (R > INT64_MAX / C)
    return Status::invalid_argument(std::string(kernel) + ": R * " + cname, "a product that fits in int64",
                                    std::to_string(R) + " * " + std::to_string(C));
  return Status();
}

// Every target is a class in [0, V) or ignore_index; counts the non-ignored rows.
Status check_targets(const char* kernel, const int32_t* targets, int64_t R, int64_t V, int32_t ignore_index,
                     int64_t* count) {
  int64_t n = 0;
  for (int64_t r = 0; r < R; ++r) {
    const int32_t t = targets[r];
    if (t == ignore_index) continue;
    if (t < 0 || t >= V)
      return Status::error(
          Code::kOutOfRange, std::string(kernel) + ": argument 'targets' row " + std::to_string(r),
          "a class index in [0, " + std::to_string(V) + ") or ignore_index " + std::to_string(ignore_index),
          std::to_string(t));
    ++n;
  }
  *count = n;
  return Status();
}


constexpr int64_t kGrain = 1 << 14;  // elements per chunk
int64_t row_grain(int64_t C) { return std::max<int64_t>(1, kGrain / C); }

// ---- row primitives ----------------------------------------------------------

ASPEN_VM_INLINE float row_max(const float* x, int64_t n) {
  return vm::max_of(n, [x](int64_t c) ASPEN_VM_LAMBDA { return x[c]; });
}

ASPEN_VM_INLINE float row_sum_exp(const float* x, int64_t n, float shift) {
  return vm::sum_of(n, [x, shift](int64_t c) ASPEN_VM_LAMBDA { return vm::exp(x[c] - shift); });
}

// ---- softmax -----------------------------------------------------------------

struct Sm {
  const float *x, *y, *dy;  // forward reads x; backward reads y, dy
  float* out;               // y or dx
  int64_t C;
};

ASPEN_VM_INLINE void softmax_fwd(const Sm& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.x + r * C;
    float* y = a.out + r * C;
    const float m = row_max(x, C);
    // e^(x - m) goes to y (in L1 for the scaling below) as it is summed.
    const float s = vm::sum_of(C, [x, y, m](int64_t c) ASPEN_VM_LAMBDA {
      const float e = vm::exp(x[c] - m);
      y[c] = e;
      return e;
    });
    const float inv = 1.0f / s;
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) y[c] *= inv;
  }
}

ASPEN_VM_INLINE void softmax_bwd(const Sm& a, int64_t r0, int64_t r1) {
  const int64_t C = a.C;
  for (int64_t r = r0; r < r1; ++r) {
    const float *y = a.y + r * C, *dy = a.dy + r * C;
    float* dx = a.out + r * C;
    const float dot = vm::sum_of(C, [y, dy](int64_t c) ASPEN_VM_LAMBDA { return dy[c] * y[c]; });
#pragma omp simd
    for (int64_t c = 0; c < C; ++c) dx[c] = y[c] * (dy[c] - dot);
  }
}

ASPEN_STAMP_VARIANTS(softmax_fwd, Sm)
ASPEN_STAMP_VARIANTS(softmax_bwd, Sm)

// ---- cross-entropy -------------------------------------------------------------

struct Ce {
  const float* logits;
  const int32_t* targets;
  const float* lse_in;  // backward
  float *loss, *lse;    // forward
  float* dlogits;       // backward
  int64_t V;
  int32_t ignore_index;
  float scale;  // backward: dloss_scale / count
};

ASPEN_VM_INLINE void ce_fwd(const Ce& a, int64_t r0, int64_t r1) {
  const int64_t V = a.V;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.logits + r * V;
    const float m = row_max(x, V);
    const float l = m + std::log(row_sum_exp(x, V, m));
    const int32_t t = a.targets[r];
    a.lse[r] = l;
    a.loss[r] = t == a.ignore_index ? 0.0f : l - x[t];
  }
}

// One pass per row: softmax recomputed from the saved lse, scaled, one-hot subtracted.
ASPEN_VM_INLINE void ce_bwd(const Ce& a, int64_t r0, int64_t r1) {
  const int64_t V = a.V;
  const float scale = a.scale;
  for (int64_t r = r0; r < r1; ++r) {
    const float* x = a.logits + r * V;
    float* d = a.dlogits + r * V;
    const int32_t t = a.targets[r];
    if (t == a.ignore_index) {
#pragma omp simd
      for (int64_t v = 0; v < V; ++v) d[v] = 0.0f;
      continue;
    }
    const float l = a.lse_in[r];
#pragma omp simd
    for (int64_t v = 0; v < V; ++v) d[v] = vm::exp(x[v] - l) * scale;
    d[t] -= scale;
  }
}

ASPEN_STAMP_VARIANTS(ce_fwd, Ce)
ASPEN_STAMP_VARIANTS(ce_bwd, Ce)

#undef ASPEN_STAMP_VARIANTS

// The mean over non-ignored rows, summed in row order (in double).
float mean_of_rows(const float* loss, const int32_t* targets, int64_t R, int32_t ignore_index, int64_t count) {
  if (count == 0) return 0.0f;
  double total = 0.0;
  for (int64_t r = 0; r < R; ++r)
    if (targets[r] != ignore_index) total += loss[r];
  return float(total / double(count));
}

}  // namespace

// ---- reference ---------------------------------------------------------------

namespace ref {

template <class T>
void softmax_forward(const T* x, T* y, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) {
    const T* xr = x + r * C;
    T m = xr[0];
    for (int64_t c = 1; c < C; ++c) m = std::max(m, xr[c]);
    T s = 0;
    for (int64_t c = 0; c < C; ++c) s += std::exp(xr[c] - m);
    for (int64_t c = 0; c < C; ++c) y[r * C + c] = std::exp(xr[c] - m) / s;
  }
}

template <class T>
void softmax_backward(const T* y, const T* dy, T* dx, int64_t R, int64_t C) {
  for (int64_t r = 0; r < R; ++r) {
    T dot = 0;
    for (int64_t c = 0; c < C; ++c) dot += dy[r * C + c] * y[r * C + c];
    for (int64_t c = 0; c < C; ++c) dx[r * C + c] = y[r * C + c] * (dy[r * C + c] - dot);
  }
}

template <class T>
void cross_entropy_forward(const T* logits, const int32_t* targets, T* loss, T* lse, T* mean_loss, int64_t R, int64_t V,
                           int32_t ignore_index) {
  T total = 0;
  int64_t count = 0;
  for (int64_t r = 0; r < R; ++r) {
    const T* x = logits + r * V;
    T m = x[0];
    for (int64_t v = 1; v < V; ++v) m = std::max(m, x[v]);
    T s = 0;
    for (int64_t v = 0; v < V; ++v) s += std::exp(x[v] - m);
    lse[r] = m + std::log(s);
    if (targets[r] == ignore_index) {
      loss[r] = 0;
    } else {
      loss[r] = lse[r] - x[targets[r]];
      total += loss[r];
      ++count;
    }
  }
  *mean_loss = count > 0 ? total / T(count) : T(0);
}

template <class T>
void cross_entropy_backward(const T* logits, const int32_t* targets, const T* lse, T* dlogits, int64_t R, int64_t V,
                            T dloss_scale, int32_t ignore_index) {
  int64_t count = 0;
  for (int64_t r = 0; r < R; ++r) count += targets[r] != ignore_index;
  for (int64_t r = 0; r < R; ++r) {
    for (int64_t v = 0; v < V; ++v) {
      T g = 0;
      if (targets[r] != ignore_index) {
        const T onehot = v == targets[r] ? T(1) : T(0);
        g = (std::exp(logits[r * V + v] - lse[r]) - onehot) * dloss_scale / T(count);
      }
      dlogits[r * V + v] = g;
    }
  }
}

#define ASPEN_INSTANTIATE(T)                                                                               \
  template void softmax_forward<T>(const T*, T*, int64_t, int64_t);                                        \
  template void softmax_backward<T>(const T*, const T*, T*, int64_t, int64_t);                             \
  template void cross_entropy_forward<T>(const T*, const int32_t*, T*, T*, T*, int64_t, int64_t, int32_t); \
  template void cross_entropy_backward<T>(const T*, const int32_t*, const T*, T*, int64_t, int64_t, T, int32_t);
ASPEN_INSTANTIATE(float)
ASPEN_INSTANTIATE(double)
#undef ASPEN_INSTANTIATE

}  // namespace ref

// ---- public kernels ----------------------------------------------------------

Status softmax_forward(std::span<const float> x, std::span<float> y, int64_t R, int64_t C) {
  constexpr const char* k = "softmax_forward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, "C", C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, R * C));
  if (reference_mode())
    ref::softmax_forward(x.data(), y.data(), R, C);
  else
    softmax_fwd_run(Sm{x.data(), nullptr, nullptr, y.data(), C}, R, row_grain(C), C);
  return Status();
}

Status softmax_backward(std::span<const float> y, std::span<const float> dy, std::span<float> dx, int64_t R,
                        int64_t C) {
  constexpr const char* k = "softmax_backward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, "C", C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dy", dy, R * C));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dx", dx, R * C));
  if (reference_mode())
    ref::softmax_backward(y.data(), dy.data(), dx.data(), R, C);
  else
    softmax_bwd_run(Sm{nullptr, y.data(), dy.data(), dx.data(), C}, R, row_grain(C), C);
  return Status();
}

Status cross_entropy_forward(std::span<const float> logits, std::span<const int32_t> targets, std::span<float> loss,
                             std::span<float> lse, std::span<float> mean_loss, int64_t R, int64_t V,
                             int32_t ignore_index) {
  constexpr const char* k = "cross_entropy_forward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, "V", V));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "logits", logits, R * V));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "targets", targets, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "loss", loss, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "lse", lse, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "mean_loss", mean_loss, 1));
  int64_t count = 0;
  ASPEN_RETURN_IF_ERROR(check_targets(k, targets.data(), R, V, ignore_index, &count));
  if (reference_mode()) {
    ref::cross_entropy_forward(logits.data(), targets.data(), loss.data(), lse.data(), mean_loss.data(), R, V,
                               ignore_index);
    return Status();
  }
  const Ce a{logits.data(), targets.data(), nullptr, loss.data(), lse.data(), nullptr, V, ignore_index, 0.0f};
  ce_fwd_run(a, R, row_grain(V), V);
  mean_loss[0] = mean_of_rows(loss.data(), targets.data(), R, ignore_index, count);
  return Status();
}

Status cross_entropy_backward(std::span<const float> logits, std::span<const int32_t> targets,
                              std::span<const float> lse, std::span<float> dlogits, int64_t R, int64_t V,
                              float dloss_scale, int32_t ignore_index) {
  constexpr const char* k = "cross_entropy_backward";
  ASPEN_RETURN_IF_ERROR(check_rows(k, R, "V", V));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "logits", logits, R * V));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "targets", targets, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "lse", lse, R));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "dlogits", dlogits, R * V));
  int64_t count = 0;
  ASPEN_RETURN_IF_ERROR(check_targets(k, targets.data(), R, V, ignore_index, &count));
  if (reference_mode()) {
    ref::cross_entropy_backward(logits.data(), targets.data(), lse.data(), dlogits.data(), R, V, dloss_scale,
                                ignore_index);
    return Status();
  }
  // count == 0 means every row is ignored: the body writes zeros and never uses scale.
  const float scale = count > 0 ? dloss_scale / float(count) : 0.0f;
  const Ce a{logits.data(), targets.data(), lse.data(), nullptr, nullptr, dlogits.data(), V, ignore_index, scale};
  ce_bwd_run(a, R, row_grain(V), V);
  return Status();
}

}  // namespace aspen::kernels
