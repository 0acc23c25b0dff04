// kernels/matmul.h: matrix products, f32 and bf16 inputs, f32 accumulation.
//
//   C[b] = beta·C[b] + op(A[b]) · op(B[b]) + bias        b in [0, batch)
//
// op(A) is [M, K]: A is stored [batch, M, K], or [batch, K, M] when trans_a.
// op(B) is [K, N]: B is stored [batch, K, N], or [batch, N, K] when trans_b
// (a PyTorch Linear weight [out, in] is B with trans_b). With broadcast_b one
// B serves every batch entry (weights shared by a batch of activations).
// bias is [N] or empty; C is [batch, M, N] f32. beta is 0 (overwrite) or 1
// (accumulate, e.g. gradients over micro-batches).
//
// Three backends run the products: aspen's own kernels (matmul_aspen.cc),
// oneDNN and OpenBLAS (f32). Which one a plan made without a named backend
// gets is measured on this machine, once per distinct product and team size,
// and remembered (NOTE [matmul choice] in matmul_choice.cc; why in
// docs/decisions.md); with the choice set to the rule, a fixed rule on the
// shape and team size picks between oneDNN and OpenBLAS (NOTE [matmul
// backends] in matmul.cc).

// A MatmulPlan is made once per shape, dtype and team size: creating a oneDNN
// primitive costs far more than running a small one, so the compiler makes
// plans at compile time and execution only binds pointers. The free functions
// keep a per-thread cache of plans for callers without a compiler.
//
// Determinism: a plan gives the same bits on every run. An aspen or OpenBLAS
// plan's bits also do not depend on the team size (their splits are fixed by
// the shape). A oneDNN plan's are reproducible for a fixed thread count
// (oneDNN promises no more; on GPT-2's shapes 1 and 2 threads measured equal).
// The backend itself can depend on the team size, and the backends' bits
// differ; a remembered choice keeps one machine on the same backends.
//
// Thread-safety: a MatmulPlan may be run by one thread at a time (it binds
// buffers into memory objects it owns). The free functions are safe from any
// thread: each thread has its own plan cache. A plan parallelizes over the
// OpenMP team of the thread that runs it; the team size is part of the plan.
#pragma once

#include <cstdint>
#include <memory>
#include <span>
#include <string>

#include "core/dtype.h"
#include "core/status.h"

namespace aspen::kernels {

struct MatmulShape {
  int64_t batch = 1, M = 0, N = 0, K = 0;
  bool trans_a = false, trans_b = false;
  bool broadcast_b = false;  // one B for all batch entries
  bool has_bias = false;
  float beta = 0.0f;         // 0 or 1
  DType input = DType::f32;  // f32 or bf16 (A and B); C and bias are f32
  // B holds the same values on every run until MatmulPlan::b_changed() (a
  // weight): aspen's kernels then pack it once, on the first run after a
  // change, and keep the packed panels (one B: broadcast_b or batch 1). The
  // free functions below ignore it (their cached plans are out of reach).
  bool b_fixed = false;

  int64_t a_elements() const { return batch * M * K; }
  int64_t b_elements() const { return (broadcast_b ? 1 : batch) * K * N; }
  int64_t c_elements() const { return batch * M * N; }
  double flops() const { return 2.0 * double(batch) * double(M) * double(N) * double(K); }
  std::string to_string() const;  // "[4] 128x768x3072 f32 b^T +bias"
  bool operator==(const MatmulShape&) const = default;
};

// The libraries a plan can run on. NOTE [matmul backends] in matmul.cc.
enum class MatmulBackend : uint8_t { onednn, openblas, aspen };
const char* matmul_backend_name(MatmulBackend backend);  // "oneDNN", "OpenBLAS", "aspen"

// The fixed rule (NOTE [matmul backends]; MatmulPlan::create(shape) takes it
// with MatmulChoice::rule) on a team of `team_size` threads: OpenBLAS for large f32 products without
// b^T (N or K >= 2048, or C of 2^24+ elements; 256+ rows; at least max(2,
// team_size) tiles), when the OpenBLAS aspen loaded is its OpenMP build;
// oneDNN otherwise.
MatmulBackend matmul_backend_for(const MatmulShape& shape, int team_size);

// The OpenBLAS aspen loaded: its configuration, threading and kernels, e.g.
// "OpenBLAS 0.3.21 ... USE_OPENMP SkylakeX MAX_THREADS=64 (OpenMP build,
// kernels for SkylakeX)"; and whether it is the OpenMP build (the only one the
// backend uses: a pthread build keeps a thread pool of its own beside the
// team's).
std::string openblas_description();
// True on a CPU without AVX-512, where oneDNN 2.6 has no bf16 kernels: bf16
// plans then widen A and B to f32 and run the f32 product (NOTE [bf16 without
// AVX-512] in matmul.cc), correct but without bf16's speed.
bool bf16_matmul_widens();
bool openblas_is_openmp_build();

class MatmulPlan {
 public:
  // Validates the shape and prepares the backend choose_matmul_backend(shape,
  // team size) names (or `backend`: tests, benchmarks and the measurement
  // force one) for the calling thread's current OpenMP team size. OpenBLAS
  // takes f32 only.
  static Result<MatmulPlan> create(const MatmulShape& shape);
  static Result<MatmulPlan> create(const MatmulShape& shape, MatmulBackend backend);
  // A backend's prepared product (kernels/matmul_backend.h); opaque here.
  struct Impl;

  MatmulPlan(MatmulPlan&&) noexcept;
  MatmulPlan& operator=(MatmulPlan&&) noexcept;
  ~MatmulPlan();

  const MatmulShape& shape() const { return shape_; }
  int team_size() const { return team_size_; }
  MatmulBackend backend() const { return backend_; }
  // Raw run: buffers are trusted to match shape() (the compiler's path).
  // a/b point to f32 or bf16 elements as shape().input says.
  void run(const void* a, const void* b, const float* bias, float* c);
  // With shape().b_fixed: B's values changed; the next run packs it again (so
  // does a run given another B pointer).
  void b_changed();

 private:
  MatmulPlan() = default;
  MatmulShape shape_;
  int team_size_ = 1;
  MatmulBackend backend_ = MatmulBackend::onednn;
  std::unique_ptr<Impl> impl_;
};

// Checked entry points. They validate every buffer against the shape, then run
// a cached plan (or the reference in reference mode).
[[nodiscard]] Status matmul(std::span<const float> a, std::span<const float> b, std::span<const float> bias,
                            std::span<float> c, const MatmulShape& shape);
[[nodiscard]] Status matmul(std::span<const bf16> a, std::span<const bf16> b, std::span<const float> bias,
                            std::span<float> c, const MatmulShape& shape);

// Number of plans in the calling thread's cache (tests use it to see reuse).
size_t matmul_cache_size();

namespace ref {
// The definition: triple loop, accumulation in Acc. In is float, double or bf16.
template <class In, class Acc>
void matmul(const In* a, const In* b, const Acc* bias, Acc* c, const MatmulShape& shape);
}  // namespace ref

}  // namespace aspen::kernels
