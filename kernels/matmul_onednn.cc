// kernels/matmul_onednn.cc: the oneDNN backend of MatmulPlan (f32 and bf16).
//
// One dnnl::matmul primitive per plan, made for the calling thread's OpenMP
// team (Debian's oneDNN runs on OpenMP: the team's pool, docs/threading.md).
// Transposes are strides, bias is the primitive's bias and beta = 1 a sum
// post-op, so a run is one execute on pointers bound into memory objects the
// plan owns.
#include <dnnl.hpp>
#include <unordered_map>

#include "kernels/matmul_backend.h"

namespace aspen::kernels {

namespace {

dnnl::engine& engine() {
  static dnnl::engine e(dnnl::engine::kind::cpu, 0);
  return e;
}

class OneDnnPlan final : public MatmulPlan::Impl {
 public:
  void run(const void* a, const void* b, const float* bias, float* c) override {
    a_.set_data_handle(const_cast<void*>(a));
    b_.set_data_handle(const_cast<void*>(b));
    c_.set_data_handle(c);
    if (has_bias_) bias_.set_data_handle(const_cast<float*>(bias));
    prim_.execute(stream_, args_);
    stream_.wait();
  }

  dnnl::matmul prim_;
  dnnl::stream stream_;
  dnnl::memory a_, b_, bias_, c_;
  std::unordered_map<int, dnnl::memory> args_;  // the same handles, bound once
  bool has_bias_ = false;
};

}  // namespace

Result<std::unique_ptr<MatmulPlan::Impl>> make_onednn_plan(const MatmulShape& s) {
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
  auto plan = std::make_unique<OneDnnPlan>();
  try {
    auto desc = s.has_bias ? dnnl::matmul::desc(a_md, b_md, bias_md, c_md) : dnnl::matmul::desc(a_md, b_md, c_md);
    dnnl::matmul::primitive_desc pd(desc, attr, engine());
    plan->prim_ = dnnl::matmul(pd);
    plan->stream_ = dnnl::stream(engine());
    plan->a_ = dnnl::memory(a_md, engine(), DNNL_MEMORY_NONE);
    plan->b_ = dnnl::memory(b_md, engine(), DNNL_MEMORY_NONE);
    plan->c_ = dnnl::memory(c_md, engine(), DNNL_MEMORY_NONE);
    plan->args_ = {{DNNL_ARG_SRC, plan->a_}, {DNNL_ARG_WEIGHTS, plan->b_}, {DNNL_ARG_DST, plan->c_}};
    if (s.has_bias) {
      plan->bias_ = dnnl::memory(bias_md, engine(), DNNL_MEMORY_NONE);
      plan->args_.emplace(DNNL_ARG_BIAS, plan->bias_);
      plan->has_bias_ = true;
    }
  } catch (const dnnl::error& e) {
    return Status::error(Code::kUnimplemented, "matmul " + s.to_string(), "a shape oneDNN can run",
                         std::string("oneDNN refused it: ") + e.what());
  }
  return std::unique_ptr<MatmulPlan::Impl>(std::move(plan));
}

}  // namespace aspen::kernels
