#include "kernels/embedding.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::Guarded;

std::vector<int32_t> random_ids(int64_t n, int64_t V, uint64_t seed) {
  const std::vector<float> r = testing::random_vector(n, seed, 0.0f, float(V));
  std::vector<int32_t> ids(n);
  for (int64_t i = 0; i < n; ++i) ids[i] = std::min(int32_t(V - 1), int32_t(r[i]));
  return ids;
}

TEST(Embedding, ForwardMatchesReference) {
  for (Isa isa : testing::available_isas()) {
    ScopedIsaCap cap(isa);
    for (int64_t N : testing::kOddSizes)
      for (int64_t C : testing::kOddSizes) {
        const int64_t V = 11;
        SCOPED_TRACE(std::string(isa_name(isa)) + " N=" + std::to_string(N) + " C=" + std::to_string(C));
        const std::vector<int32_t> ids = random_ids(N, V, uint64_t(N * 1000 + C));
        const std::vector<float> table = testing::random_vector(V * C, uint64_t(C));
        std::vector<float> want(N * C);
        ref::embedding_forward<float>(ids.data(), table.data(), want.data(), N, V, C);
        Guarded<float> out(N * C);
        ASSERT_TRUE(embedding_forward(ids, table, out.span(), N, V, C).is_ok());
        EXPECT_EQ(out.vec(), want);
        EXPECT_GUARDS(out);
      }
  }
}

// dtable starts non-zero (the backward accumulates); few distinct ids make many repeats.
TEST(Embedding, BackwardMatchesReferenceAndSum) {
  for (Isa isa : testing::available_isas()) {
    ScopedIsaCap cap(isa);
    for (int64_t V : {int64_t(3), int64_t(200)})
      for (int64_t N : testing::kOddSizes)
        for (int64_t C : testing::kOddSizes) {
          SCOPED_TRACE(std::string(isa_name(isa)) + " V=" + std::to_string(V) + " N=" + std::to_string(N) +
                       " C=" + std::to_string(C));
          const std::vector<int32_t> ids = random_ids(N, V, uint64_t(N * 7 + C + V));
          const std::vector<float> dout = testing::random_vector(N * C, uint64_t(N + C));
          const std::vector<float> init = testing::random_vector(V * C, uint64_t(V + C));
          std::vector<float> want = init;
          ref::embedding_backward<float>(ids.data(), dout.data(), want.data(), N, V, C);
          std::vector<double> sum(init.begin(), init.end());
          for (int64_t n = 0; n < N; ++n)
            for (int64_t c = 0; c < C; ++c) sum[ids[n] * C + c] += double(dout[n * C + c]);

          Guarded<float> dtable(V * C);
          std::copy(init.begin(), init.end(), dtable.data());
          ASSERT_TRUE(embedding_backward(ids, dout, dtable.span(), N, V, C).is_ok());
          EXPECT_EQ(dtable.vec(), want);  // same addition order: bitwise
          EXPECT_TRUE(testing::close_nmse(dtable.cspan(), sum, testing::nmse_threshold(DType::f32)));
          EXPECT_GUARDS(dtable);
        }
  }
}

TEST(Embedding, BackwardSameForOneAndTwoThreads) {
  struct Case {
    int64_t N, V, C;
  };
  // Above the parallel threshold; the second splits only two column groups.
  for (const Case& k : {Case{300, 7, 257}, Case{3000, 5, 20}}) {
    const std::vector<int32_t> ids = random_ids(k.N, k.V, 41);
    const std::vector<float> dout = testing::random_vector(k.N * k.C, 42);
    std::vector<float> one(k.V * k.C, 0.0f), two(k.V * k.C, 0.0f), want(k.V * k.C, 0.0f);
    {
      ScopedOmpThreads t(1);
      ASSERT_TRUE(embedding_backward(ids, dout, one, k.N, k.V, k.C).is_ok());
    }
    {
      ScopedOmpThreads t(2);
      ASSERT_TRUE(embedding_backward(ids, dout, two, k.N, k.V, k.C).is_ok());
    }
    ref::embedding_backward<float>(ids.data(), dout.data(), want.data(), k.N, k.V, k.C);
    EXPECT_EQ(one, two);
    EXPECT_EQ(one, want);
  }
}

TEST(Embedding, BackwardMatchesFiniteDifferences) {
  const int64_t N = 5, V = 3, C = 4;
  const std::vector<int32_t> ids = {2, 0, 2, 2, 1};
  const std::vector<float> table = testing::random_vector(V * C, 51);
  const std::vector<float> w = testing::random_vector(N * C, 52);
  auto loss = [&](const std::vector<double>& t) {
    std::vector<double> out(N * C);
    ref::embedding_forward<double>(ids.data(), t.data(), out.data(), N, V, C);
    double l = 0;
    for (int64_t i = 0; i < N * C; ++i) l += double(w[i]) * out[i];
    return l;
  };
  const std::vector<double> num = testing::numeric_grad(loss, testing::to_f64(table));
  std::vector<float> dtable(V * C, 0.0f);
  ASSERT_TRUE(embedding_backward(ids, w, dtable, N, V, C).is_ok());
  EXPECT_TRUE(testing::close_nmse(dtable, num, testing::kGradNmse));
}

TEST(Embedding, OutOfRangeIdIsAnError) {
  const std::vector<float> table(5 * 3, 1.0f);
  std::vector<float> out(4 * 3, 7.0f);
  Status s = embedding_forward(std::vector<int32_t>{0, 4, 5, 1}, table, out, 4, 5, 3);
  EXPECT_EQ(s.code(), Code::kOutOfRange);
  EXPECT_EQ(s.message(), "embedding_forward: argument 'ids': expected every id in [0, V) = [0, 5), found ids[2] = 5");
  EXPECT_EQ(out, std::vector<float>(4 * 3, 7.0f));  // nothing written

  std::vector<float> dtable(5 * 3, 0.0f);
  s = embedding_backward(std::vector<int32_t>{3, 1, 0, -2}, out, dtable, 4, 5, 3);
  EXPECT_EQ(s.message(), "embedding_backward: argument 'ids': expected every id in [0, V) = [0, 5), found ids[3] = -2");
  EXPECT_EQ(dtable, std::vector<float>(5 * 3, 0.0f));
}

TEST(Embedding, ShortBuffersAreErrors) {
  const std::vector<int32_t> ids = {0, 1};
  std::vector<float> table(14), out(6), dtable(15);
  EXPECT_EQ(embedding_forward(ids, table, out, 2, 5, 3).message(),
            "embedding_forward: argument 'table': expected at least 15 elements, found 14");
  EXPECT_EQ(embedding_forward(ids, dtable, std::span<float>(out.data(), 5), 2, 5, 3).message(),
            "embedding_forward: argument 'out': expected at least 6 elements, found 5");
  EXPECT_EQ(embedding_backward(std::span<const int32_t>(ids.data(), 1), out, dtable, 2, 5, 3).message(),
            "embedding_backward: argument 'ids': expected at least 2 elements, found 1");
  EXPECT_EQ(embedding_backward(ids, out, table, 2, 5, 3).message(),
            "embedding_backward: argument 'dtable': expected at least 15 elements, found 14");
  EXPECT_EQ(embedding_forward(ids, table, out, 2, 5, -3).code(), Code::kInvalidArgument);
}

TEST(Embedding, EmptyExtentsAreFine) {
  const std::vector<int32_t> ids = {0, 1};
  EXPECT_TRUE(embedding_forward(ids, {}, {}, 2, 5, 0).is_ok());
  EXPECT_TRUE(embedding_backward(ids, {}, {}, 2, 5, 0).is_ok());
  EXPECT_TRUE(embedding_forward({}, {}, {}, 0, 0, 3).is_ok());
  EXPECT_TRUE(embedding_backward({}, {}, {}, 0, 0, 3).is_ok());
}

}  // namespace
}  // namespace aspen::kernels
