// Tests of aspen's own matrix product (matmul_aspen.cc) against the reference:
// every ISA variant this CPU runs, odd shapes, every layout, both input
// dtypes, batches, bias and accumulation, the default blocking and a tiny one
// that makes every loop of NOTE [gemm blocking] take several ragged trips.
#include <gtest/gtest.h>
#include <omp.h>

#include <cstring>
#include <vector>

#include "core/thread_team.h"
#include "core/weight_copies.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"
#include "kernels/matmul_backend.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;

std::vector<Isa> runnable_isas() {
  std::vector<Isa> out = {Isa::scalar};
  if (cpu_features().best >= Isa::avx2) out.push_back(Isa::avx2);
  if (cpu_features().best >= Isa::avx512) out.push_back(Isa::avx512);
  if (cpu_features().best >= Isa::amx) out.push_back(Isa::amx);  // bf16 only; f32 runs avx512 there
  return out;
}

// The default blocking of `isa` for `input`, or the smallest legal one (kc 5:
// every K past 5 takes several ragged blocks, each padded where the variant
// packs K in units; two micro-tiles per row and column block).
GemmBlocking blocking_for(Isa isa, bool tiny, DType input = DType::f32) {
  GemmBlocking b = gemm_blocking(isa, input);
  if (tiny) {
    b.kc = 5;
    b.mc = 2 * b.mr;
    b.nc = 2 * b.nr;
  }
  return b;
}

std::vector<float> run_plan(const MatmulShape& s, const GemmBlocking& blk, const std::vector<float>& a,
                            const std::vector<float>& b, const std::vector<float>& bias, const std::vector<float>& c0,
                            bool* guards_ok = nullptr) {
  std::vector<bf16> ab, bb;
  if (s.input == DType::bf16) {
    for (float v : a) ab.push_back(f32_to_bf16(v));
    for (float v : b) bb.push_back(f32_to_bf16(v));
  }
  Guarded<float> c(c0.size());
  for (size_t i = 0; i < c0.size(); ++i) c[i] = c0[i];
  auto plan = make_aspen_plan(s, blk);
  EXPECT_TRUE(plan.is_ok()) << plan.status().to_string();
  if (!plan.is_ok()) return {};
  const void* ap = s.input == DType::bf16 ? static_cast<const void*>(ab.data()) : a.data();
  const void* bp = s.input == DType::bf16 ? static_cast<const void*>(bb.data()) : b.data();
  (*plan)->run(ap, bp, s.has_bias ? bias.data() : nullptr, c.data());
  if (guards_ok) *guards_ok = c.guards_intact();
  return c.vec();
}

void check_case(const MatmulShape& s, const GemmBlocking& blk, uint64_t seed) {
  SCOPED_TRACE(s.to_string() + " on " + blk.to_string());
  auto a = testing::random_vector(s.a_elements(), seed);
  auto b = testing::random_vector(s.b_elements(), seed + 1);
  auto bias = testing::random_vector(s.N, seed + 2);
  auto c0 = testing::random_vector(s.c_elements(), seed + 3);
  bool guards = false;
  std::vector<float> got = run_plan(s, blk, a, b, bias, c0, &guards);
  EXPECT_TRUE(guards) << "wrote outside C";
  std::vector<float> want(c0);
  if (s.input == DType::bf16) {
    std::vector<bf16> ab, bb;
    for (float v : a) ab.push_back(f32_to_bf16(v));
    for (float v : b) bb.push_back(f32_to_bf16(v));
    ref::matmul<bf16, float>(ab.data(), bb.data(), s.has_bias ? bias.data() : nullptr, want.data(), s);
  } else {
    ref::matmul<float, float>(a.data(), b.data(), s.has_bias ? bias.data() : nullptr, want.data(), s);
  }
  ASSERT_EQ(got.size(), want.size());
  EXPECT_TRUE(testing::close_nmse(got, want, testing::nmse_threshold(DType::f32)));
}

TEST(MatmulAspen, MatchesReferenceOverOddShapesLayoutsAndIsas) {
  uint64_t seed = 1;
  const std::vector<int64_t> sizes = {1, 7, 17, 255};
  for (Isa isa : runnable_isas())
    for (bool tiny : {false, true})
      for (DType dt : {DType::f32, DType::bf16})
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (int64_t m : sizes)
              for (int64_t n : sizes)
                for (int64_t k : sizes) {
                  if (dt == DType::bf16 && (m * n * k) % 2 == 0) continue;  // bf16: half the cross is enough
                  check_case({.M = m, .N = n, .K = k, .trans_a = ta, .trans_b = tb, .input = dt},
                             blocking_for(isa, tiny, dt), seed++);
                }
}

// Extents of 1000 in each position (several default blocks of K, rows and
// columns with ragged ends), every layout.
TEST(MatmulAspen, MatchesReferenceOnLargeExtents) {
  uint64_t seed = 50000;
  const Isa isa = runnable_isas().back();
  for (DType dt : {DType::f32, DType::bf16})
    for (auto [m, n, k] :
         {std::tuple<int64_t, int64_t, int64_t>{1000, 33, 20}, {20, 1000, 33}, {33, 20, 1000}, {128, 1000, 200}})
      for (bool ta : {false, true})
        for (bool tb : {false, true})
          check_case({.M = m, .N = n, .K = k, .trans_a = ta, .trans_b = tb, .input = dt}, blocking_for(isa, false, dt),
                     seed++);
}

// The variant each ISA gives each input type: AMX's tiles take bf16 only.
TEST(MatmulAspen, AmxTakesBf16AndF32StaysOnTheFmaKernels) {
  const GemmBlocking f = gemm_blocking(Isa::amx, DType::f32), h = gemm_blocking(Isa::amx, DType::bf16);
  EXPECT_LE(int(f.isa), int(Isa::avx512));
  if (cpu_features().best >= Isa::amx) {
    EXPECT_EQ(h.isa, Isa::amx);
    EXPECT_EQ(h.mr, 32);
    EXPECT_EQ(h.nr, 32);
    EXPECT_EQ(h.kc % 32, 0);
  } else {  // asked for AMX by name the table still answers; the best this CPU runs is never AMX
    EXPECT_NE(gemm_blocking(cpu_features().best, DType::bf16).isa, Isa::amx)
        << "AMX chosen on a CPU (or OS) without it: " << cpu_features().to_string();
  }
}

TEST(MatmulAspen, BatchesBiasAndAccumulate) {
  uint64_t seed = 10000;
  for (Isa isa : runnable_isas())
    for (bool tiny : {false, true})
      for (DType dt : {DType::f32, DType::bf16})
        for (bool ta : {false, true})
          for (bool tb : {false, true})
            for (bool bcast : {false, true})
              for (bool bias : {false, true})
                for (float beta : {0.0f, 1.0f})
                  check_case({.batch = 3,
                              .M = 19,
                              .N = 37,
                              .K = 23,
                              .trans_a = ta,
                              .trans_b = tb,
                              .broadcast_b = bcast,
                              .has_bias = bias,
                              .beta = beta,
                              .input = dt},
                             blocking_for(isa, tiny, dt), seed++);
}

// NOTE [gemm threads]: teams of 1, 2 and 3 threads cut C into different slabs
// (or share out batch entries); every element is the same FMAs in the same
// order, so the bits match exactly, and so do reruns.
TEST(MatmulAspen, BitsDoNotDependOnTheTeamOrTheRun) {
  for (Isa isa : runnable_isas())
    for (MatmulShape s : {MatmulShape{.M = 301, .N = 203, .K = 77, .has_bias = true},
                          MatmulShape{.batch = 3, .M = 40, .N = 50, .K = 300, .trans_a = true, .trans_b = true},
                          MatmulShape{.batch = 5, .M = 33, .N = 65, .K = 9, .broadcast_b = true, .beta = 1.0f},
                          MatmulShape{.M = 301, .N = 203, .K = 77, .has_bias = true, .input = DType::bf16},
                          MatmulShape{.batch = 3,
                          .M = 40,
                          .N = 50,
                          .K = 300,
                          .trans_a = true,
                          .trans_b = true,
                          .beta = 1.0f,
                          .input = DType::bf16}}) {
      SCOPED_TRACE(s.to_string() + " " + isa_name(isa));
      auto a = testing::random_vector(s.a_elements(), 7), b = testing::random_vector(s.b_elements(), 8);
      auto bias = testing::random_vector(s.N, 9), c0 = testing::random_vector(s.c_elements(), 10);
      std::vector<std::vector<float>> runs;
      for (int threads : {1, 2, 3, 2, 1}) {
        ScopedOmpThreads team(threads);
        runs.push_back(run_plan(s, blocking_for(isa, false, s.input), a, b, bias, c0));
      }
      for (size_t i = 1; i < runs.size(); ++i) EXPECT_EQ(runs[i], runs[0]) << "run " << i;
    }
}

// NOTE [fixed b]: a plan told B is fixed packs it once and gives the bits of
// packing on every run, on every layout, team size and blocking (the tiny one
// cuts B into many blocks); after b_changed() it sees B's new values, and a
// run on another B pointer packs that one.
TEST(MatmulAspen, FixedBIsPackedOnceAndRepackedWhenItChanges) {
  for (Isa isa : runnable_isas())
    for (bool tiny : {false, true})
      for (DType dt : {DType::f32, DType::bf16})
        for (bool tb : {false, true})
          for (int threads : {1, 2, 3}) {
            MatmulShape s{.batch = 3,
                          .M = 37,
                          .N = 75,
                          .K = 70,
                          .trans_b = tb,
                          .broadcast_b = true,
                          .has_bias = true,
                          .input = dt};
            SCOPED_TRACE(s.to_string() + " " + isa_name(isa) + " threads " + std::to_string(threads));
            ScopedOmpThreads team(threads);
            const GemmBlocking blk = blocking_for(isa, tiny, dt);
            auto a = testing::random_vector(s.a_elements(), 1), b1 = testing::random_vector(s.b_elements(), 2);
            auto b2 = testing::random_vector(s.b_elements(), 3), bias = testing::random_vector(s.N, 4);
            const std::vector<float> c0(size_t(s.c_elements()), 0.0f);
            const std::vector<float> want1 = run_plan(s, blk, a, b1, bias, c0),
                                     want2 = run_plan(s, blk, a, b2, bias, c0);
            MatmulShape fs = s;
            fs.b_fixed = true;
            auto plan = make_aspen_plan(fs, blk);
            ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
            auto as_input = [&](const std::vector<float>& v) {
              std::vector<uint16_t> out;  // bf16 bits, or f32 bits in pairs
              if (dt == DType::bf16) {
                for (float x : v) out.push_back(f32_to_bf16(x).bits);
              } else {
                out.resize(v.size() * 2);
                std::memcpy(out.data(), v.data(), v.size() * sizeof(float));
              }
              return out;
            };
            std::vector<uint16_t> ain = as_input(a), bin = as_input(b1), other = as_input(b2);
            std::vector<float> c(c0.size());
            auto run = [&](const std::vector<uint16_t>& bv) {
              std::fill(c.begin(), c.end(), 0.0f);
              (*plan)->run(ain.data(), bv.data(), bias.data(), c.data());
              return c;
            };
            EXPECT_EQ(run(bin), want1) << "first run";
            EXPECT_EQ(run(bin), want1) << "from the kept panels";
            const std::vector<uint16_t> saved = bin;
            const std::vector<uint16_t> values2 = as_input(b2);
            std::copy(values2.begin(), values2.end(), bin.begin());  // new values at the same address
            EXPECT_EQ(run(bin), want1) << "kept panels until told";
            (*plan)->b_changed();
            EXPECT_EQ(run(bin), want2) << "after b_changed";
            EXPECT_EQ(run(saved), want1) << "another B pointer";
            EXPECT_EQ(run(other), want2) << "and another";
          }
}

// Past the weight-copy budget (core/weight_copies.h) a fixed-B plan keeps
// nothing and packs on every run, with the same bits; what a plan keeps it
// gives back when it goes.
TEST(MatmulAspen, FixedBYieldsToTheWeightCopyBudget) {
  const MatmulShape s{.M = 40, .N = 70, .K = 50, .b_fixed = true};
  const GemmBlocking blk = gemm_blocking(active_isa(), s.input);
  auto a = testing::random_vector(s.a_elements(), 1), b = testing::random_vector(s.b_elements(), 2);
  std::vector<float> want(size_t(s.c_elements()), 0.0f), got(want.size());
  ref::matmul<float, float>(a.data(), b.data(), nullptr, want.data(), s);
  const int64_t before = weight_copy_bytes();
  {
    auto plan = make_aspen_plan(s, blk);
    ASSERT_TRUE(plan.is_ok());
    (*plan)->run(a.data(), b.data(), nullptr, got.data());
    EXPECT_GT(weight_copy_bytes(), before) << "the packed B is counted";
    EXPECT_TRUE(testing::close_nmse(got, want, testing::nmse_threshold(DType::f32)));
  }
  EXPECT_EQ(weight_copy_bytes(), before) << "and given back";
  const int64_t room = weight_copy_budget() - before;
  ASSERT_TRUE(take_weight_copy_bytes(room));
  {
    auto plan = make_aspen_plan(s, blk);
    ASSERT_TRUE(plan.is_ok());
    for (int rep = 0; rep < 2; ++rep) {
      std::fill(got.begin(), got.end(), 0.0f);
      (*plan)->run(a.data(), b.data(), nullptr, got.data());
      EXPECT_TRUE(testing::close_nmse(got, want, testing::nmse_threshold(DType::f32))) << rep;
    }
    EXPECT_EQ(weight_copy_bytes(), before + room) << "nothing kept past the budget";
  }
  give_weight_copy_bytes(room);
}

TEST(MatmulAspen, BlockingFollowsTheCachesAndBadOnesAreRefused) {
  for (Isa isa : runnable_isas()) {
    const GemmBlocking b = gemm_blocking(isa, isa == Isa::amx ? DType::bf16 : DType::f32);
    SCOPED_TRACE(b.to_string());
    EXPECT_EQ(b.isa, isa);
    EXPECT_EQ(b.mc % b.mr, 0);
    EXPECT_EQ(b.nc % b.nr, 0);
    // A B panel in about half of L1d, the A block within L2.
    const int64_t esz = isa == Isa::amx ? 2 : 4;  // packed bytes per element
    EXPECT_LE(b.kc * b.nr * esz, cpu_caches().l1d);
    EXPECT_LE(b.mc * b.kc * esz, cpu_caches().l2);
  }
  const MatmulShape s{.M = 4, .N = 4, .K = 4};
  GemmBlocking bad = gemm_blocking(Isa::scalar);
  bad.mc = bad.mr + 1;
  auto r = make_aspen_plan(s, bad);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("multiples"), std::string::npos) << r.status().to_string();
  if (cpu_features().best < Isa::avx512) {
    GemmBlocking wide = gemm_blocking(Isa::avx512);
    if (wide.isa == Isa::avx512) {
      auto r2 = make_aspen_plan(s, wide);
      EXPECT_FALSE(r2.is_ok());
    }
  }
  // NOTE [whole k]: a C whose share per thread outgrows L2 takes all of a K up to 1024 in one block; a
  // small C, or a K past 1024, keeps the cache-sized kc.
  const GemmBlocking base = gemm_blocking(active_isa());
  const int64_t big_n = 2 * cpu_caches().l2 / (sizeof(float) * 128) + 64;  // C's share > L2 on 2 threads
  const GemmBlocking whole = gemm_blocking(MatmulShape{.M = 256, .N = big_n, .K = 770}, 2);
  EXPECT_GE(whole.kc, 770) << whole.to_string();
  EXPECT_LE(whole.mc * whole.kc * 4, cpu_caches().l2) << whole.to_string();
  EXPECT_EQ(gemm_blocking(MatmulShape{.M = 16, .N = 64, .K = 770}, 2).kc, base.kc);
  EXPECT_EQ(gemm_blocking(MatmulShape{.M = 256, .N = big_n, .K = 3000}, 2).kc, base.kc);
  // The checked entry point takes the backend too.
  auto plan = MatmulPlan::create(s, MatmulBackend::aspen);
  ASSERT_TRUE(plan.is_ok()) << plan.status().to_string();
  EXPECT_EQ(plan->backend(), MatmulBackend::aspen);
}

}  // namespace
}  // namespace aspen::kernels
