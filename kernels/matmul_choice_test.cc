#include "kernels/matmul_choice.h"

#include <gtest/gtest.h>
#include <omp.h>

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <sstream>

#include "kernels/matmul_backend.h"

namespace aspen::kernels {
namespace {

std::string temp_path(const std::string& name) {
  return (std::filesystem::temp_directory_path() / ("aspen_choice_" + std::to_string(getpid()) + "_" + name)).string();
}

std::string read_all(const std::string& path) {
  std::ifstream f(path);
  std::stringstream s;
  s << f.rdbuf();
  return s.str();
}

TEST(MatmulChoice, MeasuresOnceAndRemembers) {
  clear_matmul_choices();
  ASSERT_EQ(set_matmul_choice(MatmulChoice::measured), MatmulChoice::measured);
  const MatmulShape s{.M = 64, .N = 48, .K = 80, .has_bias = true};
  auto first = choose_matmul_backend(s, omp_get_max_threads());
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_EQ(matmul_choices_count(), 1u);
  EXPECT_TRUE(matmul_choices_changed());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(*choose_matmul_backend(s, omp_get_max_threads()), *first);
  EXPECT_EQ(matmul_choices_count(), 1u);
  // A plan made without a backend takes the choice.
  auto plan = MatmulPlan::create(s);
  ASSERT_TRUE(plan.is_ok());
  EXPECT_EQ(plan->backend(), *first);
  // Another team size is the same product: one backend whatever the team (NOTE [matmul choice margin]).
  EXPECT_EQ(*choose_matmul_backend(s, omp_get_max_threads() + 1), *first);
  EXPECT_EQ(matmul_choices_count(), 1u);
}

// NOTE [matmul choice margin]: aspen's kernel stays unless another is at least 1.5x faster; the 5-33 %
// differences between good libraries never flip the choice, whichever way the noise falls.
TEST(MatmulChoice, AnotherBackendNeedsAClearLead) {
  const auto decide = [](double aspen, double onednn, double openblas) {
    std::vector<MatmulTiming> t = {{MatmulBackend::aspen, aspen}, {MatmulBackend::onednn, onednn},
                                   {MatmulBackend::openblas, openblas}};
    std::stable_sort(t.begin(), t.end(), [](const MatmulTiming& x, const MatmulTiming& y) { return x.gflops > y.gflops; });
    return decide_matmul_backend(t);
  };
  EXPECT_EQ(decide(100, 101, 99), MatmulBackend::aspen);    // a tie: the preferred one
  EXPECT_EQ(decide(100, 133, 50), MatmulBackend::aspen);    // a third ahead is not enough
  EXPECT_EQ(decide(100, 151, 50), MatmulBackend::onednn);   // 1.5x is
  EXPECT_EQ(decide(100, 160, 300), MatmulBackend::openblas);  // the fastest of those with a lead
  EXPECT_EQ(decide(100, 90, 80), MatmulBackend::aspen);
  // Without aspen among the candidates, the fastest.
  EXPECT_EQ(decide_matmul_backend({{MatmulBackend::onednn, 90}, {MatmulBackend::openblas, 80}}), MatmulBackend::onednn);
}

// What a run used, as text it can keep and adopt again, and in words.
TEST(MatmulChoice, UsedChoicesAreTheRunsOwn) {
  clear_matmul_choices();
  const MatmulChoice before = set_matmul_choice(MatmulChoice::measured);
  const MatmulShape a{.M = 24, .N = 40, .K = 16}, b{.M = 8, .N = 8, .K = 8};
  ASSERT_TRUE(choose_matmul_backend(a, 1).is_ok());
  ASSERT_TRUE(choose_matmul_backend(b, 1).is_ok());
  clear_matmul_choices_used();  // a run starts: only what it plans from here is its own
  ASSERT_TRUE(choose_matmul_backend(a, 2).is_ok());
  const std::string used = matmul_choices_used_text();
  EXPECT_NE(used.find("1 24 40 16 "), std::string::npos) << used;
  EXPECT_EQ(used.find("1 8 8 8 "), std::string::npos) << used;
  EXPECT_EQ(matmul_choices_used_summary().rfind("1 matrix product shape (1 on ", 0), 0u)
      << matmul_choices_used_summary();
  EXPECT_NE(matmul_choices_used_summary().find("1 measured now"), std::string::npos) << matmul_choices_used_summary();
  // A resumed run adopts its checkpoint's: the one shape answers with the checkpoint's backend, and says so.
  const std::string other = used.find(" aspen\n") != std::string::npos ? "oneDNN" : "aspen";
  const std::string forced = used.substr(0, used.rfind(' ', used.size() - 2) + 1) + other + "\n";
  clear_matmul_choices();
  ASSERT_TRUE(adopt_matmul_choices(forced, "checkpoint step-5").is_ok());
  EXPECT_STREQ(matmul_backend_name(*choose_matmul_backend(a, 1)), other.c_str());
  EXPECT_NE(matmul_choices_used_summary().find("1 from checkpoint step-5"), std::string::npos)
      << matmul_choices_used_summary();
  clear_matmul_choices();
  set_matmul_choice(before);
}

TEST(MatmulChoice, MeasurementTimesEveryCandidateFastestFirst) {
  for (DType dt : {DType::f32, DType::bf16}) {
    const MatmulShape s{.M = 100, .N = 70, .K = 90, .trans_b = true, .input = dt};
    auto t = measure_matmul_backends(s);
    ASSERT_TRUE(t.is_ok()) << t.status().to_string();
    // aspen and oneDNN run every shape; OpenBLAS f32 ones (its OpenMP build).
    const size_t want = 2 + (dt == DType::f32 && openblas_is_openmp_build() ? 1 : 0);
    EXPECT_EQ(t->size(), want);
    for (size_t i = 0; i < t->size(); ++i) {
      EXPECT_GT((*t)[i].gflops, 0.0);
      if (i) {
        EXPECT_GE((*t)[i - 1].gflops, (*t)[i].gflops);
      }
    }
  }
}

TEST(MatmulChoice, RuleModeTakesTheFixedRule) {
  clear_matmul_choices();
  const MatmulChoice before = set_matmul_choice(MatmulChoice::rule);
  const MatmulShape s{.M = 300, .N = 4096, .K = 64};
  EXPECT_EQ(*choose_matmul_backend(s, 2), matmul_backend_for(s, 2));
  EXPECT_EQ(matmul_choices_count(), 0u);  // nothing measured, nothing remembered
  // A remembered choice (loaded, or adopted from process 0) is a measurement: the rule ignores it.
  set_matmul_choice(MatmulChoice::measured);
  ASSERT_TRUE(choose_matmul_backend(s, 2).is_ok());
  std::string text = matmul_choices_text();
  const std::string rule_name = matmul_backend_name(matmul_backend_for(s, 2));
  const std::string other = rule_name == "aspen" ? "oneDNN" : "aspen";
  text = text.substr(0, text.rfind(' ') + 1) + other + "\n";  // the one row names another backend
  ASSERT_TRUE(adopt_matmul_choices(text, "the test").is_ok());
  EXPECT_STREQ(matmul_backend_name(*choose_matmul_backend(s, 2)), other.c_str());
  set_matmul_choice(MatmulChoice::rule);
  EXPECT_EQ(*choose_matmul_backend(s, 2), matmul_backend_for(s, 2));
  clear_matmul_choices();
  set_matmul_choice(before);
}

TEST(MatmulChoice, ChoicesSurviveSaveAndLoad) {
  clear_matmul_choices();
  const MatmulShape a{.M = 32, .N = 40, .K = 24}, b{.batch = 3, .M = 8, .N = 16, .K = 24, .trans_a = true,
                                                    .broadcast_b = true, .beta = 1.0f, .input = DType::bf16};
  const MatmulBackend ca = *choose_matmul_backend(a, 1), cb = *choose_matmul_backend(b, 2);
  const std::string path = temp_path("choices.txt");
  ASSERT_TRUE(save_matmul_choices(path).is_ok());
  EXPECT_FALSE(matmul_choices_changed());
  clear_matmul_choices();
  ASSERT_TRUE(load_matmul_choices(path).is_ok());
  EXPECT_EQ(matmul_choices_count(), 2u);
  EXPECT_FALSE(matmul_choices_changed());
  // Loaded choices answer without measuring (the rule is off, so a miss would measure and count).
  EXPECT_EQ(*choose_matmul_backend(a, 1), ca);
  EXPECT_EQ(*choose_matmul_backend(b, 2), cb);
  EXPECT_FALSE(matmul_choices_changed());
  // A missing file is no error; the path names this CPU.
  EXPECT_TRUE(load_matmul_choices(temp_path("missing.txt")).is_ok());
  EXPECT_NE(matmul_choices_path("/x").find(cpu_identity_digest()), std::string::npos);
  std::remove(path.c_str());
}

TEST(MatmulChoice, AnotherMachinesOrACorruptFileIsRefused) {
  clear_matmul_choices();
  ASSERT_TRUE(choose_matmul_backend({.M = 16, .N = 16, .K = 16}, 1).is_ok());
  const std::string path = temp_path("bad.txt");
  ASSERT_TRUE(save_matmul_choices(path).is_ok());
  const std::string good = read_all(path);
  const auto write = [&](const std::string& text) {
    std::ofstream(path, std::ios::trunc) << text;
  };
  const auto expect_refused = [&](const std::string& text, const std::string& needle) {
    write(text);
    clear_matmul_choices();
    Status st = load_matmul_choices(path);
    EXPECT_FALSE(st.is_ok()) << text;
    EXPECT_NE(st.to_string().find(needle), std::string::npos) << st.to_string();
    EXPECT_EQ(matmul_choices_count(), 0u) << "nothing of a refused file is used";
  };
  const size_t cpu_line = good.find("\ncpu ") + 1, rows = good.find('\n', cpu_line) + 1;
  expect_refused(good.substr(0, cpu_line) + "cpu SomeOtherVendor family 1\n" + good.substr(rows), "this CPU");
  expect_refused("not the magic\n" + good.substr(cpu_line), "first line");
  expect_refused(good + "1 2 3\n", "line 4");
  expect_refused(good + "1 2 3 4 0 0 0 0 0 0 f32 cuBLAS\n", "cuBLAS");
  expect_refused(good + "1 -2 3 4 0 0 0 0 0 0 f64 aspen\n", "positive extents");
  expect_refused(good + "1 2 3 4 0 0 0 0 0 0 f32 1 aspen\n", "line 4");  // format 2's team column
  // A file of format 2 (choices per team size) is measured again, not refused.
  write("aspen matmul choices 2\n" + good.substr(cpu_line) + "1 2 3 4 0 0 0 0 0 0 f32 1 aspen\n");
  clear_matmul_choices();
  EXPECT_TRUE(load_matmul_choices(path).is_ok());
  EXPECT_EQ(matmul_choices_count(), 0u);
  std::remove(path.c_str());
}

// NOTE [openblas core]: a detection that fell back to old kernels is corrected
// to the newest the CPU runs; a right one is left alone.
TEST(MatmulChoice, OpenBlasCoreOverrideOnlyForAFallback) {
  CpuFeatures avx2;
  avx2.avx2 = avx2.fma = true;
  CpuFeatures avx512 = avx2;
  avx512.avx512f = avx512.avx512bw = avx512.avx512vl = avx512.avx512dq = true;
  CpuFeatures bf16 = avx512;
  bf16.avx512_bf16 = true;
  EXPECT_STREQ(openblas_core_override("Prescott", bf16), "Cooperlake");  // Debian's 0.3.21 on the Xeon model 207
  EXPECT_STREQ(openblas_core_override("Prescott", avx512), "SkylakeX");
  EXPECT_STREQ(openblas_core_override("Haswell", avx512), "SkylakeX");
  EXPECT_STREQ(openblas_core_override("Nehalem", avx2), "Haswell");
  EXPECT_EQ(openblas_core_override("Zen", avx2), nullptr);
  EXPECT_EQ(openblas_core_override("Haswell", avx2), nullptr);
  EXPECT_EQ(openblas_core_override("SkylakeX", avx512), nullptr);
  EXPECT_EQ(openblas_core_override("Cooperlake", bf16), nullptr);
  EXPECT_EQ(openblas_core_override("Prescott", CpuFeatures{}), nullptr);  // an old CPU: its detection stands
  // This process: whatever it says, the warning agrees.
  EXPECT_EQ(openblas_core_override() != nullptr, !library_kernels_warning().empty());
}

}  // namespace
}  // namespace aspen::kernels
