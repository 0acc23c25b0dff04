#include "kernels/gemv.h"

#include <gtest/gtest.h>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;

struct Inputs {
  std::vector<float> x, w, bias;
  std::vector<bf16> wb;  // w rounded to bf16 (what a bf16 case multiplies)
};

Inputs make_inputs(const GemvShape& s, uint64_t seed) {
  Inputs in{testing::random_vector(size_t(s.x_elements()), seed), testing::random_vector(size_t(s.w_elements()), seed + 1),
            testing::random_vector(size_t(s.N), seed + 2), {}};
  if (s.x_bf16)  // the caller's promise: x holds bf16 values
    for (float& v : in.x) v = bf16_to_f32(f32_to_bf16(v));
  if (s.weight == DType::bf16) {
    in.wb.resize(in.w.size());
    for (size_t i = 0; i < in.w.size(); ++i) {
      in.wb[i] = f32_to_bf16(in.w[i]);
      in.w[i] = bf16_to_f32(in.wb[i]);
    }
  }
  return in;
}

// The fast path's y (between guard bytes) at the current ISA and team size.
std::vector<float> run_fast(const GemvShape& s, const Inputs& in) {
  Guarded<float> y(size_t(s.y_elements()), std::numeric_limits<float>::quiet_NaN());
  Guarded<float> x(in.x.size()), bias(in.bias.size());
  std::copy(in.x.begin(), in.x.end(), x.data());
  std::copy(in.bias.begin(), in.bias.end(), bias.data());
  const std::span<const float> b = s.has_bias ? bias.cspan() : std::span<const float>();
  Status st;
  if (s.weight == DType::f32) {
    Guarded<float> w(in.w.size());
    std::copy(in.w.begin(), in.w.end(), w.data());
    st = gemv(x.cspan(), w.cspan(), b, y.span(), s);
  } else {
    Guarded<bf16> w(in.wb.size());
    std::copy(in.wb.begin(), in.wb.end(), w.data());
    st = gemv(x.cspan(), w.cspan(), b, y.span(), s);
  }
  EXPECT_TRUE(st.is_ok()) << st.message();
  EXPECT_GUARDS(y);
  return y.vec();
}

// Fast at every ISA vs the f64 reference on the same (bf16-exact) values.
void check_case(const GemvShape& s, uint64_t seed) {
  SCOPED_TRACE(s.to_string());
  const Inputs in = make_inputs(s, seed);
  std::vector<double> want(size_t(s.y_elements()));
  const std::vector<double> x = testing::to_f64(in.x), w = testing::to_f64(in.w), bias = testing::to_f64(in.bias);
  ref::gemv<double, double>(x.data(), w.data(), s.has_bias ? bias.data() : nullptr, want.data(), s);
  for (Isa isa : testing::available_isas()) {
    if (testing::skip_big(s.w_elements(), isa)) continue;
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
    const std::vector<float> got = run_fast(s, in);
    EXPECT_TRUE(testing::close_nmse(got, want, testing::nmse_threshold(DType::f32)));
  }
}

// x_bf16 (bf16 weights): NOTE [gemv bf16 dot]'s kernels where the CPU has VDPBF16PS.
TEST(Gemv, MatchesReferenceOverOddShapes) {
  uint64_t seed = 1;
  for (auto [wt, xb] : {std::pair{DType::f32, false}, {DType::bf16, false}, {DType::bf16, true}})
    for (bool tb : {false, true})
      for (int64_t m : {1, 2, 3, 5, 8, 11})
        for (int64_t n : testing::kOddSizes)
          for (int64_t k : testing::kOddSizes)
            for (bool bias : {false, true})
              check_case({.M = m, .N = n, .K = k, .trans_b = tb, .has_bias = bias, .weight = wt, .x_bf16 = xb},
                         seed++);
}

TEST(Gemv, MatchesReferenceOnModelShapes) {
  uint64_t seed = 1000;
  const std::vector<std::pair<int64_t, int64_t>> nk = {{768, 2304}, {2304, 768}, {768, 17}, {129, 768}, {3, 2304}};
  for (auto [wt, xb] : {std::pair{DType::f32, false}, {DType::bf16, false}, {DType::bf16, true}})
    for (bool tb : {false, true})
      for (int64_t m : {1, 3, 8, 16})
        for (auto [n, k] : nk)
          check_case({.M = m, .N = n, .K = k, .trans_b = tb, .has_bias = (seed % 2) == 0, .weight = wt, .x_bf16 = xb},
                     seed++);
}

// NOTE [gemv split]: the team size moves the cuts in N, never an output's arithmetic.
TEST(Gemv, SameBitsOnOneAndTwoThreads) {
  uint64_t seed = 2000;
  for (DType wt : {DType::f32, DType::bf16})
    for (bool tb : {false, true})
      for (int64_t m : {1, 5}) {
        const GemvShape s{.M = m, .N = 2304 + 7, .K = 768 + 3, .trans_b = tb, .has_bias = true, .weight = wt};
        SCOPED_TRACE(s.to_string());
        const Inputs in = make_inputs(s, seed++);
        for (Isa isa : testing::available_isas()) {
          SCOPED_TRACE(isa_name(isa));
          ScopedIsaCap cap(isa);
          std::vector<float> one, two;
          {
            ScopedOmpThreads t(1);
            one = run_fast(s, in);
          }
          {
            ScopedOmpThreads t(2);
            two = run_fast(s, in);
          }
          ASSERT_EQ(one.size(), two.size());
          EXPECT_EQ(0, std::memcmp(one.data(), two.data(), one.size() * sizeof(float)));
        }
      }
}

// A row's result does not depend on the rows beside it (NOTE [gemv row blocks]): each row of an M-row product
// has the bits of that row alone, on every ISA, so a batch of decodes gives each sequence what it gets alone;
// with x_bf16 too, where M > 1 takes VDPBF16PS and one row the FMA kernels (NOTE [gemv bf16 dot]).
TEST(Gemv, EachRowHasItsSingleRowBits) {
  uint64_t seed = 2500;
  for (auto [wt, xb] : {std::pair{DType::f32, false}, {DType::bf16, false}, {DType::bf16, true}})
    for (bool tb : {false, true})
      for (auto [n, k] : {std::pair<int64_t, int64_t>{2304 + 7, 768 + 3}, {101, 45}, {47, 9}})
        for (int64_t m : {2, 5, 8, 11}) {
          const GemvShape s{.M = m, .N = n, .K = k, .trans_b = tb, .has_bias = m % 2 == 1, .weight = wt, .x_bf16 = xb};
          SCOPED_TRACE(s.to_string());
          const Inputs in = make_inputs(s, seed++);
          GemvShape one = s;
          one.M = 1;
          for (Isa isa : testing::available_isas()) {
            SCOPED_TRACE(isa_name(isa));
            ScopedIsaCap cap(isa);
            const std::vector<float> all = run_fast(s, in);
            for (int64_t r = 0; r < m; ++r) {
              Inputs row = in;
              row.x.assign(in.x.begin() + r * k, in.x.begin() + (r + 1) * k);
              const std::vector<float> alone = run_fast(one, row);
              EXPECT_EQ(0, std::memcmp(alone.data(), all.data() + r * n, size_t(n) * sizeof(float))) << "row " << r;
            }
          }
        }
}

// NOTE [packed gemv]: a bf16 row product on gemv_pack's layout gives gemv's bits on w as stored, on every ISA
// and team size, [N, K] (odd K: a short last chunk; odd N: rows past the last group) and [K, N] (odd K: rows
// past the last block; odd N: a short last chunk; K slices with 2 threads; N over one 4096-column panel), and
// the reference's in reference mode.
TEST(Gemv, PackedBf16RowsGiveTheSameBits) {
  uint64_t seed = 3000;
  using Case = std::tuple<int64_t, int64_t, int64_t, bool, bool>;  // M, N, K, trans_b, x_bf16
  for (auto [M, N, K, tb, xb] :
       {Case{1, 8, 32, true, false}, Case{1, 13, 45, true, false}, Case{1, 2304 + 5, 768 + 3, true, false},
        Case{1, 50257, 96, true, false}, Case{1, 33, 8, false, false}, Case{1, 70, 45, false, false},
        Case{1, 2304 + 5, 768 + 3, false, false}, Case{1, 4096 + 40, 64, false, false},
        Case{3, 2304 + 5, 768 + 3, true, false}, Case{3, 2304 + 5, 768 + 3, true, true},
        Case{8, 13, 45, true, true}, Case{8, 1000 + 3, 96, true, false}, Case{8, 1000 + 3, 96, true, true}}) {
    const GemvShape s{.M = M, .N = N, .K = K, .trans_b = tb, .has_bias = N % 2 == 1, .weight = DType::bf16,
                      .x_bf16 = xb};
    SCOPED_TRACE(s.to_string());
    if (!tb && cpu_features().best < Isa::avx512) {
      EXPECT_FALSE(gemv_packable(s));  // [K, N] is packed for the AVX-512 kernel only
      continue;
    }
    ASSERT_TRUE(gemv_packable(s));
    const Inputs in = make_inputs(s, seed++);
    std::vector<bf16> packed(in.wb.size());
    gemv_pack(s, in.wb.data(), packed.data());
    const float* bias = s.has_bias ? in.bias.data() : nullptr;
    for (Isa isa : testing::available_isas())
      for (int threads : {1, 2}) {
        SCOPED_TRACE(std::string(isa_name(isa)) + ", threads " + std::to_string(threads));
        ScopedIsaCap cap(isa);
        ScopedOmpThreads t(threads);
        const std::vector<float> want = run_fast(s, in);
        std::vector<float> got(want.size(), std::numeric_limits<float>::quiet_NaN());
        gemv_run_packed(s, in.x.data(), packed.data(), bias, got.data());
        EXPECT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float)));
      }
    ScopedReferenceMode reference(true);
    std::vector<float> want(static_cast<size_t>(M * N)), got(static_cast<size_t>(M * N));
    ref::gemv<float, bf16>(in.x.data(), in.wb.data(), bias, want.data(), s);
    gemv_run_packed(s, in.x.data(), packed.data(), bias, got.data());
    EXPECT_EQ(0, std::memcmp(want.data(), got.data(), got.size() * sizeof(float)));
  }
  EXPECT_FALSE(gemv_packable(GemvShape{.M = 2, .N = 16, .K = 32, .trans_b = false, .weight = DType::bf16}));
  EXPECT_FALSE(gemv_packable(GemvShape{.M = 1, .N = 16, .K = 32, .trans_b = true, .weight = DType::f32}));
}

// NOTE [gemv groups]: products of one x run as one group give, each, the bits of the product run alone
// (gemv_run, or gemv_run_packed where packed), on every ISA and team size: sizes that cut a product's rows
// anywhere among the threads (odd N, a product smaller than a thread's share, packed and not side by side),
// f32 and bf16, one row and several, x_bf16 (VDPBF16PS), biases on some.
TEST(Gemv, GroupGivesEachProductItsOwnBits) {
  uint64_t seed = 3500;
  for (auto [wt, xb] : {std::pair{DType::f32, false}, {DType::bf16, false}, {DType::bf16, true}})
    for (int64_t m : {1, 3, 8})
      for (const std::vector<int64_t>& ns :
           {std::vector<int64_t>{768 + 5, 256 + 3, 256}, std::vector<int64_t>{2048 + 16, 2048 + 16},
            std::vector<int64_t>{5, 1300, 17, 9}}) {
        const int64_t K = 768 + 3;
        std::vector<GemvShape> shapes;
        std::vector<Inputs> ins;
        std::vector<std::vector<bf16>> packed(ns.size());
        const Inputs xs = make_inputs(GemvShape{.M = m, .N = 1, .K = K, .x_bf16 = xb}, seed++);
        for (size_t c = 0; c < ns.size(); ++c) {
          shapes.push_back(GemvShape{.M = m, .N = ns[c], .K = K, .trans_b = true, .has_bias = c % 2 == 1,
                                     .weight = wt, .x_bf16 = xb});
          ins.push_back(make_inputs(shapes.back(), seed++));
          ins.back().x = xs.x;  // one x for all
          if (wt == DType::bf16 && c % 2 == 0 && gemv_packable(shapes.back())) {
            packed[c].resize(ins.back().wb.size());
            gemv_pack(shapes.back(), ins.back().wb.data(), packed[c].data());
          }
        }
        SCOPED_TRACE(shapes[0].to_string() + ", " + std::to_string(ns.size()) + " products");
        for (Isa isa : testing::available_isas())
          for (int threads : {1, 2}) {
            SCOPED_TRACE(std::string(isa_name(isa)) + ", threads " + std::to_string(threads));
            ScopedIsaCap cap(isa);
            ScopedOmpThreads t(threads);
            std::vector<std::vector<float>> got(ns.size());
            std::vector<GemvCall> calls;
            for (size_t c = 0; c < ns.size(); ++c) {
              got[c].assign(size_t(m * ns[c]), std::numeric_limits<float>::quiet_NaN());
              const bool pk = !packed[c].empty();
              const void* w = pk ? static_cast<const void*>(packed[c].data())
                                 : wt == DType::bf16 ? static_cast<const void*>(ins[c].wb.data())
                                                     : static_cast<const void*>(ins[c].w.data());
              calls.push_back(GemvCall{shapes[c], w, pk, ins[c].bias.data(), got[c].data()});
            }
            gemv_run_group(xs.x.data(), calls);
            for (size_t c = 0; c < ns.size(); ++c) {
              const std::vector<float> want = run_fast(shapes[c], ins[c]);
              EXPECT_EQ(0, std::memcmp(want.data(), got[c].data(), want.size() * sizeof(float))) << "product " << c;
            }
          }
      }
}

TEST(Gemv, ReferenceModeRunsTheReference) {
  const GemvShape s{.M = 2, .N = 5, .K = 7, .trans_b = true, .weight = DType::bf16};
  const Inputs in = make_inputs(s, 7);
  std::vector<float> got(10), want(10);
  {
    ScopedReferenceMode r(true);
    ASSERT_TRUE(gemv(in.x, in.wb, {}, got, s).is_ok());
  }
  ref::gemv<float, bf16>(in.x.data(), in.wb.data(), nullptr, want.data(), s);
  EXPECT_EQ(got, want);
}

TEST(Gemv, BadArgumentsAreStatuses) {
  GemvShape s{.M = 2, .N = 3, .K = 4};
  std::vector<float> x(8), w(12), y(6), y_short(5);
  Status st = gemv(x, w, {}, y_short, s);
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
  EXPECT_EQ(st.message(), "gemv: argument 'y': expected at least 6 elements, found 5");
  EXPECT_EQ(gemv(x, std::span<const float>(w.data(), 11), {}, y, s).message(),
            "gemv: argument 'w': expected at least 12 elements, found 11");
  s.has_bias = true;
  EXPECT_EQ(gemv(x, w, {}, y, s).message(), "gemv: argument 'bias': expected a buffer of 3 elements, found a null pointer");
  s.has_bias = false;
  s.M = 0;
  EXPECT_EQ(gemv(x, w, {}, y, s).message(), "gemv: M: expected >= 1, found 0");
  s.M = 2;
  s.weight = DType::bf16;
  EXPECT_EQ(gemv(x, w, {}, y, s).message(), "gemv: shape.weight: expected f32 (w's type), found bf16");
  s.weight = DType::f16;
  st = gemv_validate(s);
  EXPECT_EQ(st.code(), Code::kUnimplemented);
  EXPECT_EQ(st.message(), "gemv: weight dtype: expected f32 or bf16, found f16");
}

}  // namespace
}  // namespace aspen::kernels
