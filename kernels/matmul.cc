#include "kernels/matmul.h"

#include <omp.h>

#include <algorithm>
#include <unordered_map>
#include <vector>

#include "core/check.h"
#include "kernels/check_args.h"
#include "kernels/convert.h"
#include "kernels/cpu.h"
#include "kernels/matmul_backend.h"
#include "kernels/matmul_choice.h"

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
  if (b_fixed) s += " fixed-b";
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

}  // namespace

// NOTE [matmul backends]: the fixed rule for which library runs a product,
// taken when measuring is off (MatmulChoice::rule; NOTE [matmul choice] in
// matmul_choice.cc chooses by timing otherwise). A function of the shape, the
// team size and which OpenBLAS build is loaded: the same on every machine.
// Measured on the Sapphire Rapids host (`aspen bench gemm`, the
// GPT-2 rows; the table is in docs/kernels.md), f32, aspen's tiled OpenBLAS
// against oneDNN 2.6.3:
//   - where oneDNN is weak, OpenBLAS wins: N or K of 2048 and more (c_fc's
//     forward and weight gradient 2.0-2.4x, c_attn's 1.05-1.1x, mlp.c_proj's
//     forward 1.2x, the LM head's data gradient, K = 50257, 1.4x) and outputs
//     of 2^24 elements or more (the LM head's weight gradient, 50257 x 768:
//     1.3-1.4x);
//   - b^T (the data gradients dX = G W^T, the LM head's forward): oneDNN is
//     even or 5-15 % ahead (OpenBLAS's own single call is no faster there);
//   - smaller products (N, K <= 1024: attn.c_proj, square 1024): oneDNN is
//     2-5 % ahead of the tiles;
//   - fewer than kMinRows rows (after a shared-b batch folds into rows):
//     oneDNN is as fast or faster at N = 768 (M = 16-128: 1.05-1.6x); at
//     N = 3072 OpenBLAS would be 2x, left for later;
//   - a product that cuts into fewer tiles than the team has threads (one
//     would idle), or into tiles of little work: oneDNN.
// bf16 is always oneDNN (AMX / AVX512-BF16; Debian's OpenBLAS has no bf16
// GEMM), and OpenBLAS runs only when its OpenMP build is the one loaded: the
// pthread build keeps a pool of its own beside the team's (docs/decisions.md).
namespace {
constexpr int64_t kMinRows = 256;
constexpr int64_t kLargeExtent = 2048;              // N or K from which oneDNN 2.6.3 falls behind
constexpr double kLargeOutput = double(1 << 24);    // elements of C per product
constexpr double kMinTileFlops = double(1 << 24);   // ~0.15 ms of work: far above a call's cost
}  // namespace

const char* matmul_backend_name(MatmulBackend backend) {
  switch (backend) {
    case MatmulBackend::onednn:
      return "oneDNN";
    case MatmulBackend::openblas:
      return "OpenBLAS";
    case MatmulBackend::aspen:
      return "aspen";
  }
  return "?";
}

MatmulBackend matmul_backend_for(const MatmulShape& s, int team_size) {
  if (s.input != DType::f32 || s.trans_b || !openblas_is_openmp_build()) return MatmulBackend::onednn;
  const OpenBlasTiling t = openblas_tiling(s);
  const bool large = std::max(s.N, s.K) >= kLargeExtent || double(t.rows) * double(s.N) >= kLargeOutput;
  if (!large || t.rows < kMinRows || t.tiles() < std::max(2, team_size) ||
      s.flops() / double(t.tiles()) < kMinTileFlops)
    return MatmulBackend::onednn;
  return MatmulBackend::openblas;
}

namespace {

// NOTE [bf16 without AVX-512]: oneDNN 2.6 runs bf16 products only on CPUs
// with AVX-512 (its bf16 kernels need avx512_core at least); on an AVX2-only
// CPU (some Zen parts) it refuses every bf16 primitive. There the plan widens
// A and B to f32 (exact: a bf16 is an f32 with a shorter mantissa) into
// buffers it owns and runs the f32 product, accumulating in f32 as oneDNN's
// bf16 kernels do. The results agree with the bf16 kernels to f32 rounding;
// only the speed of bf16 is lost, which such a CPU has no instructions for.
struct WideningImpl : MatmulPlan::Impl {
  MatmulShape shape;
  std::vector<float> a, b;
  std::unique_ptr<MatmulPlan> f32;
  void run(const void* av, const void* bv, const float* bias, float* c) override {
    const Status sa = convert_bf16_to_f32({static_cast<const bf16*>(av), a.size()}, a, int64_t(a.size()));
    const Status sb = convert_bf16_to_f32({static_cast<const bf16*>(bv), b.size()}, b, int64_t(b.size()));
    ASPEN_CHECK(sa.is_ok() && sb.is_ok()) << sa.to_string() << " " << sb.to_string();  // sized by the plan
    f32->run(a.data(), b.data(), bias, c);
  }
};

Result<std::unique_ptr<MatmulPlan::Impl>> make_widening_plan(const MatmulShape& s) {
  auto impl = std::make_unique<WideningImpl>();
  impl->shape = s;
  MatmulShape wide = s;
  wide.input = DType::f32;
  // The f32 plan takes the rule's backend: this is called while a choice is being measured.
  ASPEN_ASSIGN_OR_RETURN(MatmulPlan plan, MatmulPlan::create(wide, matmul_backend_for(wide, omp_get_max_threads())));
  impl->f32 = std::make_unique<MatmulPlan>(std::move(plan));
  impl->a.resize(size_t(s.a_elements()));
  impl->b.resize(size_t(s.b_elements()));
  return std::unique_ptr<MatmulPlan::Impl>(std::move(impl));
}

}  // namespace

bool bf16_matmul_widens() {
  const CpuFeatures& f = cpu_features();  // oneDNN's bf16 kernels need avx512_core: F, BW, VL and DQ
  return !(f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq);
}

MatmulPlan::MatmulPlan(MatmulPlan&&) noexcept = default;
MatmulPlan& MatmulPlan::operator=(MatmulPlan&&) noexcept = default;
MatmulPlan::~MatmulPlan() = default;

Result<MatmulPlan> MatmulPlan::create(const MatmulShape& s) {
  ASPEN_RETURN_IF_ERROR(validate(s));
  ASPEN_ASSIGN_OR_RETURN(const MatmulBackend backend, choose_matmul_backend(s, omp_get_max_threads()));
  return create(s, backend);
}

Result<MatmulPlan> MatmulPlan::create(const MatmulShape& s, MatmulBackend backend) {
  ASPEN_RETURN_IF_ERROR(validate(s));
  MatmulPlan plan;
  plan.shape_ = s;
  plan.team_size_ = omp_get_max_threads();
  plan.backend_ = backend;
  if (backend == MatmulBackend::openblas) {
    ASPEN_ASSIGN_OR_RETURN(plan.impl_, make_openblas_plan(s));
  } else if (backend == MatmulBackend::aspen) {
    ASPEN_ASSIGN_OR_RETURN(plan.impl_, make_aspen_plan(s));
  } else if (s.input == DType::bf16 && bf16_matmul_widens()) {  // NOTE [bf16 without AVX-512]
    ASPEN_ASSIGN_OR_RETURN(plan.impl_, make_widening_plan(s));
  } else {
    ASPEN_ASSIGN_OR_RETURN(plan.impl_, make_onednn_plan(s));
  }
  return plan;
}

void MatmulPlan::run(const void* a, const void* b, const float* bias, float* c) {
  impl_->run(a, b, shape_.has_bias ? bias : nullptr, c);
}

void MatmulPlan::b_changed() { impl_->b_changed(); }

namespace {

struct ShapeHash {
  size_t operator()(const std::pair<MatmulShape, int>& k) const {
    const MatmulShape& s = k.first;
    size_t h = std::hash<int64_t>()(s.batch);
    for (int64_t v :
         {s.M, s.N, s.K, int64_t(s.trans_a), int64_t(s.trans_b), int64_t(s.broadcast_b), int64_t(s.has_bias),
          int64_t(s.beta != 0), int64_t(s.input), int64_t(s.b_fixed), int64_t(k.second)})
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
  // A cached plan is out of the caller's reach (no b_changed()): B is packed on every call here.
  MatmulShape unfixed = shape;
  unfixed.b_fixed = false;
  auto key = std::make_pair(unfixed, omp_get_max_threads());
  PlanCache& cache = plan_cache();
  auto it = cache.find(key);
  if (it == cache.end()) {
    ASPEN_ASSIGN_OR_RETURN(MatmulPlan plan, MatmulPlan::create(unfixed));
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
