#include "kernels/matmul.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <future>
#include <optional>
#include <tuple>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/matmul_backend.h"
#include "kernels/matmul_choice.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;

std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}

// Runs the fast path and the reference on the same inputs and compares. With
// a backend, a plan forced onto it runs; without, the checked entry point
// (the backend matmul_backend_for picks).
void check_case(MatmulShape s, uint64_t seed, std::optional<MatmulBackend> backend = std::nullopt) {
  SCOPED_TRACE(s.to_string() + (backend ? std::string(" on ") + matmul_backend_name(*backend) : ""));
  auto a = testing::random_vector(s.a_elements(), seed);
  auto b = testing::random_vector(s.b_elements(), seed + 1);
  auto bias = testing::random_vector(s.N, seed + 2);
  auto c0 = testing::random_vector(s.c_elements(), seed + 3);  // beta = 1 accumulates onto this
  Guarded<float> fast(s.c_elements());
  std::vector<float> want(c0);
  for (size_t i = 0; i < c0.size(); ++i) fast[i] = c0[i];
  const float* bias_ptr = s.has_bias ? bias.data() : nullptr;
  if (s.input == DType::f32) {
    if (backend) {
      auto plan = MatmulPlan::create(s, *backend);
      ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
      EXPECT_EQ(plan->backend(), *backend);
      plan->run(a.data(), b.data(), bias_ptr, fast.data());
    } else {
      ASSERT_TRUE(matmul(a, b, bias, fast.span(), s).is_ok());
    }
    ref::matmul<float, float>(a.data(), b.data(), bias_ptr, want.data(), s);
  } else {
    auto ab = to_bf16(a), bb = to_bf16(b);
    if (backend) {
      auto plan = MatmulPlan::create(s, *backend);
      ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
      plan->run(ab.data(), bb.data(), bias_ptr, fast.data());
    } else {
      ASSERT_TRUE(matmul(ab, bb, bias, fast.span(), s).is_ok());
    }
    ref::matmul<bf16, float>(ab.data(), bb.data(), bias_ptr, want.data(), s);
  }
  EXPECT_GUARDS(fast);
  // Same inputs (bf16 inputs are exact in f32), f32 accumulation in both: only
  // the summation order differs.
  EXPECT_TRUE(testing::close_nmse(fast.cspan(), want, testing::nmse_threshold(DType::f32)));
}

// The backends a dtype can run on.
std::vector<MatmulBackend> backends_for(DType dt) {
  if (dt == DType::bf16) return {MatmulBackend::onednn};
  return {MatmulBackend::onednn, MatmulBackend::openblas};
}

TEST(Matmul, MatchesReferenceOverOddShapes) {
  uint64_t seed = 1;
  for (DType dt : {DType::f32, DType::bf16})
    for (int64_t m : testing::kOddSizes)
      for (int64_t n : {int64_t(1), int64_t(7), int64_t(129)})
        for (int64_t k : {int64_t(3), int64_t(17), int64_t(129)}) {
          MatmulShape s{.batch = 1, .M = m, .N = n, .K = k, .input = dt};
          check_case(s, seed++);
          for (MatmulBackend be : backends_for(dt)) check_case(s, seed++, be);
        }
}

TEST(Matmul, TransposesBatchesBiasAndAccumulate) {
  uint64_t seed = 100;
  for (DType dt : {DType::f32, DType::bf16})
    for (bool ta : {false, true})
      for (bool tb : {false, true})
        for (bool bcast : {false, true})
          for (bool bias : {false, true})
            for (float beta : {0.0f, 1.0f}) {
              MatmulShape s{.batch = 3, .M = 17, .N = 7, .K = 33, .trans_a = ta, .trans_b = tb,
                            .broadcast_b = bcast, .has_bias = bias, .beta = beta, .input = dt};
              check_case(s, seed++);
              for (MatmulBackend be : backends_for(dt)) check_case(s, seed++, be);
            }
}

// OpenBLAS over odd shapes with every transpose: M = 1 and N = 1 included, and
// extents that cut into several tiles with a short last one (NOTE [openblas tiles]).
TEST(Matmul, OpenBlasMatchesReferenceInEveryTransposeCase) {
  uint64_t seed = 1000;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (int64_t m : {int64_t(1), int64_t(3), int64_t(17), int64_t(129), int64_t(300)})
        for (int64_t n : {int64_t(1), int64_t(7), int64_t(129), int64_t(1100)})
          for (int64_t k : {int64_t(1), int64_t(17), int64_t(129)}) {
            MatmulShape s{.M = m, .N = n, .K = k, .trans_a = ta, .trans_b = tb};
            check_case(s, seed++, MatmulBackend::openblas);
          }
}

// Batches (shared b folds into rows; with trans_a it cannot), bias and
// accumulation, on products cut along their rows and along their columns.
TEST(Matmul, OpenBlasBatchesBiasAndAccumulateAcrossTiles) {
  uint64_t seed = 5000;
  for (bool ta : {false, true})
    for (bool tb : {false, true})
      for (bool bcast : {false, true})
        for (bool bias : {false, true})
          for (float beta : {0.0f, 1.0f})
            for (auto [m, n] : {std::pair<int64_t, int64_t>{300, 600}, {600, 300}}) {
              MatmulShape s{.batch = 2, .M = m, .N = n, .K = 5, .trans_a = ta, .trans_b = tb,
                            .broadcast_b = bcast, .has_bias = bias, .beta = beta};
              check_case(s, seed++, MatmulBackend::openblas);
            }
}

TEST(Matmul, OpenBlasTilesCoverTheProductInAlignedPieces) {
  // GPT-2's c_fc forward: a [4, 256, 768] with one shared weight: the batch folds into 1024 rows, and C
  // [1024, 3072] is cut along its columns into 2 tiles.
  OpenBlasTiling t = openblas_tiling({.batch = 4, .M = 256, .N = 3072, .K = 768, .broadcast_b = true});
  EXPECT_EQ(t.entries, 1);
  EXPECT_EQ(t.rows, 1024);
  EXPECT_EQ(t.row_tiles, 1);
  EXPECT_EQ(t.col_tiles, 2);
  EXPECT_EQ(t.col_tile, 1536);
  // With trans_a the batch entries are not rows of one matrix: one tile each.
  t = openblas_tiling({.batch = 4, .M = 256, .N = 3072, .K = 768, .trans_a = true, .broadcast_b = true});
  EXPECT_EQ(t.entries, 4);
  EXPECT_EQ(t.rows, 256);
  EXPECT_EQ(t.tiles(), 4);
  // The LM head's weight gradient [50257, 768]: an even number of row tiles of at most 4096.
  t = openblas_tiling({.M = 50257, .N = 768, .K = 1024, .trans_a = true});
  EXPECT_EQ(t.row_tiles, 14);
  EXPECT_EQ(t.col_tiles, 1);
  for (int64_t rows : {1, 15, 16, 17, 31, 32, 33, 255, 256, 257, 300, 1024, 4097, 8200, 50257})
    for (int64_t n : {1, 7, 33, 768, 1100, 3072, 50257}) {
      t = openblas_tiling({.M = rows, .N = n, .K = 8});
      SCOPED_TRACE(std::to_string(rows) + " x " + std::to_string(n));
      EXPECT_TRUE(t.row_tiles == 1 || t.col_tiles == 1);  // one axis is cut, the longer
      EXPECT_EQ(t.row_tiles > 1, rows >= n && rows >= 32);
      EXPECT_EQ(t.col_tiles > 1, n > rows && n >= 32);
      EXPECT_EQ(t.tiles() % 2, std::max(rows, n) >= 32 ? 0 : 1);  // even: a team of 2 shares equally
      for (auto [extent, tile, tiles] : {std::tuple{rows, t.row_tile, t.row_tiles}, std::tuple{n, t.col_tile, t.col_tiles}}) {
        EXPECT_GE(tile * tiles, extent);              // covered
        EXPECT_LT(tile * (tiles - 1), extent);        // no empty tile
        EXPECT_TRUE(tile % 16 == 0 || tiles == 1);   // aligned cuts
        EXPECT_LE(tile, std::max<int64_t>(4096, tiles == 1 ? extent : 0));
      }
    }
}

// NOTE [openblas tiles]: every element is computed by the same single-threaded
// call whatever the team, so 1 and 2 threads, and every run, give the same bits.
TEST(Matmul, OpenBlasBitsDoNotDependOnTheTeamOrTheRun) {
  for (MatmulShape s : {MatmulShape{.batch = 2, .M = 300, .N = 1100, .K = 129, .broadcast_b = true, .has_bias = true},
                        MatmulShape{.M = 129, .N = 3100, .K = 700, .trans_a = true, .trans_b = true}}) {
    SCOPED_TRACE(s.to_string());
    auto a = testing::random_vector(s.a_elements(), 7), b = testing::random_vector(s.b_elements(), 8);
    auto bias = testing::random_vector(s.N, 9);
    std::vector<std::vector<float>> runs;
    for (int threads : {1, 2, 2, 1}) {
      ScopedOmpThreads team(threads);
      auto plan = MatmulPlan::create(s, MatmulBackend::openblas);
      ASSERT_TRUE(plan.is_ok());
      EXPECT_EQ(plan->team_size(), threads);
      std::vector<float> c(s.c_elements());
      plan->run(a.data(), b.data(), bias.data(), c.data());
      runs.push_back(std::move(c));
    }
    for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[0]) << "run " << i;
  }
}

// Two devices (teams) in one process run OpenBLAS plans at the same time: calls are independent
// (no OpenBLAS threading state is shared), so each gets the bits of a run alone.
TEST(Matmul, OpenBlasPlansRunOnTwoTeamsAtOnce) {
  const MatmulShape s{.batch = 2, .M = 300, .N = 1100, .K = 129, .broadcast_b = true, .has_bias = true};
  auto a = testing::random_vector(s.a_elements(), 11), b = testing::random_vector(s.b_elements(), 12);
  auto bias = testing::random_vector(s.N, 13);
  std::vector<float> alone(s.c_elements());
  {
    auto plan = MatmulPlan::create(s, MatmulBackend::openblas);
    ASSERT_TRUE(plan.is_ok());
    plan->run(a.data(), b.data(), bias.data(), alone.data());
  }
  CoreBudget budget(2);
  std::vector<std::unique_ptr<ThreadTeam>> teams;
  for (const char* name : {"dev0", "dev1"}) {
    auto team = ThreadTeam::create(name, 1, budget);
    ASSERT_TRUE(team.is_ok());
    teams.push_back(std::move(*team));
  }
  std::vector<std::vector<float>> got(2, std::vector<float>(s.c_elements()));
  std::vector<std::future<void>> done;
  for (size_t d = 0; d < 2; ++d)
    done.push_back(teams[d]->submit([&, d] {
      auto plan = MatmulPlan::create(s, MatmulBackend::openblas);
      ASSERT_TRUE(plan.is_ok());
      for (int rep = 0; rep < 3; ++rep) plan->run(a.data(), b.data(), bias.data(), got[d].data());
    }));
  for (auto& f : done) f.get();
  EXPECT_EQ(got[0], alone);
  EXPECT_EQ(got[1], alone);
}

// NOTE [matmul backends]: the rule is a function of the shape and the team size.
TEST(Matmul, BackendRule) {
  const MatmulBackend blas = openblas_is_openmp_build() ? MatmulBackend::openblas : MatmulBackend::onednn;
  const MatmulBackend dnnl = MatmulBackend::onednn;
  // GPT-2's c_fc: forward [4, 256, 768] x [768, 3072] (2 tiles), data gradient (b^T), weight gradient (a^T).
  const MatmulShape fc{.batch = 4, .M = 256, .N = 3072, .K = 768, .broadcast_b = true, .has_bias = true};
  for (int team : {1, 2}) EXPECT_EQ(matmul_backend_for(fc, team), blas) << team;
  EXPECT_EQ(matmul_backend_for(fc, 3), dnnl);  // a thread would idle
  EXPECT_EQ(matmul_backend_for({.batch = 4, .M = 256, .N = 768, .K = 3072, .trans_b = true, .broadcast_b = true}, 2), dnnl);
  EXPECT_EQ(matmul_backend_for({.M = 768, .N = 3072, .K = 1024, .trans_a = true}, 2), blas);
  // The LM head's gradients: K = 50257, and an output of 50257 x 768.
  EXPECT_EQ(matmul_backend_for({.M = 1024, .N = 768, .K = 50257}, 2), blas);
  EXPECT_EQ(matmul_backend_for({.M = 50257, .N = 768, .K = 1024, .trans_a = true}, 2), blas);
  EXPECT_EQ(matmul_backend_for({.M = 1024, .N = 768, .K = 768}, 2), dnnl);   // attn.c_proj: small
  EXPECT_EQ(matmul_backend_for({.M = 128, .N = 3072, .K = 768}, 2), dnnl);   // few rows
  EXPECT_EQ(matmul_backend_for({.M = 2048, .N = 2048, .K = 1}, 2), dnnl);    // little work per tile
  MatmulShape bf = fc;
  bf.input = DType::bf16;
  EXPECT_EQ(matmul_backend_for(bf, 2), dnnl);
  {
    // With measuring off, a plan takes the rule's backend (NOTE [matmul choice]).
    ScopedOmpThreads team(2);
    clear_matmul_choices();
    const MatmulChoice before = set_matmul_choice(MatmulChoice::rule);
    auto plan = MatmulPlan::create(fc);
    set_matmul_choice(before);
    ASSERT_TRUE(plan.is_ok());
    EXPECT_EQ(plan->backend(), blas);
  }
  EXPECT_STREQ(matmul_backend_name(MatmulBackend::openblas), "OpenBLAS");
  EXPECT_NE(openblas_description().find("OpenBLAS"), std::string::npos) << openblas_description();
}

TEST(Matmul, ReferenceModeAndPlanCache) {
  MatmulShape s{.M = 5, .N = 6, .K = 7};
  auto a = testing::random_vector(35, 1), b = testing::random_vector(42, 2);
  std::vector<float> c1(30), c2(30);
  size_t before = matmul_cache_size();
  ASSERT_TRUE(matmul(a, b, {}, c1, s).is_ok());
  ASSERT_TRUE(matmul(a, b, {}, c1, s).is_ok());
  EXPECT_EQ(matmul_cache_size(), before + 1);  // one plan for one shape
  {
    ScopedReferenceMode r(true);
    ASSERT_TRUE(matmul(a, b, {}, c2, s).is_ok());
  }
  EXPECT_EQ(matmul_cache_size(), before + 1);
  EXPECT_TRUE(testing::close_nmse(c1, c2, 1e-12));
}

TEST(Matmul, PlanRunsOnAThreadTeam) {
  CoreBudget budget(2);
  auto team = ThreadTeam::create("dev0", 2, budget);
  ASSERT_TRUE(team.is_ok());
  MatmulShape s{.M = 64, .N = 48, .K = 40, .trans_b = true};
  auto a = testing::random_vector(s.a_elements(), 5), b = testing::random_vector(s.b_elements(), 6);
  std::vector<float> want(s.c_elements());
  ref::matmul<float, float>(a.data(), b.data(), nullptr, want.data(), s);
  for (MatmulBackend be : backends_for(DType::f32)) {
    std::vector<float> got(s.c_elements());
    (*team)->run([&] {
      auto plan = MatmulPlan::create(s, be);
      ASSERT_TRUE(plan.is_ok());
      EXPECT_EQ(plan->team_size(), 2);
      plan->run(a.data(), b.data(), nullptr, got.data());
      // The team keeps its size after a plan is made (OpenBLAS's thread setting touches it).
      EXPECT_EQ(omp_get_max_threads(), 2);
    });
    EXPECT_TRUE(testing::close_nmse(got, want, testing::nmse_threshold(DType::f32))) << matmul_backend_name(be);
  }
}

TEST(Matmul, BadArgumentsAreStatuses) {
  MatmulShape s{.M = 4, .N = 3, .K = 3};
  std::vector<float> a(12), b(9), c(11);
  Status st = matmul(a, b, {}, c, s);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "matmul: argument 'c': expected at least 12 elements, found 11");
  std::vector<float> c_ok(12);
  s.has_bias = true;
  EXPECT_EQ(matmul(a, b, {}, c_ok, s).message(), "matmul: argument 'bias': expected a buffer of 3 elements, found a null pointer");
  s.has_bias = false;
  s.K = 0;
  EXPECT_EQ(matmul(a, b, {}, c_ok, s).message(), "matmul: K: expected >= 1, found 0");
  s.K = 3;
  s.input = DType::bf16;
  EXPECT_EQ(matmul(a, b, {}, c_ok, s).message(), "matmul: shape.input: expected f32 (the buffers' type), found bf16");
  s.input = DType::i32;
  EXPECT_EQ(MatmulPlan::create(s).status().code(), Code::kUnimplemented);
  s.input = DType::bf16;
  Status blas = MatmulPlan::create(s, MatmulBackend::openblas).status();
  EXPECT_EQ(blas.code(), Code::kUnimplemented);
  EXPECT_EQ(blas.message(), "matmul [1] 4x3x3 bf16 on OpenBLAS: expected f32 inputs (Debian's OpenBLAS has no bf16 GEMM), found bf16");
  s.input = DType::f32;
  s.beta = 0.5f;
  EXPECT_EQ(matmul(a, b, {}, c_ok, s).message(), "matmul: beta: expected 0 or 1, found 0.500000");
}

}  // namespace
}  // namespace aspen::kernels
