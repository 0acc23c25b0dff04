// kernels/conv.cc: the convolution references and the oneDNN plans of kernels/conv.h.
#include "kernels/conv.h"

#include <dnnl.hpp>

#include <cstring>
#include <unordered_map>
#include <vector>

#include "core/tensor.h"
#include "core/weight_copies.h"
#include "kernels/convert.h"
#include "kernels/cpu.h"
#include "kernels/scratch.h"

namespace aspen::kernels {

std::string ConvShape::to_string() const {
  auto axes = [&](const std::array<int64_t, 3>& v) {
    std::string t = "[";
    for (int i = 3 - spatial; i < 3; ++i) t += (i > 3 - spatial ? ", " : "") + std::to_string(v[size_t(i)]);
    return t + "]";
  };
  return "conv N " + std::to_string(N) + " C " + std::to_string(C) + " M " + std::to_string(M) + " groups " +
         std::to_string(groups) + " input " + axes(D) + " kernel " + axes(K) + " output " + axes(O) + " strides " +
         axes(S) + " dilations " + axes(Dil) + " pads " + axes(PadBegin) + " " + axes(PadEnd);
}

// ---- references --------------------------------------------------------------------------------------------

namespace ref {
namespace {

// Calls f(x index, w index, y index) for every product term of the convolution: output position o, kernel
// offset q and input channel c of m's group, where the input position is inside x. Spatial axes are the
// last `spatial` of the three (the others extent 1).
template <class F>
void for_each_term(const ConvShape& s, F f) {
  const int64_t G = s.groups, Cg = s.C / G, Mg = s.M / G;
  const int64_t pD = s.D[0] * s.D[1] * s.D[2], pK = s.K[0] * s.K[1] * s.K[2], pO = s.O[0] * s.O[1] * s.O[2];
  for (int64_t n = 0; n < s.N; ++n)
    for (int64_t m = 0; m < s.M; ++m) {
      const int64_t g = m / Mg;
      for (int64_t o0 = 0; o0 < s.O[0]; ++o0)
        for (int64_t o1 = 0; o1 < s.O[1]; ++o1)
          for (int64_t o2 = 0; o2 < s.O[2]; ++o2) {
            const int64_t yi = (n * s.M + m) * pO + (o0 * s.O[1] + o1) * s.O[2] + o2;
            for (int64_t q0 = 0; q0 < s.K[0]; ++q0) {
              const int64_t i0 = o0 * s.S[0] - s.PadBegin[0] + q0 * s.Dil[0];
              if (i0 < 0 || i0 >= s.D[0]) continue;
              for (int64_t q1 = 0; q1 < s.K[1]; ++q1) {
                const int64_t i1 = o1 * s.S[1] - s.PadBegin[1] + q1 * s.Dil[1];
                if (i1 < 0 || i1 >= s.D[1]) continue;
                for (int64_t q2 = 0; q2 < s.K[2]; ++q2) {
                  const int64_t i2 = o2 * s.S[2] - s.PadBegin[2] + q2 * s.Dil[2];
                  if (i2 < 0 || i2 >= s.D[2]) continue;
                  const int64_t at = (i0 * s.D[1] + i1) * s.D[2] + i2, q = (q0 * s.K[1] + q1) * s.K[2] + q2;
                  for (int64_t c = 0; c < Cg; ++c)
                    f((n * s.C + g * Cg + c) * pD + at, (m * Cg + c) * pK + q, yi);
                }
              }
            }
          }
    }
}

}  // namespace

template <class T>
void conv_forward(const ConvShape& s, const T* x, const T* w, const T* bias, T* y) {
  const int64_t pO = s.O[0] * s.O[1] * s.O[2];
  for (int64_t i = 0; i < s.y_numel(); ++i) y[i] = bias ? bias[(i / pO) % s.M] : T(0);
  for_each_term(s, [&](int64_t xi, int64_t wi, int64_t yi) { y[yi] += x[xi] * w[wi]; });
}

template <class T>
void conv_backward_data(const ConvShape& s, const T* dy, const T* w, T* dx) {
  for (int64_t i = 0; i < s.x_numel(); ++i) dx[i] = T(0);
  for_each_term(s, [&](int64_t xi, int64_t wi, int64_t yi) { dx[xi] += dy[yi] * w[wi]; });
}

template <class T>
void conv_backward_weights(const ConvShape& s, const T* x, const T* dy, T* dw) {
  for (int64_t i = 0; i < s.w_numel(); ++i) dw[i] = T(0);
  for_each_term(s, [&](int64_t xi, int64_t wi, int64_t yi) { dw[wi] += x[xi] * dy[yi]; });
}

#define ASPEN_CONV_REF(T)                                                                 \
  template void conv_forward<T>(const ConvShape&, const T*, const T*, const T*, T*);      \
  template void conv_backward_data<T>(const ConvShape&, const T*, const T*, T*);          \
  template void conv_backward_weights<T>(const ConvShape&, const T*, const T*, T*);
ASPEN_CONV_REF(float)
ASPEN_CONV_REF(double)
#undef ASPEN_CONV_REF

}  // namespace ref

// ---- oneDNN plans ------------------------------------------------------------------------------------------

namespace {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

// The run's scratch slots (kernels/scratch.h): the blocked copies of a, b and out, the widened copies of a,
// b and the bias, the f32 out before it is narrowed, and the primitive's own scratchpad.
enum Slot { kBlockedA, kBlockedB, kBlockedOut, kWideA, kWideB, kWideBias, kWideOut, kPrimitive };

// NOTE [oneDNN scratchpads]: a primitive's own temporary memory (the backward-weights reduction buffers, the
// jit kernels' workspaces) is ours to give (scratchpad_mode::user): left to oneDNN (Debian builds it for
// concurrent execution), every execute allocated it afresh, and a large block from malloc is a fresh mmap,
// so every run faulted its pages in again: in the PopTorch pipelining tutorial's network about 700 page
// faults per micro-batch, a third of its time. Given from the thread's scratch slot, it is kept.
dnnl::primitive_attr user_scratchpad() {
  dnnl::primitive_attr attr;
  attr.set_scratchpad_mode(dnnl::scratchpad_mode::user);
  return attr;
}

// The used spatial axes of v (minus `minus`: oneDNN counts dilations from 0).
dnnl::memory::dims tail(const std::array<int64_t, 3>& v, int k, int64_t minus = 0) {
  dnnl::memory::dims d;
  for (int i = 3 - k; i < 3; ++i) d.push_back(v[size_t(i)] - minus);
  return d;
}

}  // namespace

struct ConvPlan::Impl {
  ConvShape s;
  DType dtype = DType::f32;
  bool bias = false;
  dnnl::stream stream;
  dnnl::primitive prim;
  // Operands in order a, b, out: the plain (user) layout, the primitive's, and the primitive's argument.
  dnnl::memory::desc user[3], chosen[3];
  int arg[3] = {};
  dnnl::memory::desc bias_md;
  int64_t numel[3] = {};  // elements of a, b, out
  dnnl::reorder reorder[3];  // plain to chosen for a and b, chosen to plain for out, where they differ
  bool b_fixed = false, b_ready = false;
  bool through[3] = {};  // the operand goes through a buffer in the chosen layout (reordered or kept)
  Tensor b_kept;         // b in the primitive's layout, f32 (b_fixed); counted (count_kernel_copy_bytes)
  ~Impl() { count_kernel_copy_bytes(-int64_t(b_kept.nbytes())); }
  // Memory objects made once; each run points them at its buffers (set_data_handle).
  dnnl::memory user_mem[3], chosen_mem[3], bias_mem;
  dnnl::memory::desc scratch_md;  // the primitive's scratchpad (NOTE [oneDNN scratchpads])
  dnnl::memory scratch_mem;
  std::unordered_map<int, dnnl::memory> args;
};

ConvPlan::ConvPlan(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
ConvPlan::ConvPlan(ConvPlan&&) noexcept = default;
ConvPlan& ConvPlan::operator=(ConvPlan&&) noexcept = default;
ConvPlan::~ConvPlan() = default;

void ConvPlan::b_changed() { impl_->b_ready = false; }

Result<ConvPlan> ConvPlan::make(const ConvShape& s, ConvPass pass, DType dtype, bool bias, bool b_fixed) {
  if (dtype != DType::f32 && dtype != DType::bf16 && dtype != DType::f16)
    return Status::error(Code::kUnimplemented, "convolution", "f32, bf16 or f16", std::string(dtype_name(dtype)));
  if (s.spatial < 1 || s.spatial > 3 || s.groups < 1 || s.C % s.groups != 0 || s.M % s.groups != 0)
    return Status::error(Code::kInvalidArgument, "convolution", "1 to 3 spatial axes, channels a multiple of groups",
                         s.to_string());
  using tag = dnnl::memory::format_tag;
  using dt = dnnl::memory::data_type;
  using dims = dnnl::memory::dims;
  const int k = s.spatial;
  const int64_t G = s.groups;
  const dims x_dims = s.x_dims(), y_dims = s.y_dims();
  dims w_dims = s.w_dims();  // grouped: [G, M / G, C / G, K...]
  if (G > 1) w_dims.insert(w_dims.begin(), G), w_dims[1] /= G;
  const tag act = k == 1 ? tag::ncw : k == 2 ? tag::nchw : tag::ncdhw;
  const tag wt = G == 1 ? (k == 1 ? tag::oiw : k == 2 ? tag::oihw : tag::oidhw)
                        : (k == 1 ? tag::goiw : k == 2 ? tag::goihw : tag::goidhw);
  const dnnl::memory::desc x_user(x_dims, dt::f32, act), y_user(y_dims, dt::f32, act), w_user(w_dims, dt::f32, wt);
  // NOTE [channels-last backward]: the backward passes of a 2-D convolution whose input channels are not a
  // multiple of the AVX-512 block (16), from 4 up, run on channels-last (nhwc) activations instead of the
  // layout oneDNN picks (blocked by 16 channels, padded): with 10 channels, the PopTorch pipelining tutorial's
  // second layer, oneDNN's own pick fell back to its AVX2 kernel for the weights' gradient, 0.61 ms against
  // 0.38 ms on nhwc, and the data gradient took 0.57 ms against 0.35 (1 thread, Zen 4; with 5 and 24 channels
  // nhwc was 1.4x faster too, with 16, 32 and 64 the same, with 1 and 3 slower, so those keep oneDNN's pick).
  // A rule of the shape and the ISA (measured on AVX-512 only), never of a timing: the choice is the run's.
  const bool channels_last = pass != ConvPass::forward && k == 2 && G == 1 && s.C >= 4 && s.C % 16 != 0 &&
                             active_isa() >= Isa::avx512;
  const tag act_any = channels_last ? tag::nhwc : tag::any;
  const dnnl::memory::desc x_any(x_dims, dt::f32, act_any), y_any(y_dims, dt::f32, act_any),
      w_any(w_dims, dt::f32, tag::any);
  const dnnl::memory::desc b_md({s.M}, dt::f32, tag::x);
  const dims strides = tail(s.S, k), dilates = tail(s.Dil, k, 1), pl = tail(s.PadBegin, k), pr = tail(s.PadEnd, k);
  const auto alg = dnnl::algorithm::convolution_direct;

  auto impl = std::make_unique<Impl>();
  impl->s = s;
  impl->dtype = dtype;
  impl->bias = bias && pass == ConvPass::forward;
  impl->bias_md = b_md;
  impl->b_fixed = b_fixed && pass != ConvPass::backward_weights;
  try {
    impl->stream = dnnl::stream(engine());
    // Fixed weights mean inference (brgconv kernels, weights reordered once); otherwise the training
    // forward, whose weights layout is the one backward_weights writes (fewer distinct reorders).
    const auto prop = impl->b_fixed && pass == ConvPass::forward ? dnnl::prop_kind::forward_inference
                                                                 : dnnl::prop_kind::forward_training;
    const dnnl::convolution_forward::desc fwd_desc =
        impl->bias ? dnnl::convolution_forward::desc(prop, alg, x_any, w_any, b_md, y_any, strides, dilates, pl, pr)
                   : dnnl::convolution_forward::desc(prop, alg, x_any, w_any, y_any, strides, dilates, pl, pr);
    const dnnl::convolution_forward::primitive_desc fwd(fwd_desc, user_scratchpad(), engine());
    switch (pass) {
      case ConvPass::forward:
        impl->prim = dnnl::convolution_forward(fwd);
        impl->scratch_md = fwd.scratchpad_desc();
        impl->user[0] = x_user, impl->user[1] = w_user, impl->user[2] = y_user;
        impl->chosen[0] = fwd.src_desc(), impl->chosen[1] = fwd.weights_desc(), impl->chosen[2] = fwd.dst_desc();
        impl->arg[0] = DNNL_ARG_SRC, impl->arg[1] = DNNL_ARG_WEIGHTS, impl->arg[2] = DNNL_ARG_DST;
        break;
      case ConvPass::backward_data: {
        const dnnl::convolution_backward_data::primitive_desc pd(
            dnnl::convolution_backward_data::desc(alg, x_any, w_any, y_any, strides, dilates, pl, pr),
            user_scratchpad(), engine(), fwd);
        impl->prim = dnnl::convolution_backward_data(pd);
        impl->scratch_md = pd.scratchpad_desc();
        impl->user[0] = y_user, impl->user[1] = w_user, impl->user[2] = x_user;
        impl->chosen[0] = pd.diff_dst_desc(), impl->chosen[1] = pd.weights_desc(), impl->chosen[2] = pd.diff_src_desc();
        impl->arg[0] = DNNL_ARG_DIFF_DST, impl->arg[1] = DNNL_ARG_WEIGHTS, impl->arg[2] = DNNL_ARG_DIFF_SRC;
        break;
      }
      case ConvPass::backward_weights: {
        const dnnl::convolution_backward_weights::primitive_desc pd(
            dnnl::convolution_backward_weights::desc(alg, x_any, w_any, y_any, strides, dilates, pl, pr),
            user_scratchpad(), engine(), fwd);
        impl->prim = dnnl::convolution_backward_weights(pd);
        impl->scratch_md = pd.scratchpad_desc();
        impl->user[0] = x_user, impl->user[1] = y_user, impl->user[2] = w_user;
        impl->chosen[0] = pd.src_desc(), impl->chosen[1] = pd.diff_dst_desc(),
        impl->chosen[2] = pd.diff_weights_desc();
        impl->arg[0] = DNNL_ARG_SRC, impl->arg[1] = DNNL_ARG_DIFF_DST, impl->arg[2] = DNNL_ARG_DIFF_WEIGHTS;
        break;
      }
    }
  } catch (const dnnl::error& e) {
    return Status::error(Code::kUnimplemented, s.to_string(), "a shape oneDNN can run",
                         std::string("oneDNN refused it: ") + e.what());
  }
  try {
    Impl& p = *impl;
    for (int i = 0; i < 3; ++i) {
      p.numel[i] = int64_t(p.user[i].get_size() / sizeof(float));
      p.user_mem[i] = dnnl::memory(p.user[i], engine(), DNNL_MEMORY_NONE);
      p.chosen_mem[i] = dnnl::memory(p.chosen[i], engine(), DNNL_MEMORY_NONE);
      // Kept: fixed weights not already the primitive's f32 (a widened copy, or another layout).
      const bool keep = i == 1 && p.b_fixed && !(p.dtype == DType::f32 && p.chosen[1] == p.user[1]);
      p.through[i] = keep || !(p.chosen[i] == p.user[i]);
      p.args.emplace(p.arg[i], p.through[i] ? p.chosen_mem[i] : p.user_mem[i]);
      if (p.chosen[i] == p.user[i]) continue;
      const dnnl::memory::desc &from = i < 2 ? p.user[i] : p.chosen[i], &to = i < 2 ? p.chosen[i] : p.user[i];
      p.reorder[i] = dnnl::reorder(dnnl::reorder::primitive_desc(engine(), from, engine(), to));
    }
    if (p.bias) {
      p.bias_mem = dnnl::memory(p.bias_md, engine(), DNNL_MEMORY_NONE);
      p.args.emplace(DNNL_ARG_BIAS, p.bias_mem);
    }
    if (p.scratch_md.get_size() > 0) {
      p.scratch_mem = dnnl::memory(p.scratch_md, engine(), DNNL_MEMORY_NONE);
      p.args.emplace(DNNL_ARG_SCRATCHPAD, p.scratch_mem);
    }
  } catch (const dnnl::error& e) {
    return Status::error(Code::kUnimplemented, s.to_string(), "layouts oneDNN can reorder",
                         std::string("oneDNN refused them: ") + e.what());
  }
  return ConvPlan(std::move(impl));
}

Status ConvPlan::run(const void* a, const void* b, const void* bias, void* out) {
  Impl& p = *impl_;
  const void* src[2] = {a, b};
  auto no_memory = [] { return Status::error(Code::kOutOfRange, "convolution scratch", "memory", "none left"); };
  // Widened copies of bf16 / f16 operands (the f32 primitive runs them).
  auto widen = [&](const void* v, int64_t n, int slot) -> Result<const float*> {
    if (p.dtype == DType::f32) return static_cast<const float*>(v);
    float* w = op_scratch_of<float>(slot, n);
    if (!w) return no_memory();
    ASPEN_RETURN_IF_ERROR(widen_to_f32(p.dtype, v, w, n));
    return static_cast<const float*>(w);
  };
  try {
    for (int i = 0; i < 2; ++i) {
      const bool keep = i == 1 && p.through[1] && p.b_fixed;
      if (keep && p.b_ready) continue;  // chosen_mem[1] points at the kept copy
      ASPEN_ASSIGN_OR_RETURN(const float* f, widen(src[i], p.numel[i], i == 0 ? kWideA : kWideB));
      p.user_mem[i].set_data_handle(const_cast<float*>(f));
      if (!p.through[i]) continue;
      const size_t bytes = p.chosen[i].get_size();
      if (keep && (p.b_kept.raw() == nullptr || p.b_kept.nbytes() < bytes)) {
        const int64_t had = int64_t(p.b_kept.nbytes());
        ASPEN_ASSIGN_OR_RETURN(p.b_kept, Tensor::make(DType::f32, Shape{int64_t((bytes + 3) / 4)}));
        count_kernel_copy_bytes(int64_t(p.b_kept.nbytes()) - had);
      }
      void* buf = keep ? p.b_kept.raw() : op_scratch(i == 0 ? kBlockedA : kBlockedB, bytes);
      if (!buf) return no_memory();
      p.chosen_mem[i].set_data_handle(buf);
      if (p.chosen[i] == p.user[i]) {
        std::memcpy(buf, f, p.chosen[i].get_size());
      } else {
        p.reorder[i].execute(p.stream, p.user_mem[i], p.chosen_mem[i]);
      }
      p.b_ready = p.b_ready || keep;
    }
    if (p.bias) {
      ASPEN_ASSIGN_OR_RETURN(const float* f, widen(bias, p.s.M, kWideBias));
      p.bias_mem.set_data_handle(const_cast<float*>(f));
    }
    void* out32 = p.dtype == DType::f32 ? out : op_scratch_of<float>(kWideOut, p.numel[2]);
    if (!out32) return no_memory();
    p.user_mem[2].set_data_handle(out32);
    if (p.through[2]) {
      void* buf = op_scratch(kBlockedOut, p.chosen[2].get_size());
      if (!buf) return no_memory();
      p.chosen_mem[2].set_data_handle(buf);
    }
    if (p.scratch_md.get_size() > 0) {
      void* buf = op_scratch(kPrimitive, p.scratch_md.get_size());
      if (!buf) return no_memory();
      p.scratch_mem.set_data_handle(buf);
    }
    p.prim.execute(p.stream, p.args);
    if (p.through[2]) p.reorder[2].execute(p.stream, p.chosen_mem[2], p.user_mem[2]);
    p.stream.wait();
    if (p.dtype != DType::f32) return narrow_from_f32(p.dtype, static_cast<const float*>(out32), out, p.numel[2]);
  } catch (const dnnl::error& e) {
    return Status::error(Code::kInternal, p.s.to_string(), "oneDNN to run it", std::string("it failed: ") + e.what());
  }
  return Status();
}

}  // namespace aspen::kernels
