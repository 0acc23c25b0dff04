// kernels/matmul_openblas.cc: the OpenBLAS backend of MatmulPlan (f32 only).
//
// NOTE [openblas tiles]: a product is cut into tiles of C (openblas_tiling, a
// function of the shape alone) and the team runs the tiles under one
// `omp parallel for schedule(static)`, each tile one cblas_sgemm call that
// OpenBLAS runs on the calling thread alone. So:
//   - the team's OpenMP pool does all the work: no second thread pool beside
//     it, no spinning workers, and several devices (teams) in one process do
//     not share any OpenBLAS threading state;
//   - every element of C is computed by the same call with the same arguments
//     whatever the team size, so the bits depend on the shape only (not on the
//     thread count, nor on the run).
// OpenBLAS runs a call on one thread when it is made inside an active OpenMP
// region (its OpenMP build checks omp_in_parallel) or when its thread count is
// 1; a team of one thread opens no active region, so the plan sets OpenBLAS's
// count to 1 (single_threaded_openblas) before it runs. Only the OpenMP build
// is used (matmul_backend_for); see docs/decisions.md for why not the pthread
// build.
//
// Bias and beta: cblas_sgemm computes C = A·B + beta·C. A bias is written into
// the tile first (beta = 0) or added to it (beta = 1), then the product is
// accumulated onto it with beta = 1.
#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <climits>
#include <mutex>

#include "kernels/matmul_backend.h"

namespace aspen::kernels {

namespace {

// NOTE [openblas tiles], the split. Each tile is a separate call that packs
// its own panels of A and B, so fewer, larger tiles waste less; measured on
// one thread against a single call on GPT-2's products (docs/kernels.md): 2
// tiles along the longer axis of C cost 0-9 %, tiles of 512 rows 1-10 %, of
// 256 rows 5-15 %, and splitting the shorter axis costs more than the longer.
// So C is cut along its longer axis only (rows, or columns when N is larger)
// into tiles of at most kMaxTile, equal up to multiples of 16 (OpenBLAS's
// SkylakeX kernel is 16 rows by 4 columns): an even count for a single
// product, so a team of 2 gets equal shares, and at least 2 for a team to
// share; a batch of products that do not fold gives one tile per product and
// more only past kMaxTile.
constexpr int64_t kMaxTile = 4096;
constexpr int64_t kAlign = 16;

// Tiles of `extent` with `count` wanted: {tile extent, tiles}.
std::pair<int64_t, int64_t> cut(int64_t extent, int64_t count) {
  int64_t each = (extent + count - 1) / count;
  each = std::min(extent, (each + kAlign - 1) / kAlign * kAlign);
  return {each, (extent + each - 1) / each};
}

bool fits_int(int64_t v) { return v <= INT_MAX; }

// Sets OpenBLAS's own thread count to 1 (see NOTE [openblas tiles]), once, and
// again if anything in the process changed it (a benchmark's peer). OpenBLAS's
// OpenMP build also sets the caller's OpenMP team size when its count is set,
// which is restored here.
void single_threaded_openblas() {
  if (openblas_get_num_threads() == 1) return;
  static std::mutex mu;
  std::lock_guard<std::mutex> lock(mu);
  if (openblas_get_num_threads() == 1) return;
  const int team = omp_get_max_threads();
  openblas_set_num_threads(1);
  omp_set_num_threads(team);
}

class OpenBlasPlan final : public MatmulPlan::Impl {
 public:
  OpenBlasPlan(const MatmulShape& s, const OpenBlasTiling& t) : s_(s), t_(t) {}

  void run(const void* a, const void* b, const float* bias, float* c) override {
    single_threaded_openblas();
    const auto* af = static_cast<const float*>(a);
    const auto* bf = static_cast<const float*>(b);
    const int64_t tiles = t_.tiles();
#pragma omp parallel for schedule(static)
    for (int64_t i = 0; i < tiles; ++i) run_tile(i, af, bf, bias, c);
  }

 private:
  void run_tile(int64_t index, const float* a, const float* b, const float* bias, float* c) const {
    const int64_t per_entry = t_.row_tiles * t_.col_tiles;
    const int64_t p = index / per_entry, r = (index % per_entry) / t_.col_tiles, q = index % t_.col_tiles;
    const int64_t rows = t_.rows, N = s_.N, K = s_.K;
    const int64_t i0 = r * t_.row_tile, m = std::min(t_.row_tile, rows - i0);
    const int64_t j0 = q * t_.col_tile, n = std::min(t_.col_tile, N - j0);
    const float* ap = a + p * rows * K;
    const float* bp = b + (s_.broadcast_b ? 0 : p * K * N);
    float* cp = c + p * rows * N + i0 * N + j0;
    float beta = s_.beta;
    if (bias) {
      for (int64_t i = 0; i < m; ++i) {
        float* row = cp + i * N;
        if (beta == 0.0f)
          for (int64_t j = 0; j < n; ++j) row[j] = bias[j0 + j];
        else
          for (int64_t j = 0; j < n; ++j) row[j] += bias[j0 + j];
      }
      beta = 1.0f;
    }
    cblas_sgemm(CblasRowMajor, s_.trans_a ? CblasTrans : CblasNoTrans, s_.trans_b ? CblasTrans : CblasNoTrans, int(m),
                int(n), int(K), 1.0f, s_.trans_a ? ap + i0 : ap + i0 * K, int(s_.trans_a ? rows : K),
                s_.trans_b ? bp + j0 * K : bp + j0, int(s_.trans_b ? K : N), beta, cp, int(N));
  }

  MatmulShape s_;
  OpenBlasTiling t_;
};

}  // namespace

OpenBlasTiling openblas_tiling(const MatmulShape& s) {
  OpenBlasTiling t;
  // a [batch, M, K] with one shared b: the batch's rows are one [batch * M, K]
  // matrix, and C's one [batch * M, N] (with trans_a they are not).
  const bool fold = s.broadcast_b && !s.trans_a;
  t.entries = fold ? 1 : s.batch;
  t.rows = fold ? s.batch * s.M : s.M;
  const bool by_rows = t.rows >= s.N;
  const int64_t extent = by_rows ? t.rows : s.N;
  int64_t count = (extent + kMaxTile - 1) / kMaxTile;
  if (t.entries == 1 && extent >= 2 * kAlign) count += count % 2;  // even, so at least 2
  const auto [tile, tiles] = cut(extent, count);
  t.row_tile = by_rows ? tile : t.rows;
  t.row_tiles = by_rows ? tiles : 1;
  t.col_tile = by_rows ? s.N : tile;
  t.col_tiles = by_rows ? 1 : tiles;
  return t;
}

bool openblas_is_openmp_build() { return openblas_get_parallel() == 2; }

std::string openblas_description() {
  const int parallel = openblas_get_parallel();
  return std::string(openblas_get_config()) + " (" +
         (parallel == 2   ? "OpenMP"
          : parallel == 1 ? "pthreads"
                          : "sequential") +
         " build, kernels for " + openblas_get_corename() + ")";
}

Result<std::unique_ptr<MatmulPlan::Impl>> make_openblas_plan(const MatmulShape& s) {
  const std::string subject = "matmul " + s.to_string() + " on OpenBLAS";
  if (s.input != DType::f32)
    return Status::error(Code::kUnimplemented, subject, "f32 inputs (Debian's OpenBLAS has no bf16 GEMM)",
                         std::string(dtype_name(s.input)));
  const OpenBlasTiling t = openblas_tiling(s);
  // cblas takes int extents and leading dimensions (Debian's OpenBLAS has 32-bit integers).
  if (!fits_int(t.row_tile) || !fits_int(s.N) || !fits_int(s.K) || !fits_int(t.rows))
    return Status::error(Code::kUnimplemented, subject, "extents below 2^31 (cblas takes int)", "larger ones");
  single_threaded_openblas();
  return std::unique_ptr<MatmulPlan::Impl>(std::make_unique<OpenBlasPlan>(s, t));
}

}  // namespace aspen::kernels
