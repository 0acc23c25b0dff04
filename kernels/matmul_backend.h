// kernels/matmul_backend.h: what a matmul backend provides (private to
// kernels/matmul*.cc).
//
// A backend prepares one shape once (oneDNN: a primitive; OpenBLAS: the split
// into tiles) and then runs it any number of times on buffers the caller has
// checked against that shape. Adding a backend: a MatmulBackend value and its
// name (matmul.h, matmul.cc), a make_*_plan below in its own matmul_<name>.cc,
// and its place in matmul_backend_for's rule (NOTE [matmul backends]).
//
// Thread-safety: as MatmulPlan (one thread runs a plan at a time; it
// parallelizes over that thread's OpenMP team).
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"

namespace aspen::kernels {

struct MatmulPlan::Impl {
  virtual ~Impl() = default;
  // a, b: f32 or bf16 elements as the shape's input says; bias [N] or null.
  virtual void run(const void* a, const void* b, const float* bias, float* c) = 0;
  virtual void b_changed() {}  // see MatmulPlan::b_changed
};

// Each validates that it can run `shape` (an error Status says why not) and
// prepares it for the calling thread's OpenMP team. The shape itself has been
// validated by MatmulPlan::create.
Result<std::unique_ptr<MatmulPlan::Impl>> make_onednn_plan(const MatmulShape& shape);
Result<std::unique_ptr<MatmulPlan::Impl>> make_openblas_plan(const MatmulShape& shape);

// aspen's own kernels (matmul_aspen.cc): one ISA variant's micro-kernel and
// packing, the micro-tile, and the cache blocking around it (NOTE [gemm
// blocking]).
//
// A variant packs op(A) into panels of mr rows and op(B) into panels of nr
// columns, each holding round_up(kc, k_align) steps of packed_bytes-wide
// elements (the padding zeros); the micro-kernel then computes one mr x nr
// tile of C from one panel of each.
struct GemmIsa {
  Isa isa = Isa::scalar;
  int mr = 0, nr = 0;
  int k_align = 1;       // K steps per packed unit (AMX: 32)
  int packed_bytes = 4;  // bytes per packed element (f32 4, bf16 2)
  // C[0:mr, 0:nr] (row stride ldc) = (load_c ? C : 0) + sum over kcp packed steps + bias[0:nr] when given.
  void (*ukernel)(int64_t kcp, const void* pa, const void* pb, float* c, int64_t ldc, bool load_c,
                  const float* bias) = nullptr;
  // Lanes [l0, l0 + ln) and steps [k0, k0 + kc) into panels ([0]: f32 source, [1]: bf16).
  using PackFn = void (*)(const void* src, int64_t ld, bool lanes_contiguous, int64_t l0, int64_t ln, int64_t k0,
                          int64_t kc, void* out);
  PackFn pack_a[2] = {nullptr, nullptr}, pack_b[2] = {nullptr, nullptr};
  // Per-thread set-up and tear-down around a slab (AMX: the tile configuration), or null.
  void (*begin)() = nullptr;
  void (*end)() = nullptr;
};
// The AMX variant (matmul_amx.cc): bf16 inputs only.
const GemmIsa& amx_gemm_isa();

struct GemmBlocking {
  Isa isa = Isa::scalar;
  int mr = 0, nr = 0;              // the micro-kernel's tile of C (fixed by the variant)
  int64_t kc = 0, mc = 0, nc = 0;  // K, row and column blocks (mc a multiple of mr, nc of nr)
  std::string to_string() const;   // "avx2 mr 4 nr 24 kc 256 mc 256 nc 8184"
};
// The blocking of the variant for `isa` and inputs of `input` (the best
// variant at or below it: AMX for bf16 only), sized from this machine's caches.
GemmBlocking gemm_blocking(Isa isa, DType input = DType::f32);
// The blocking a product of `shape` on `team` threads runs with on active_isa()'s variant: the above,
// with one K block for all of K (up to 1024) where a thread's share of C exceeds L2 (NOTE [whole k]).
GemmBlocking gemm_blocking(const MatmulShape& shape, int team);
// On the variant of active_isa() with gemm_blocking(shape, team)'s sizes, or on a given
// blocking (tests and tuning); an ISA above active_isa() is refused.
Result<std::unique_ptr<MatmulPlan::Impl>> make_aspen_plan(const MatmulShape& shape);
Result<std::unique_ptr<MatmulPlan::Impl>> make_aspen_plan(const MatmulShape& shape, const GemmBlocking& blocking);

// NOTE [openblas tiles]: the OpenBLAS backend's split of a product into tiles,
// each one single-threaded cblas_sgemm call. Fixed by the shape alone, so the
// bits do not depend on the team size. Exposed for the rule and the tests.
struct OpenBlasTiling {
  int64_t entries = 1;                 // products (the batch, or 1 when the batch folds into rows)
  int64_t rows = 0;                    // rows of op(A) and C per product
  int64_t row_tile = 0, col_tile = 0;  // tile extents (the last tile of each may be short)
  int64_t row_tiles = 0, col_tiles = 0;
  int64_t tiles() const { return entries * row_tiles * col_tiles; }
};
OpenBlasTiling openblas_tiling(const MatmulShape& shape);

}  // namespace aspen::kernels
