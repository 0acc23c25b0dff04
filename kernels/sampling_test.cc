#include "kernels/sampling.h"

#include <gtest/gtest.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <limits>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;
using testing::random_vector;

constexpr float kInf = std::numeric_limits<float>::infinity();

// One call's inputs: B rows of V logits, L history ids per row, per-row settings.
struct Case {
  int64_t B = 1, V = 1, L = 0;
  std::vector<float> logits;
  std::vector<int32_t> history;
  std::vector<float> temperature, top_p, penalty;
  std::vector<int32_t> top_k;
  uint64_t seed = 0, step = 0;

  SamplingParams params() const { return {temperature, top_k, top_p, penalty, seed, step}; }
};

// A case with every row at temperature t and the other settings off.
Case make_case(int64_t B, int64_t V, std::vector<float> logits, float t = 1.0f) {
  Case c;
  c.B = B;
  c.V = V;
  c.logits = std::move(logits);
  c.temperature.assign(size_t(B), t);
  c.top_p.assign(size_t(B), 1.0f);
  c.penalty.assign(size_t(B), 1.0f);
  c.top_k.assign(size_t(B), 0);
  return c;
}

std::vector<int32_t> run_fast(const Case& c) {
  Guarded<int32_t> ids(size_t(c.B), -7);
  const Status s = sample_tokens(c.logits, c.history, c.params(), ids.span(), c.B, c.V, c.L);
  EXPECT_TRUE(s.is_ok()) << s.to_string();
  EXPECT_GUARDS(ids);
  return ids.vec();
}

std::vector<int32_t> run_ref_f32(const Case& c) {
  std::vector<int32_t> ids(size_t(c.B), -7);
  ref::sample_tokens<float>(c.logits.data(), c.history.data(), c.temperature.data(), c.top_k.data(), c.top_p.data(),
                            c.penalty.data(), c.seed, c.step, ids.data(), c.B, c.V, c.L);
  return ids;
}

std::vector<int32_t> run_ref_f64(const Case& c) {
  auto d = [](const std::vector<float>& v) { return std::vector<double>(v.begin(), v.end()); };
  const std::vector<double> x = d(c.logits), t = d(c.temperature), p = d(c.top_p), r = d(c.penalty);
  std::vector<int32_t> ids(size_t(c.B), -7);
  ref::sample_tokens<double>(x.data(), c.history.data(), t.data(), c.top_k.data(), p.data(), r.data(), c.seed, c.step,
                             ids.data(), c.B, c.V, c.L);
  return ids;
}

std::string isa_trace(Isa isa) { return std::string("isa=") + isa_name(isa); }

// Logits shaped like a language model's: most tokens far below a few likely ones.
std::vector<float> lm_logits(int64_t n, uint64_t seed) {
  std::vector<float> x = random_vector(size_t(n), seed, 0.0f, 1.0f);
  for (float& v : x) v = 12.0f * v * v * v * v - 4.0f;  // a long tail below a few peaks
  return x;
}

// ---- fast vs reference --------------------------------------------------------------

// Row settings cycled through a batch: greedy, plain temperature, top-k, top-p, both, with penalty.
struct RowSetting {
  float t;
  int32_t k;
  float p, pen;
};
const std::vector<RowSetting> kSettings = {{0.0f, 0, 1.0f, 1.0f},   {0.8f, 0, 1.0f, 1.0f},   {1.0f, 5, 1.0f, 1.0f},
                                           {0.7f, 0, 0.9f, 1.0f},   {1.2f, 50, 0.9f, 1.0f},  {1.0f, 1, 1.0f, 1.3f},
                                           {0.9f, 40, 0.95f, 1.2f}, {0.0f, 0, 1.0f, 1.5f},   {1.5f, 0, 0.5f, 0.8f}};

TEST(SampleTokens, FastMatchesReference) {
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (int64_t V : {int64_t(1), int64_t(17), int64_t(129), int64_t(50257)})
      for (int64_t B : {int64_t(1), int64_t(3), int64_t(7)})
        for (int shape = 0; shape < 2; ++shape) {  // uniform logits, then language-model-like ones
          if (V > 1000 && B > 3 && isa != testing::available_isas(Isa::avx512).back()) continue;
          SCOPED_TRACE(isa_trace(isa) + " V=" + std::to_string(V) + " B=" + std::to_string(B) +
                       " shape=" + std::to_string(shape));
          Case c = make_case(B, V, shape == 0 ? random_vector(size_t(B * V), uint64_t(V + B), -4.0f, 4.0f)
                                              : lm_logits(B * V, uint64_t(V * 3 + B)));
          c.L = 5;
          const std::vector<float> h = random_vector(size_t(B * c.L), 9, -0.3f, 1.0f);
          for (float v : h) c.history.push_back(v < 0 ? -1 : int32_t(v * float(V - 1)));
          for (int64_t b = 0; b < B; ++b) {
            const RowSetting& s = kSettings[size_t((b + shape * 4 + V) % int64_t(kSettings.size()))];
            c.temperature[size_t(b)] = s.t;
            c.top_k[size_t(b)] = s.k;
            c.top_p[size_t(b)] = s.p;
            c.penalty[size_t(b)] = s.pen;
          }
          for (uint64_t step = 0; step < 4; ++step) {
            c.seed = 1234;
            c.step = step;
            const std::vector<int32_t> fast = run_fast(c);
            EXPECT_EQ(fast, run_ref_f32(c)) << "step " << step;
            EXPECT_EQ(fast, run_ref_f64(c)) << "step " << step;
            for (int32_t id : fast) EXPECT_TRUE(id >= 0 && id < V) << id;
          }
        }
  }
}

// Each setting alone over a whole batch of one shape, so every path (heap, refined nucleus cut, blocked
// walk) sees every row count.
TEST(SampleTokens, FastMatchesReferencePerSetting) {
  const int64_t B = 7, V = 50257;
  for (const RowSetting& s : kSettings) {
    SCOPED_TRACE("t=" + std::to_string(s.t) + " k=" + std::to_string(s.k) + " p=" + std::to_string(s.p));
    Case c = make_case(B, V, lm_logits(B * V, 77), s.t);
    c.top_k.assign(size_t(B), s.k);
    c.top_p.assign(size_t(B), s.p);
    c.penalty.assign(size_t(B), s.pen);
    c.L = 3;
    c.history = {0, 5, 7, -1, 50256, 3, 11, 11, 11, 2, 1, 0, 99, 98, 97, 1000, -1, -1, 4, 4, 4};
    c.seed = 99;
    EXPECT_EQ(run_fast(c), run_ref_f32(c));
    EXPECT_EQ(run_fast(c), run_ref_f64(c));
  }
}

// ---- greedy -------------------------------------------------------------------------

TEST(SampleTokens, GreedyTiesTakeTheLowestIndex) {
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    SCOPED_TRACE(isa_trace(isa));
    // Ties at 3 (1, 3, 4); all equal; all -inf (allowed when greedy, as torch.argmax: 0); a tie made by the
    // penalty (x0 = 2 / 2 = 1 = x1); a tie past a vector width (columns 5 and 37 of 40).
    Case c = make_case(5, 40, std::vector<float>(200, -1.0f), 0.0f);
    for (float& v : c.logits) v = -1.0f;
    const float row0[5] = {0, 3, 1, 3, 3};
    for (int i = 0; i < 5; ++i) c.logits[size_t(i)] = row0[i];
    for (int64_t v = 0; v < 40; ++v) c.logits[size_t(80 + v)] = -kInf;
    c.logits[120] = 2.0f;
    c.logits[121] = 1.0f;
    c.logits[160 + 5] = 9.0f;
    c.logits[160 + 37] = 9.0f;
    c.L = 1;
    c.history = {-1, -1, -1, 0, -1};
    c.penalty[3] = 2.0f;
    const std::vector<int32_t> want = {1, 0, 0, 0, 5};
    EXPECT_EQ(run_fast(c), want);
    EXPECT_EQ(run_ref_f32(c), want);
    EXPECT_EQ(run_ref_f64(c), want);
  }
}

TEST(SampleTokens, TopKOneIsGreedy) {
  const int64_t B = 7, V = 129;
  Case c = make_case(B, V, random_vector(size_t(B * V), 5, -3.0f, 3.0f), 0.0f);
  const std::vector<int32_t> greedy = run_fast(c);
  c.temperature.assign(size_t(B), 1.3f);
  c.top_k.assign(size_t(B), 1);
  for (uint64_t step = 0; step < 20; ++step) {
    c.step = step;
    EXPECT_EQ(run_fast(c), greedy) << "step " << step;
  }
}

// logits / t overflows at tiny positive temperatures (1e-45 is a float denormal): the draw is then the greedy
// one, never -1 or an id from NaN weights; with every setting, on every ISA and in the reference.
TEST(SampleTokens, TinyTemperaturesAreGreedy) {
  const int64_t B = 9, V = 257;
  Case c = make_case(B, V, lm_logits(B * V, 17), 0.0f);
  const std::vector<int32_t> greedy = run_ref_f32(c);
  for (float t : {1e-45f, 1e-38f, 1e-30f}) {
    c.temperature.assign(size_t(B), t);
    for (size_t r = 0; r < size_t(B); ++r) {  // top-k and top-p too
      c.top_k[r] = r % 3 == 1 ? 40 : 0;
      c.top_p[r] = r % 3 == 2 ? 0.9f : 1.0f;
    }
    for (uint64_t step = 0; step < 5; ++step) {
      c.step = step;
      EXPECT_EQ(run_ref_f32(c), greedy) << "t " << t;
      EXPECT_EQ(run_ref_f64(c), greedy) << "t " << t;
      for (Isa isa : testing::available_isas(Isa::avx512)) {
        ScopedIsaCap cap(isa);
        EXPECT_EQ(run_fast(c), greedy) << "t " << t << " " << isa_trace(isa);
      }
    }
  }
}

// ---- the draw ------------------------------------------------------------------------

// counts[i] of n draws against probabilities p: Pearson's chi-square.
double chi_square(const std::vector<int>& counts, const std::vector<double>& p, int n) {
  double x2 = 0;
  for (size_t i = 0; i < p.size(); ++i) {
    const double e = p[i] * n;
    x2 += (counts[i] - e) * (counts[i] - e) / e;
  }
  return x2;
}

// 20000 draws (steps 0..19999) from softmax(log p) must fit p: chi-square below its 0.999 quantile (a fixed
// seed makes this deterministic; it guards a skewed or off-by-one inverse CDF). Top-k = 3 renormalizes over
// the three largest; top-p = 0.6 keeps {0.4, 0.3} (mass above 0.2 is 0.7 >= 0.6).
TEST(SampleTokens, DrawsFollowTheDistribution) {
  const std::vector<double> p = {0.1, 0.2, 0.3, 0.4};
  std::vector<float> x;
  for (double v : p) x.push_back(float(std::log(v)));
  struct Want {
    int32_t k;
    float top_p;
    std::vector<double> probs;
    double bound;  // chi-square 0.999 quantile for (kept - 1) degrees of freedom
  };
  const std::vector<Want> wants = {{0, 1.0f, {0.1, 0.2, 0.3, 0.4}, 16.27},
                                   {3, 1.0f, {0.0, 2.0 / 9, 3.0 / 9, 4.0 / 9}, 13.82},
                                   {0, 0.6f, {0.0, 0.0, 3.0 / 7, 4.0 / 7}, 10.83}};
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    ScopedIsaCap cap(isa);
    for (const Want& w : wants) {
      SCOPED_TRACE(isa_trace(isa) + " k=" + std::to_string(w.k) + " p=" + std::to_string(w.top_p));
      Case c = make_case(1, 4, x);
      c.top_k = {w.k};
      c.top_p = {w.top_p};
      c.seed = 20240601;
      constexpr int kDraws = 20000;
      std::vector<int> counts(4, 0);
      for (int s = 0; s < kDraws; ++s) {
        c.step = uint64_t(s);
        ++counts[size_t(run_fast(c)[0])];
      }
      std::vector<int> kept_counts;
      std::vector<double> kept_p;
      for (size_t i = 0; i < 4; ++i) {
        if (w.probs[i] == 0) {
          EXPECT_EQ(counts[i], 0) << "token " << i << " was filtered out";
        } else {
          kept_counts.push_back(counts[i]);
          kept_p.push_back(w.probs[i]);
        }
      }
      EXPECT_LT(chi_square(kept_counts, kept_p, kDraws), w.bound);
    }
  }
}

TEST(SampleTokens, UniformIsKeyedBySeedStepAndRow) {
  EXPECT_EQ(sample_uniform(1, 2, 3), sample_uniform(1, 2, 3));
  EXPECT_NE(sample_uniform(1, 2, 3), sample_uniform(1, 2, 4));
  EXPECT_NE(sample_uniform(1, 2, 3), sample_uniform(1, 3, 3));
  EXPECT_NE(sample_uniform(1, 2, 3), sample_uniform(2, 2, 3));
  double mean = 0;
  for (int i = 0; i < 10000; ++i) {
    const double u = sample_uniform(7, uint64_t(i), i % 5);
    ASSERT_TRUE(u >= 0 && u < 1) << u;
    mean += u / 10000;
  }
  EXPECT_NEAR(mean, 0.5, 0.01);
}

// A near-flat distribution over 1000 tokens: same (seed, step) gives the same ids; another step or seed
// changes most rows.
TEST(SampleTokens, SameSeedSameIdsOtherStepOtherIds) {
  const int64_t B = 32, V = 1000;
  Case c = make_case(B, V, random_vector(size_t(B * V), 3, -0.1f, 0.1f));
  c.seed = 42;
  c.step = 7;
  const std::vector<int32_t> a = run_fast(c);
  EXPECT_EQ(run_fast(c), a);
  auto differing = [&a](const std::vector<int32_t>& b) {
    int n = 0;
    for (size_t i = 0; i < a.size(); ++i) n += a[i] != b[i];
    return n;
  };
  c.step = 8;
  EXPECT_GE(differing(run_fast(c)), 28);
  c.step = 7;
  c.seed = 43;
  EXPECT_GE(differing(run_fast(c)), 28);
}

// Rows are independent of the thread count and of the other rows of the batch (a row's draw is keyed by
// its slot b).
TEST(SampleTokens, IndependentOfThreadsAndOtherRows) {
  const int64_t B = 7, V = 50257;
  Case c = make_case(B, V, lm_logits(B * V, 8));
  for (int64_t b = 0; b < B; ++b) {
    const RowSetting& s = kSettings[size_t(b + 1)];
    c.temperature[size_t(b)] = s.t;
    c.top_k[size_t(b)] = s.k;
    c.top_p[size_t(b)] = s.p;
  }
  c.seed = 5;
  std::vector<int32_t> one;
  {
    ScopedOmpThreads team(1);
    one = run_fast(c);
  }
  for (int threads : {2, 3, 8}) {
    ScopedOmpThreads team(threads);
    EXPECT_EQ(run_fast(c), one) << threads << " threads";
  }
  // Other rows changed (logits and settings): row 3 draws the same.
  Case d = c;
  for (int64_t b = 0; b < B; ++b)
    if (b != 3) {
      for (int64_t v = 0; v < V; ++v) d.logits[size_t(b * V + v)] *= -1.0f;
      d.top_k[size_t(b)] = 2;
    }
  EXPECT_EQ(run_fast(d)[3], one[3]);
}

// ---- Hugging Face semantics --------------------------------------------------------------

// The set of ids drawn over `n` steps.
std::set<int32_t> support(Case c, int n) {
  std::set<int32_t> s;
  for (int i = 0; i < n; ++i) {
    c.step = uint64_t(i);
    s.insert(run_fast(c)[0]);
    EXPECT_EQ(run_fast(c), run_ref_f32(c));
  }
  return s;
}

TEST(SampleTokens, TopKKeepsTiesAtTheCut) {
  // k = 2: the 2nd largest is 2, tied by columns 2 and 3: HF keeps all three >= 2.
  Case c = make_case(1, 5, {1, 3, 2, 2, 0}, 5.0f);
  c.top_k = {2};
  EXPECT_EQ(support(c, 400), (std::set<int32_t>{1, 2, 3}));
  c.top_k = {1};  // ties at the top: both kept
  c.logits = {1, 3, 2, 3, 0};
  EXPECT_EQ(support(c, 400), (std::set<int32_t>{1, 3}));
}

TEST(SampleTokens, TopPBoundaries) {
  // P = {0.5, 0.25, 0.125, 0.125}. Mass above: 0, 0.5, 0.75, 0.75.
  std::vector<float> x;
  for (double v : {0.5, 0.25, 0.125, 0.125}) x.push_back(float(std::log(v)));
  Case c = make_case(1, 4, x);
  c.top_p = {0.74f};  // HF: ascending cumsum {.125, .25, .5, 1} <= 0.26 removed: keeps {0, 1}
  EXPECT_EQ(support(c, 400), (std::set<int32_t>{0, 1}));
  c.top_p = {0.76f};  // mass above the tied pair is 0.75 < 0.76: both kept (NOTE [top-p ties])
  EXPECT_EQ(support(c, 400), (std::set<int32_t>{0, 1, 2, 3}));
  c.top_p = {0.45f};  // the top token alone reaches it (mass above token 1 is 0.5): only it
  EXPECT_EQ(support(c, 200), (std::set<int32_t>{0}));
  // Top-k first, then top-p over the renormalized survivors: k = 2 leaves {2/3, 1/3}, so p = 0.6 drops
  // token 1 (mass above it 2/3; it would be 0.5 < 0.6 without renormalizing).
  c.top_k = {2};
  c.top_p = {0.6f};
  EXPECT_EQ(support(c, 200), (std::set<int32_t>{0}));
}

TEST(SampleTokens, RepetitionPenaltyDividesPositiveAndMultipliesNegative) {
  Case c = make_case(3, 2, {4.0f, 1.5f, -1.0f, -1.5f, 4.0f, 1.5f}, 0.0f);
  c.L = 3;
  // Row 0: 4 / 2 = 2 > 1.5, once although listed twice. Row 1: -1 * 2 = -2 < -1.5. Row 2: padding only.
  c.history = {0, 0, -1, 0, -1, -3, -1, -1, -1};
  c.penalty = {2.0f, 2.0f, 2.0f};
  const std::vector<int32_t> want = {0, 1, 0};
  EXPECT_EQ(run_fast(c), want);
  EXPECT_EQ(run_ref_f32(c), want);
  EXPECT_EQ(run_ref_f64(c), want);
  c.penalty = {3.0f, 1.0f, 1.0f};  // 4 / 3 < 1.5
  EXPECT_EQ(run_fast(c), (std::vector<int32_t>{1, 0, 0}));
}

// ---- errors: each message once -------------------------------------------------------

std::string error_of(const Case& c) {
  std::vector<int32_t> ids(size_t(c.B));
  return sample_tokens(c.logits, c.history, c.params(), ids, c.B, c.V, c.L).message();
}

TEST(SampleTokens, Errors) {
  const Case good = make_case(2, 3, {0, 1, 2, 3, 4, 5});
  Case c = good;
  c.temperature[1] = -0.5f;
  EXPECT_EQ(error_of(c), "sample_tokens: argument 'temperature' row 1: expected a finite number >= 0 (0: greedy), "
                         "found -0.5");
  c = good;
  c.top_k[0] = -1;
  EXPECT_EQ(error_of(c), "sample_tokens: argument 'top_k' row 0: expected a number >= 0 (0: off), found -1");
  c = good;
  c.top_p[1] = 0.0f;
  EXPECT_EQ(error_of(c), "sample_tokens: argument 'top_p' row 1: expected a number in (0, 1] (1: off), found 0");
  c = good;
  c.penalty[0] = 0.0f;
  EXPECT_EQ(error_of(c),
            "sample_tokens: argument 'repetition_penalty' row 0: expected a finite number > 0 (1: off), found 0");
  c = good;
  c.logits[4] = std::nanf("");
  EXPECT_EQ(error_of(c), "sample_tokens: argument 'logits' row 1 column 1: expected a number or -inf, found nan");
  c = good;
  c.logits = {0, 1, 2, -kInf, -kInf, -kInf};
  EXPECT_EQ(error_of(c),
            "sample_tokens: argument 'logits' row 1: expected at least one logit > -inf (temperature > 0), found all "
            "-inf");
  c = good;
  c.L = 2;
  c.history = {0, -1, 2, 3};
  EXPECT_EQ(error_of(c),
            "sample_tokens: argument 'history' row 1 position 1: expected a token id < V = 3 (negative: padding), "
            "found 3");
  c = good;
  c.logits.resize(5);
  EXPECT_EQ(error_of(c), "sample_tokens: argument 'logits': expected at least 6 elements, found 5");
  c = good;
  c.V = 0;
  EXPECT_EQ(error_of(c), "sample_tokens: V: expected >= 1, found 0");
  std::vector<std::byte> small(16);
  std::vector<int32_t> ids(2);
  EXPECT_EQ(sample_tokens(good.logits, {}, good.params(), ids, 2, 3, 0, small).message(),
            "sample_tokens: argument 'workspace': expected at least " +
                std::to_string(sample_tokens_workspace_bytes(3, 1)) + " bytes (one slot for V = 3), found 16");
}

// ---- speed (printed, not asserted) --------------------------------------------------------

TEST(SampleTokens, SpeedAgainstReference) {
  const int64_t V = 50257;
  Case c = make_case(1, V, lm_logits(V, 11));
  auto time_us = [&c](auto f, int reps) {
    f();
    const auto t0 = std::chrono::steady_clock::now();
    for (int i = 0; i < reps; ++i) f();
    return std::chrono::duration<double, std::micro>(std::chrono::steady_clock::now() - t0).count() / reps;
  };
  std::vector<std::byte> ws(size_t(sample_tokens_workspace_bytes(V, 1)));
  std::vector<int32_t> ids(1);
  for (auto [k, p] : {std::pair<int32_t, float>{50, 1.0f}, {0, 0.9f}, {50, 0.9f}, {0, 1.0f}}) {
    c.top_k = {k};
    c.top_p = {p};
    const double fast = time_us([&] { (void)sample_tokens(c.logits, {}, c.params(), ids, 1, V, 0, ws); }, 200);
    const double ref = time_us([&] { run_ref_f32(c); }, 5);
    std::printf("sample_tokens B=1 V=%lld top_k=%d top_p=%.2f: fast %.1f us, reference %.1f us (%.0fx)\n",
                static_cast<long long>(V), k, double(p), fast, ref, ref / fast);
  }
}

}  // namespace
}  // namespace aspen::kernels
