// kernels/conv.h: convolution, 1 to 3 spatial axes, forward and its two backward passes.
//
//   forward:          y[n, m, o] = Σ_{c in m's group, q} x[n, c, o s - pad_begin + q d] w[m, c', q] (+ bias[m])
//   backward_data:    dx = the transpose of forward in x (ONNX's ConvTranspose is this pass)
//   backward_weights: dw = the transpose of forward in w
// with x [N, C, D...], w [M, C / groups, K...], y [N, M, O...], all dense and channels-first (the IR's
// layout); positions outside x read zero. Shapes of fewer than 3 spatial axes are 3-D ones with extent 1.
//
// The fast kernels are oneDNN's primitives (Debian's oneDNN, on the calling thread's OpenMP team as the
// matmul backend): each plan lets oneDNN choose its blocked layouts and reorders the channels-first
// tensors in and out, into scratch shared by all plans of a thread (the reorders are memory-bound and a
// few percent of a layer; keeping activations blocked between layers would need a layout pass).
// bf16 and f16 run the f32 primitive on widened copies (bf16 primitives exist only on some CPUs).
#pragma once

#include <array>
#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"

namespace aspen::kernels {

struct ConvShape {
  int64_t N = 1, C = 1, M = 1, groups = 1;
  std::array<int64_t, 3> D{1, 1, 1}, K{1, 1, 1}, O{1, 1, 1};     // input, kernel, output extents
  std::array<int64_t, 3> S{1, 1, 1}, Dil{1, 1, 1};               // strides, dilations (1: dense)
  std::array<int64_t, 3> PadBegin{0, 0, 0}, PadEnd{0, 0, 0};     // >= 0
  int spatial = 2;                                               // 1 to 3 axes used

  int64_t x_numel() const { return N * C * D[0] * D[1] * D[2]; }
  int64_t w_numel() const { return M * (C / groups) * K[0] * K[1] * K[2]; }
  int64_t y_numel() const { return N * M * O[0] * O[1] * O[2]; }
  // The tensors' dimensions, channels first, with the `spatial` axes used: x [N, C, D...], w [M, C / groups,
  // K...], y [N, M, O...].
  std::vector<int64_t> x_dims() const { return with_axes(N, C, D); }
  std::vector<int64_t> w_dims() const { return with_axes(M, C / groups, K); }
  std::vector<int64_t> y_dims() const { return with_axes(N, M, O); }
  // Sets O from D, K, S, Dil and the pads: floor((D + pads - ((K - 1) Dil + 1)) / S) + 1 per axis (the
  // caller has checked that every window fits).
  void set_outputs() {
    for (size_t i = 0; i < 3; ++i) O[i] = (D[i] + PadBegin[i] + PadEnd[i] - ((K[i] - 1) * Dil[i] + 1)) / S[i] + 1;
  }
  std::string to_string() const;

 private:
  std::vector<int64_t> with_axes(int64_t a, int64_t b, const std::array<int64_t, 3>& e) const {
    std::vector<int64_t> d = {a, b};
    d.insert(d.end(), e.end() - spatial, e.end());
    return d;
  }
};

enum class ConvPass { forward, backward_data, backward_weights };

// One pass of one convolution shape in one dtype, made once (a oneDNN primitive) and run many times.
class ConvPlan {
 public:
  // dtype: f32, bf16 or f16. `bias`: forward only. `b_fixed`: operand b (the weights of forward and
  // backward_data) holds the same values on every run until b_changed(), so the plan keeps its reordered
  // (and widened) copy instead of making it on every run (inference: NOTE [fixed weights] in graph/).
  static Result<ConvPlan> make(const ConvShape& s, ConvPass pass, DType dtype, bool bias = false,
                               bool b_fixed = false);
  ConvPlan(ConvPlan&&) noexcept;
  ConvPlan& operator=(ConvPlan&&) noexcept;
  ~ConvPlan();

  // forward: (x, w, bias or null) -> y; backward_data: (dy, w) -> dx; backward_weights: (x, dy) -> dw.
  // Pointers hold elements of the plan's dtype; the output is overwritten.
  Status run(const void* a, const void* b, const void* bias, void* out);
  // b's values changed: the kept copy is made again on the next run.
  void b_changed();

  struct Impl;

 private:
  explicit ConvPlan(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

namespace ref {
// The definitions, over T (double in the interpreter), any shape; outputs overwritten.
template <class T>
void conv_forward(const ConvShape& s, const T* x, const T* w, const T* bias, T* y);
template <class T>
void conv_backward_data(const ConvShape& s, const T* dy, const T* w, T* dx);
template <class T>
void conv_backward_weights(const ConvShape& s, const T* x, const T* dy, T* dw);
}  // namespace ref

}  // namespace aspen::kernels
