#include "kernels/matmul.h"

#include <omp.h>

#include <dnnl.hpp>
#include <unordered_map>

#include "core/check.h"
#include "kernels/check_args.h"
#include "kernels/cpu.h"

namespace aspen::kernels {

std::string MatmulShape::to_string() const {
  std::string s;
  s.append("[").append(std::to_string(batch)).append("] ").append(std::to_string(M)).append("x");
  s.append(std::to_string(K)).append("x").append(std::to_string(N)).append(" ").append(dtype_name(input));
  if (trans_a) s += " a^T";
  if (trans_b) s += " b^T";
  if (broadcast_b) s += " shared-b";
  if (has_bias) s += " +bias";
  if (beta != 0.0f) s += " +=c";
  return s;
}

namespace {

Status validate(const MatmulShape& s) {
  const char* k = "matmul";
  ASPEN_RETURN_IF_ERROR(check_extent(k, "batch", s.batch, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "M", s.M, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "N", s.N, 1));
  ASPEN_RETURN_IF_ERROR(check_extent(k, "K", s.K, 1));
  if (s.beta != 0.0f && s.beta != 1.0f)
    return Status::invalid_argument("matmul: beta", "0 or 1", std::to_string(s.beta));
  if (s.input != DType::f32 && s.input != DType::bf16)
    return Status::error(Code::kUnimplemented, "matmul: input dtype", "f32 or bf16",
                         std::string(dtype_name(s.input)));
  return Status();
}

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

}  // namespace

struct MatmulPlan::Impl {
  dnnl::matmul prim;
  dnnl::stream stream;
  dnnl::memory a, b, bias, c;
  std::unordered_map<int, dnnl::memory> args;  // the same handles, bound once
};

MatmulPlan::MatmulPlan(MatmulPlan&&) noexcept = default;
MatmulPlan& MatmulPlan::operator=(MatmulPlan&&) noexcept = default;
MatmulPlan::~MatmulPlan() = default;

Result<MatmulPlan> MatmulPlan::create(const MatmulShape& s) {
  ASPEN_RETURN_IF_ERROR(validate(s));
  using dims = dnnl::memory::dims;
  using dt = dnnl::memory::data_type;
  const dt in = s.input == DType::bf16 ? dt::bf16 : dt::f32;
  const int64_t B = s.batch, M = s.M, N = s.N, K = s.K;
  // Logical shapes are [batch, rows, cols]; transposition is expressed by
  // strides. A single product uses 2-D descriptors: oneDNN picks different
  // (for M = 1, faster) kernels for them than for a batch of one.
  const int64_t bb = s.broadcast_b ? 1 : B;
  const bool flat = B == 1;
  auto md = [&](int64_t batch, int64_t rows, int64_t cols, dt type, bool transposed) {
    dims strides = transposed ? dims{rows * cols, 1, rows} : dims{rows * cols, cols, 1};
    if (flat) return dnnl::memory::desc({rows, cols}, type, dims{strides[1], strides[2]});
    return dnnl::memory::desc({batch, rows, cols}, type, strides);
  };
  dnnl::memory::desc a_md = md(B, M, K, in, s.trans_a);
  dnnl::memory::desc b_md = md(bb, K, N, in, s.trans_b);
  dnnl::memory::desc c_md = md(B, M, N, dt::f32, false);
  dnnl::memory::desc bias_md = md(1, 1, N, dt::f32, false);
  dnnl::primitive_attr attr;
  if (s.beta == 1.0f) {
    dnnl::post_ops ops;
    ops.append_sum(1.0f);
    attr.set_post_ops(ops);
  }
  MatmulPlan plan;
  plan.shape_ = s;
  plan.team_size_ = omp_get_max_threads();
  plan.impl_ = std::make_unique<Impl>();
  try {
    auto desc = s.has_bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
    dnnl::matmul::primitive_desc pd(desc, attr, engine());
    plan.impl_->prim = dnnl::matmul(pd);
    plan.impl_->stream = dnnl::stream(engine());
    plan.impl_->a = dnnl::memory(a_md, engine(), DNNL_MEMORY_NONE);
    plan.impl_->b = dnnl::memory(b_md, engine(), DNNL_MEMORY_NONE);
    plan.impl_->c = dnnl::memory(c_md, engine(), DNNL_MEMORY_NONE);
    plan.impl_->args = {{DNNL_ARG_SRC, plan.impl_->a}, {DNNL_ARG_WEIGHTS, plan.impl_->b}, {DNNL_ARG_DST, plan.impl_->c}};
    if (s.has_bias) {
      plan.impl_->bias = dnnl::memory(bias_md, engine(), DNNL_MEMORY_NONE);
      plan.impl_->args.emplace(DNNL_ARG_BIAS, plan.impl_->bias);
    }
  } catch (const dnnl::error& e) {
    return Status::error(Code::kUnimplemented, "matmul " + s.to_string(), "a shape oneDNN can run",
                         std::string("oneDNN refused it: ") + e.what());
  }
  return plan;
}

void MatmulPlan::run(const void* a, const void* b, const float* bias, float* c) {
  Impl& p = *impl_;
  p.a.set_data_handle(const_cast<void*>(a));
  p.b.set_data_handle(const_cast<void*>(b));
  p.c.set_data_handle(c);
  if (shape_.has_bias) p.bias.set_data_handle(const_cast<float*>(bias));
  p.prim.execute(p.stream, p.args);
  p.stream.wait();
}

namespace {

struct ShapeHash {
  size_t operator()(const std::pair<MatmulShape, int>& k) const {
    const MatmulShape& s = k.first;
    size_t h = std::hash<int64_t>()(s.batch);
    for (int64_t v : {s.M, s.N, s.K, int64_t(s.trans_a), int64_t(s.trans_b), int64_t(s.broadcast_b),
                      int64_t(s.has_bias), int64_t(s.beta != 0), int64_t(s.input), int64_t(k.second)})
      h = h * 1000003u ^ std::hash<int64_t>()(v);
    return h;
  }
};

using PlanCache = std::unordered_map<std::pair<MatmulShape, int>, MatmulPlan, ShapeHash>;
PlanCache& plan_cache() {
  thread_local PlanCache cache;
  return cache;
}

template <class In>
Status checked_matmul(std::span<const In> a, std::span<const In> b, std::span<const float> bias, std::span<float> c,
                      const MatmulShape& shape) {
  ASPEN_RETURN_IF_ERROR(validate(shape));
  if (shape.input != dtype_of<In>())
    return Status::invalid_argument("matmul: shape.input", std::string(dtype_name(dtype_of<In>())) + " (the buffers' type)",
                                    std::string(dtype_name(shape.input)));
  ASPEN_RETURN_IF_ERROR(check_buffer("matmul", "a", a, shape.a_elements()));
  ASPEN_RETURN_IF_ERROR(check_buffer("matmul", "b", b, shape.b_elements()));
  ASPEN_RETURN_IF_ERROR(check_buffer("matmul", "c", c, shape.c_elements()));
  if (shape.has_bias) ASPEN_RETURN_IF_ERROR(check_buffer("matmul", "bias", bias, shape.N));
  if (reference_mode()) {
    ref::matmul<In, float>(a.data(), b.data(), shape.has_bias ? bias.data() : nullptr, c.data(), shape);
    return Status();
  }
  auto key = std::make_pair(shape, omp_get_max_threads());
  PlanCache& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) {
    ASPEN_ASSIGN_OR_RETURN(MatmulPlan plan, MatmulPlan::create(shape));
    it = cache.emplace(key, std::move(plan)).first;
  }
  it->second.run(a.data(), b.data(), shape.has_bias ? bias.data() : nullptr, c.data());
  return Status();
}

inline float load(float v) { return v; }
inline double load(double v) { return v; }
inline float load(bf16 v) { return bf16_to_f32(v); }

}  // namespace

Status matmul(std::span<const float> a, std::span<const float> b, std::span<const float> bias, std::span<float> c,
              const MatmulShape& shape) {
  return checked_matmul<float>(a, b, bias, c, shape);
}

Status matmul(std::span<const bf16> a, std::span<const bf16> b, std::span<const float> bias, std::span<float> c,
              const MatmulShape& shape) {
  return checked_matmul<bf16>(a, b, bias, c, shape);
}

size_t matmul_cache_size() { return plan_cache().size(); }

namespace ref {

template <class In, class Acc>
void matmul(const In* a, const In* b, const Acc* bias, Acc* c, const MatmulShape& s) {
  const int64_t M = s.M, N = s.N, K = s.K;
  for (int64_t p = 0; p < s.batch; ++p) {
    const In* ap = a + p * M * K;
    const In* bp = b + (s.broadcast_b ? 0 : p * K * N);
    Acc* cp = c + p * M * N;
    for (int64_t i = 0; i < M; ++i) {
      for (int64_t j = 0; j < N; ++j) {
        Acc acc = 0;
        for (int64_t k = 0; k < K; ++k) {
          Acc x = Acc(load(s.trans_a ? ap[k * M + i] : ap[i * K + k]));
          Acc y = Acc(load(s.trans_b ? bp[j * K + k] : bp[k * N + j]));
          acc += x * y;
        }
        if (bias) acc += bias[j];
        cp[i * N + j] = (s.beta != 0 ? cp[i * N + j] : Acc(0)) + acc;
      }
    }
  }
}

template void matmul<float, float>(const float*, const float*, const float*, float*, const MatmulShape&);
template void matmul<double, double>(const double*, const double*, const double*, double*, const MatmulShape&);
template void matmul<bf16, float>(const bf16*, const bf16*, const float*, float*, const MatmulShape&);

}  // namespace ref

}  // namespace aspen::kernels
