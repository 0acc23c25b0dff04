#include "kernels/pool.h"

#include <cmath>
#include <limits>
#include <string>

#include "kernels/cpu.h"

namespace aspen::kernels {

namespace {

Status check(const MaxPoolShape& s, const char* k) {
  const bool ok = s.N >= 1 && s.C >= 1 && s.H >= 1 && s.W >= 1 && s.OH >= 1 && s.OW >= 1 && s.KH >= 1 &&
                  s.KW >= 1 && s.SH >= 1 && s.SW >= 1 && s.PH >= 0 && s.PW >= 0 && s.DH >= 1 && s.DW >= 1;
  if (!ok)
    return Status::invalid_argument(std::string(k) + ": shape",
                                    "extents, kernel, strides and dilations >= 1, pads >= 0",
                                    "N " + std::to_string(s.N) + ", C " + std::to_string(s.C) + ", " +
                                        std::to_string(s.H) + "x" + std::to_string(s.W) + " -> " +
                                        std::to_string(s.OH) + "x" + std::to_string(s.OW));
  return Status();
}

// The position (into the plane) of window (oh, ow)'s maximum, -1 for a window wholly in the padding.
template <class T>
int64_t argmax(const MaxPoolShape& s, const T* plane, int64_t oh, int64_t ow) {
  int64_t best = -1;
  T m = T(0);
  for (int64_t kh = 0; kh < s.KH; ++kh) {
    const int64_t h = oh * s.SH - s.PH + kh * s.DH;
    if (h < 0 || h >= s.H) continue;
    for (int64_t kw = 0; kw < s.KW; ++kw) {
      const int64_t w = ow * s.SW - s.PW + kw * s.DW;
      if (w < 0 || w >= s.W) continue;
      const T v = plane[h * s.W + w];
      if (best < 0 || v > m || std::isnan(v)) best = h * s.W + w, m = v;
    }
  }
  return best;
}

template <class T>
void forward_plane(const MaxPoolShape& s, int64_t p, const T* x, T* y) {
  const T* in = x + p * s.H * s.W;
  T* out = y + p * s.OH * s.OW;
  for (int64_t oh = 0; oh < s.OH; ++oh)
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      const int64_t at = argmax(s, in, oh, ow);
      out[oh * s.OW + ow] = at < 0 ? -std::numeric_limits<T>::infinity() : in[at];
    }
}

template <class T>
void backward_plane(const MaxPoolShape& s, int64_t p, const T* x, const T* dy, T* dx) {
  const T* in = x + p * s.H * s.W;
  const T* g = dy + p * s.OH * s.OW;
  T* d = dx + p * s.H * s.W;
  for (int64_t i = 0; i < s.H * s.W; ++i) d[i] = T(0);
  for (int64_t oh = 0; oh < s.OH; ++oh)
    for (int64_t ow = 0; ow < s.OW; ++ow) {
      const int64_t at = argmax(s, in, oh, ow);
      if (at >= 0) d[at] += g[oh * s.OW + ow];
    }
}

// Each plane is one thread's; small pools stay on the calling thread.
bool parallel(const MaxPoolShape& s) { return s.N * s.C > 1 && s.N * s.C * s.H * s.W >= 4096 && !reference_mode(); }

}  // namespace

namespace ref {
template <class T>
void max_pool_forward(const MaxPoolShape& s, const T* x, T* y) {
  for (int64_t p = 0; p < s.N * s.C; ++p) forward_plane(s, p, x, y);
}
template <class T>
void max_pool_backward(const MaxPoolShape& s, const T* x, const T* dy, T* dx) {
  for (int64_t p = 0; p < s.N * s.C; ++p) backward_plane(s, p, x, dy, dx);
}
template void max_pool_forward<float>(const MaxPoolShape&, const float*, float*);
template void max_pool_forward<double>(const MaxPoolShape&, const double*, double*);
template void max_pool_backward<float>(const MaxPoolShape&, const float*, const float*, float*);
template void max_pool_backward<double>(const MaxPoolShape&, const double*, const double*, double*);
}  // namespace ref

Status max_pool_forward(const MaxPoolShape& s, const float* x, float* y) {
  ASPEN_RETURN_IF_ERROR(check(s, "max_pool_forward"));
#pragma omp parallel for schedule(static) if (parallel(s))
  for (int64_t p = 0; p < s.N * s.C; ++p) forward_plane(s, p, x, y);
  return Status();
}

Status max_pool_backward(const MaxPoolShape& s, const float* x, const float* dy, float* dx) {
  ASPEN_RETURN_IF_ERROR(check(s, "max_pool_backward"));
#pragma omp parallel for schedule(static) if (parallel(s))
  for (int64_t p = 0; p < s.N * s.C; ++p) backward_plane(s, p, x, dy, dx);
  return Status();
}

}  // namespace aspen::kernels
