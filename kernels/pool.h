// kernels/pool.h: 2-D max pooling, forward and backward, channels-first.
//
// x and dx are [N, C, H, W], y and dy [N, C, OH, OW]. Output (oh, ow) reads the window of input rows
// oh·SH - PH + kh·DH (kh < KH) and columns ow·SW - PW + kw·DW (kw < KW) that fall inside x; the rest is
// padding, which never wins. Its value is the window's maximum, found in the window's row-major scan: the
// first position inside x starts it, and a later position takes over when it is greater or NaN (so a NaN
// propagates), as torch.nn.MaxPool2d does. A window wholly in the padding gives -inf. The backward adds each
// dy to that same position of dx (one position per window: ties go to the first, as torch's indices do),
// and dx is zero elsewhere. So the gradient is exact and matches PyTorch's even where ReLU makes ties.
//
// The fast kernels run planes (n, c) in parallel (OpenMP, static); each plane is one thread's, so results do
// not depend on the thread count. Outputs are overwritten. The graph ops `max_pool` and `max_pool_grad`
// (graph/ops_pool.cc) replace the gather a pool decomposes into (NOTE [convolution as a gather]).
#pragma once

#include <cstdint>

#include "core/status.h"

namespace aspen::kernels {

struct MaxPoolShape {
  int64_t N = 1, C = 1, H = 1, W = 1, OH = 1, OW = 1;
  int64_t KH = 1, KW = 1, SH = 1, SW = 1, PH = 0, PW = 0, DH = 1, DW = 1;
};

[[nodiscard]] Status max_pool_forward(const MaxPoolShape& s, const float* x, float* y);
[[nodiscard]] Status max_pool_backward(const MaxPoolShape& s, const float* x, const float* dy, float* dx);

namespace ref {
template <class T>
void max_pool_forward(const MaxPoolShape& s, const T* x, T* y);
template <class T>
void max_pool_backward(const MaxPoolShape& s, const T* x, const T* dy, T* dx);
}  // namespace ref

}  // namespace aspen::kernels
