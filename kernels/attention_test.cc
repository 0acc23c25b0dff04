#include "kernels/attention.h"

#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <limits>
#include <string>
#include <vector>

#include "core/thread_team.h"
#include "kernels/cpu.h"
#include "kernels/testing.h"

namespace aspen::kernels {
namespace {

using testing::close_nmse;
using testing::Guarded;
using testing::kGradNmse;
using testing::nmse_threshold;
using testing::random_vector;
using testing::to_f64;
using Kind = AttentionMask::Kind;

// The fast path's exp2 has relative error < 1e-7 and its sums run in a
// different order than the reference's, which still leaves NMSE far below
// the f32 threshold (1e-9): no looser threshold is needed.
const double kNmse = nmse_threshold(DType::f32);
constexpr float kNegInf = -std::numeric_limits<float>::infinity();

struct Case {
  int64_t B, H, T, S, D, offset, window;
  int64_t Hk = 0;  // key/value heads; 0: H (grouped-query attention when fewer)
  int64_t hk() const { return Hk > 0 ? Hk : H; }
};

// A spread over kOddSizes (not the product), T != S with offsets (decoding),
// D = 64, 80 and 128, and blocks crossed (T, S > 64 and 128).
const std::vector<Case> kCases = {
    {1, 1, 1, 1, 1, 0, 1},       {2, 2, 3, 7, 3, 4, 2},      {2, 1, 7, 7, 17, 0, 3},
    {1, 2, 17, 3, 7, 0, 2},      {2, 1, 1, 129, 64, 128, 17}, {1, 1, 129, 129, 64, 0, 65},
    {2, 1, 17, 129, 7, 112, 40}, {1, 2, 129, 17, 3, 0, 5},    {2, 1, 7, 17, 129, 10, 7},
    {1, 1, 3, 3, 129, 0, 1},     {2, 2, 17, 17, 1, 0, 9},     {1, 1, 129, 200, 64, 71, 100},
    {2, 1, 200, 200, 64, 0, 130}, {1, 1, 200, 200, 17, 0, 64}, {2, 1, 3, 1, 7, 0, 1},
    {1, 2, 5, 3, 3, 9, 4},  // offset past S: every local row is empty
    {2, 3, 1, 1000, 64, 999, 300}, {1, 2, 4, 77, 33, 73, 20},  // decoding rows (NOTE [attention decode rows])
    // grouped-query and multi-query attention: the group's query heads share one key/value head
    {2, 4, 17, 129, 7, 112, 40, 2}, {1, 6, 129, 129, 64, 0, 65, 1}, {2, 6, 1, 200, 33, 199, 64, 3},
    {1, 4, 200, 200, 17, 0, 64, 2},
    // full tiles with D a multiple of 16 but not of 64, and D = 128 (NOTE [attention fused strips])
    {1, 2, 200, 200, 80, 0, 64}, {1, 1, 150, 150, 128, 0, 70, 1},
    // decoding rows over more than 1024 keys, cut into chunks (NOTE [attention split-KV decoding])
    {1, 2, 1, 2500, 64, 2499, 700}, {2, 4, 3, 3000, 32, 2997, 1500, 2},
    {2, 2, 2, 300, 128, 298, 100, 1}, {1, 3, 4, 70, 96, 66, 20},  // AVX-512 decode rows of D 128 and 96
};

struct Inputs {
  std::vector<float> q, k, v, dout;
  std::vector<uint8_t> valid;  // [B, S]; empty when unpadded
};

// q is drawn wider than k so that scaled scores spread over about [-3, 3].
Inputs make_inputs(const Case& c, bool padded, uint64_t seed) {
  Inputs in;
  const size_t nq = size_t(c.B * c.H * c.T * c.D), nk = size_t(c.B * c.hk() * c.S * c.D);
  in.q = random_vector(nq, seed, -3.0f, 3.0f);
  in.k = random_vector(nk, seed + 1);
  in.v = random_vector(nk, seed + 2);
  in.dout = random_vector(nq, seed + 3);
  if (padded) {
    // About a third of the keys padded; with B >= 2 the last batch row is all padding.
    std::vector<float> u = random_vector(size_t(c.B * c.S), seed + 4, 0.0f, 1.0f);
    in.valid.resize(u.size());
    for (size_t i = 0; i < u.size(); ++i) in.valid[i] = u[i] > 0.33f;
    if (c.B >= 2)
      for (int64_t j = 0; j < c.S; ++j) in.valid[size_t((c.B - 1) * c.S + j)] = 0;
  }
  return in;
}

AttentionMask make_mask(Kind kind, const Case& c, const Inputs& in) {
  AttentionMask m;
  m.kind = kind;
  m.window = c.window;
  m.kv_offset = kind == Kind::none ? 0 : c.offset;
  m.key_valid = in.valid;
  return m;
}

std::string describe(const Case& c, Kind kind, bool padded) {
  const char* names[] = {"none", "causal", "local"};
  return "B=" + std::to_string(c.B) + " H=" + std::to_string(c.H) + " Hk=" + std::to_string(c.hk()) + " T=" + std::to_string(c.T) +
         " S=" + std::to_string(c.S) + " D=" + std::to_string(c.D) + " mask=" + names[int(kind)] +
         " offset=" + std::to_string(c.offset) + " window=" + std::to_string(c.window) +
         (padded ? " padded" : "");
}

// lse: -inf exactly where the reference has -inf (rows with no allowed key),
// close by NMSE elsewhere.
::testing::AssertionResult lse_close(std::span<const float> got, std::span<const double> want) {
  std::vector<float> g;
  std::vector<double> w;
  for (size_t i = 0; i < want.size(); ++i) {
    if (std::isinf(want[i])) {
      if (got[i] != kNegInf) return ::testing::AssertionFailure() << "lse[" << i << "] = " << got[i] << ", want -inf";
    } else {
      g.push_back(got[i]);
      w.push_back(want[i]);
    }
  }
  return close_nmse(g, w, kNmse);
}

// A backward's guards, and its gradients against the reference's within `threshold` (NMSE) unless every row
// is masked; dbias when the problem has one.
void expect_gradients(const Guarded<float>& gq, const Guarded<float>& gk, const Guarded<float>& gv,
                      const Guarded<float>& gb, const std::vector<double>& dq, const std::vector<double>& dk,
                      const std::vector<double>& dv, const std::vector<double>& db, bool all_masked, double threshold) {
  EXPECT_GUARDS(gq);
  EXPECT_GUARDS(gk);
  EXPECT_GUARDS(gv);
  EXPECT_GUARDS(gb);
  if (all_masked) return;
  EXPECT_TRUE(close_nmse(gq.cspan(), std::span<const double>(dq), threshold)) << "dq";
  EXPECT_TRUE(close_nmse(gk.cspan(), std::span<const double>(dk), threshold)) << "dk";
  EXPECT_TRUE(close_nmse(gv.cspan(), std::span<const double>(dv), threshold)) << "dv";
  if (!db.empty()) {
    EXPECT_TRUE(close_nmse(gb.cspan(), std::span<const double>(db), threshold)) << "dbias";
  }
}

// The values of x rounded to bf16, and those values back in f32.
std::vector<bf16> to_bf16(const std::vector<float>& x) {
  std::vector<bf16> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = f32_to_bf16(x[i]);
  return y;
}
std::vector<float> widen(const std::vector<bf16>& x) {
  std::vector<float> y(x.size());
  for (size_t i = 0; i < x.size(); ++i) y[i] = bf16_to_f32(x[i]);
  return y;
}

// The bf16 forward (NOTE [attention amx] where the CPU has AMX, the widened f32 kernel below it) against the
// f64 reference on the same bf16 values: p rounded to bf16 for p v leaves NMSE near 1e-6 (bf16's threshold
// is 1e-4); lse comes from f32 scores and sums, so f32's threshold holds for it.
void expect_bf16_forward_matches(const Case& c, const Inputs& in, const AttentionMask& mask, bool all_masked = false) {
  const std::vector<bf16> q = to_bf16(in.q), k = to_bf16(in.k), v = to_bf16(in.v);
  const size_t nq = q.size(), nl = size_t(c.B * c.H * c.T);
  const float scale = 1.0f / std::sqrt(float(c.D));
  std::vector<double> want_out(nq), want_lse(nl);
  ref::attention_forward<double>(to_f64(widen(q)).data(), to_f64(widen(k)).data(), to_f64(widen(v)).data(),
                                 want_out.data(), want_lse.data(), c.B, c.H, c.hk(), c.T, c.S, c.D, double(scale),
                                 mask);
  std::vector<Isa> isas{std::min(Isa::avx2, cpu_features().best)};  // the widened f32 kernel
  if (cpu_features().best > isas[0]) isas.push_back(cpu_features().best);  // AMX where there is
  for (Isa isa : isas) {
    SCOPED_TRACE(std::string("bf16 ") + isa_name(isa));
    ScopedIsaCap cap(isa);
    Guarded<float> out(nq, NAN), lse(nl, NAN);
    ASSERT_TRUE(attention_forward(std::span<const bf16>(q), k, v, out.span(), lse.span(), c.B, c.H, c.hk(), c.T, c.S,
                                  c.D, scale, mask)
                    .is_ok());
    EXPECT_GUARDS(out);
    EXPECT_GUARDS(lse);
    if (all_masked) {
      for (float o : out.cspan()) ASSERT_EQ(o, 0.0f);
    } else {
      EXPECT_TRUE(close_nmse(out.cspan(), std::span<const double>(want_out), nmse_threshold(DType::bf16)));
    }
    EXPECT_TRUE(lse_close(lse.cspan(), want_lse));
    // The backward from this forward's out and lse: dout, p and ds rounded to bf16 (NOTE [attention amx
    // backward]), against the f64 reference backward on the same values.
    const size_t nk = k.size(), nb = mask.bias.empty() ? 0 : nl * size_t(c.S);
    std::vector<double> dq(nq), dk(nk), dv(nk), db(nb);
    std::vector<double> out64 = to_f64(std::vector<float>(out.cspan().begin(), out.cspan().end()));
    std::vector<double> lse64 = to_f64(std::vector<float>(lse.cspan().begin(), lse.cspan().end()));
    ref::attention_backward<double>(to_f64(widen(q)).data(), to_f64(widen(k)).data(), to_f64(widen(v)).data(),
                                    out64.data(), lse64.data(), to_f64(in.dout).data(), dq.data(), dk.data(), dv.data(),
                                    c.B, c.H, c.hk(), c.T, c.S, c.D, double(scale), mask, nb ? db.data() : nullptr);
    Guarded<float> gq(nq, NAN), gk(nk, NAN), gv(nk, NAN), gb(nb, NAN);
    ASSERT_TRUE(attention_backward(std::span<const bf16>(q), k, v, out.cspan(), lse.cspan(), in.dout, gq.span(),
                                   gk.span(), gv.span(), c.B, c.H, c.hk(), c.T, c.S, c.D, scale, mask, gb.span())
                    .is_ok());
    // p and ds rounded to bf16 (2^-9) enter sums that cancel (each row of ds sums to 0): a tiny problem
    // (D = 1, 17 keys) measured NMSE 1.7e-4 on dk, where a wrong layout or stride gives 0.5.
    expect_gradients(gq, gk, gv, gb, dq, dk, dv, db, all_masked, 10 * nmse_threshold(DType::bf16));
  }
}

// The f32 forward on every ISA against the f64 reference.
void expect_f32_forward_matches(const Case& c, const Inputs& in, const AttentionMask& mask) {
  const size_t nq = in.q.size(), nl = size_t(c.B * c.H * c.T);
  const float scale = 1.0f / std::sqrt(float(c.D));
  std::vector<double> want_out(nq), want_lse(nl);
  ref::attention_forward<double>(to_f64(in.q).data(), to_f64(in.k).data(), to_f64(in.v).data(), want_out.data(),
                                 want_lse.data(), c.B, c.H, c.hk(), c.T, c.S, c.D, double(scale), mask);
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
    Guarded<float> out(nq, NAN), lse(nl, NAN);
    ASSERT_TRUE(
        attention_forward(in.q, in.k, in.v, out.span(), lse.span(), c.B, c.H, c.hk(), c.T, c.S, c.D, scale, mask)
            .is_ok());
    EXPECT_GUARDS(out);
    EXPECT_GUARDS(lse);
    EXPECT_TRUE(close_nmse(out.cspan(), std::span<const double>(want_out), kNmse));
    EXPECT_TRUE(lse_close(lse.cspan(), want_lse));
  }
}

const Kind kKinds[] = {Kind::none, Kind::causal, Kind::local};

TEST(Attention, ForwardMatchesReference) {
  uint64_t seed = 100;
  for (const Case& c : kCases)
    for (Kind kind : kKinds)
      for (bool padded : {false, true}) {
        SCOPED_TRACE(describe(c, kind, padded));
        const Inputs in = make_inputs(c, padded, seed += 10);
        const AttentionMask mask = make_mask(kind, c, in);
        expect_f32_forward_matches(c, in, mask);
        expect_bf16_forward_matches(c, in, mask);
      }
}

TEST(Attention, BackwardMatchesReference) {
  uint64_t seed = 900;
  for (const Case& c : kCases)
    for (Kind kind : kKinds)
      for (bool padded : {false, true}) {
        SCOPED_TRACE(describe(c, kind, padded));
        const Inputs in = make_inputs(c, padded, seed += 10);
        const AttentionMask mask = make_mask(kind, c, in);
        const size_t nq = in.q.size(), nk = in.k.size(), nl = size_t(c.B * c.H * c.T);
        const float scale = 1.0f / std::sqrt(float(c.D));
        std::vector<float> out(nq), lse(nl);
        ref::attention_forward<float>(in.q.data(), in.k.data(), in.v.data(), out.data(), lse.data(), c.B, c.H, c.hk(), c.T,
                                      c.S, c.D, scale, mask);
        std::vector<double> dq(nq), dk(nk), dv(nk);
        ref::attention_backward<double>(to_f64(in.q).data(), to_f64(in.k).data(), to_f64(in.v).data(),
                                        to_f64(out).data(), to_f64(lse).data(), to_f64(in.dout).data(), dq.data(),
                                        dk.data(), dv.data(), c.B, c.H, c.hk(), c.T, c.S, c.D, double(scale), mask);
        for (Isa isa : testing::available_isas(Isa::avx512)) {
          SCOPED_TRACE(isa_name(isa));
          ScopedIsaCap cap(isa);
          Guarded<float> gq(nq, NAN), gk(nk, NAN), gv(nk, NAN);
          ASSERT_TRUE(attention_backward(in.q, in.k, in.v, out, lse, in.dout, gq.span(), gk.span(), gv.span(), c.B,
                                         c.H, c.hk(), c.T, c.S, c.D, scale, mask)
                          .is_ok());
          EXPECT_GUARDS(gq);
          EXPECT_GUARDS(gk);
          EXPECT_GUARDS(gv);
          EXPECT_TRUE(close_nmse(gq.cspan(), std::span<const double>(dq), kNmse)) << "dq";
          EXPECT_TRUE(close_nmse(gk.cspan(), std::span<const double>(dk), kNmse)) << "dk";
          EXPECT_TRUE(close_nmse(gv.cspan(), std::span<const double>(dv), kNmse)) << "dv";
        }
      }
}

// Segment ids [B, S] of documents with lengths drawn in [1, max_len] (the last cut at S), non-decreasing.
std::vector<int32_t> make_segments(int64_t B, int64_t S, int64_t max_len, uint64_t seed) {
  std::vector<float> u = random_vector(size_t(B * S), seed, 0.0f, 1.0f);
  std::vector<int32_t> seg(size_t(B * S));
  for (int64_t b = 0; b < B; ++b) {
    int32_t id = int32_t(7 * b);  // ids need not start at 0 or be dense
    int64_t left = 1 + int64_t(u[size_t(b * S)] * float(max_len - 1));
    for (int64_t j = 0; j < S; ++j) {
      if (left == 0) {
        id += 1 + (j % 3 == 0);
        left = 1 + int64_t(u[size_t(b * S + j)] * float(max_len - 1));
      }
      seg[size_t(b * S + j)] = id;
      --left;
    }
  }
  return seg;
}

// Forward and backward of every ISA against the f64 reference for one problem and mask (dbias too when the
// mask has a bias). `all_masked`: every row is masked (out 0, no gradient to compare).
void expect_matches_reference(const Case& c, const Inputs& in, const AttentionMask& mask, bool all_masked = false) {
  const size_t nq = in.q.size(), nk = in.k.size(), nl = size_t(c.B * c.H * c.T);
  const size_t nb = mask.bias.empty() ? 0 : nl * size_t(c.S);
  const float scale = 1.0f / std::sqrt(float(c.D));
  std::vector<double> want_out(nq), want_lse(nl), dq(nq), dk(nk), dv(nk), db(nb);
  ref::attention_forward<double>(to_f64(in.q).data(), to_f64(in.k).data(), to_f64(in.v).data(), want_out.data(),
                                 want_lse.data(), c.B, c.H, c.hk(), c.T, c.S, c.D, double(scale), mask);
  std::vector<float> out32(nq), lse32(nl);
  ref::attention_forward<float>(in.q.data(), in.k.data(), in.v.data(), out32.data(), lse32.data(), c.B, c.H, c.hk(),
                                c.T, c.S, c.D, scale, mask);
  ref::attention_backward<double>(to_f64(in.q).data(), to_f64(in.k).data(), to_f64(in.v).data(), to_f64(out32).data(),
                                  to_f64(lse32).data(), to_f64(in.dout).data(), dq.data(), dk.data(), dv.data(), c.B,
                                  c.H, c.hk(), c.T, c.S, c.D, double(scale), mask, nb ? db.data() : nullptr);
  expect_bf16_forward_matches(c, in, mask, all_masked);
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
    Guarded<float> out(nq, NAN), lse(nl, NAN), gq(nq, NAN), gk(nk, NAN), gv(nk, NAN), gb(nb, NAN);
    ASSERT_TRUE(attention_forward(in.q, in.k, in.v, out.span(), lse.span(), c.B, c.H, c.hk(), c.T, c.S, c.D, scale,
                                  mask)
                    .is_ok());
    EXPECT_GUARDS(out);
    if (all_masked) {
      for (float o : out.cspan()) ASSERT_EQ(o, 0.0f);
    } else {
      EXPECT_TRUE(close_nmse(out.cspan(), std::span<const double>(want_out), kNmse));
    }
    EXPECT_TRUE(lse_close(lse.cspan(), want_lse));
    ASSERT_TRUE(attention_backward(in.q, in.k, in.v, out32, lse32, in.dout, gq.span(), gk.span(), gv.span(), c.B, c.H,
                                   c.hk(), c.T, c.S, c.D, scale, mask, gb.span())
                    .is_ok());
    expect_gradients(gq, gk, gv, gb, dq, dk, dv, db, all_masked, kNmse);
  }
}

// xformers' structured masks: block-diagonal (packed documents) with no mask,
// causal and local windows; local windows reaching right; bottom-right
// alignment (kv_offset = S - T); with padding and grouped-query heads; forward
// and backward against the f64 reference, every ISA.
TEST(Attention, StructuredMasksMatchReference) {
  struct Structured {
    Case c;
    Kind kind;
    int64_t window_right, max_doc;  // max_doc 0: no segments
    bool padded;
  };
  const Structured cases[] = {
      {{2, 2, 130, 130, 17, 0, 40}, Kind::causal, 0, 50, false},  // block-diagonal causal, docs cross blocks
      {{1, 4, 200, 200, 64, 0, 30, 2}, Kind::local, 0, 90, true},  // block-diagonal local, GQA, padding
      {{2, 1, 77, 77, 9, 0, 1}, Kind::none, 0, 20, false},         // block-diagonal without causality
      {{1, 2, 150, 150, 33, 0, 20}, Kind::local, 13, 0, false},    // local window reaching 13 keys right
      {{2, 2, 70, 70, 8, 0, 9}, Kind::local, 5, 30, true},         // left+right window within documents
      {{1, 3, 40, 170, 17, 130, 0, 1}, Kind::causal, 0, 0, false}, // bottom-right: 40 queries after 130 keys
      {{2, 2, 3, 100, 16, 97, 0}, Kind::causal, 0, 25, false},     // decode rows with segments
      {{1, 1, 1, 1, 4, 0, 1}, Kind::local, 2, 1, false},           // one token
  };
  uint64_t seed = 7000;
  for (const Structured& x : cases) {
    const Case& c = x.c;
    SCOPED_TRACE(describe(c, x.kind, x.padded) + " window_right=" + std::to_string(x.window_right) +
                 " max_doc=" + std::to_string(x.max_doc));
    const Inputs in = make_inputs(c, x.padded, seed += 10);
    AttentionMask mask = make_mask(x.kind, c, in);
    mask.kv_offset = c.offset;
    mask.window_right = x.kind == Kind::local ? x.window_right : 0;
    const std::vector<int32_t> seg = x.max_doc ? make_segments(c.B, c.S, x.max_doc, seed + 5) : std::vector<int32_t>{};
    mask.segments = seg;
    expect_matches_reference(c, in, mask);
  }
}

// A random block layout [heads, rows, cols] with about `density` of its blocks on.
std::vector<uint8_t> random_layout(int64_t heads, int64_t rows, int64_t cols, float density, uint64_t seed) {
  const std::vector<float> u = random_vector(size_t(heads * rows * cols), seed, 0.0f, 1.0f);
  std::vector<uint8_t> l(u.size());
  for (size_t i = 0; i < u.size(); ++i) l[i] = u[i] < density;
  return l;
}

// Block-sparse layouts (NOTE [attention block layouts]): blocks smaller than,
// equal to, larger than and not dividing the kernel's 64-key tiles; one layout
// for every head or one per head; with causal, local, padding, segments and
// grouped-query heads; forward and backward against the reference.
TEST(Attention, BlockLayoutsMatchReference) {
  struct Sparse {
    Case c;
    Kind kind;
    int64_t block, layout_heads;
    float density;
    bool padded;
    int64_t max_doc = 0;
  };
  const Sparse cases[] = {
      {{1, 2, 256, 256, 32, 0, 0}, Kind::causal, 16, 2, 0.3f, false},
      {{2, 2, 200, 200, 17, 0, 0}, Kind::none, 32, 1, 0.5f, true},
      {{1, 4, 256, 256, 64, 0, 0, 2}, Kind::causal, 64, 4, 0.4f, false},
      {{1, 2, 300, 300, 16, 0, 0}, Kind::causal, 128, 2, 0.6f, false},
      {{1, 3, 190, 190, 24, 0, 50}, Kind::local, 48, 3, 0.5f, true},
      {{2, 2, 130, 130, 8, 0, 0}, Kind::causal, 16, 1, 0.5f, false, 40},
      {{1, 2, 3, 160, 32, 150, 0}, Kind::causal, 32, 2, 0.5f, false},  // decode rows take the tiles
      {{1, 1, 128, 128, 16, 0, 0}, Kind::none, 64, 1, 0.0f, false},   // an empty layout: every row out 0
  };
  uint64_t seed = 9100;
  for (const Sparse& x : cases) {
    const Case& c = x.c;
    SCOPED_TRACE(describe(c, x.kind, x.padded) + " block=" + std::to_string(x.block) +
                 " layout_heads=" + std::to_string(x.layout_heads) + " density=" + std::to_string(x.density));
    const Inputs in = make_inputs(c, x.padded, seed += 10);
    AttentionMask mask = make_mask(x.kind, c, in);
    const int64_t rows = (c.offset + c.T + x.block - 1) / x.block, cols = (c.S + x.block - 1) / x.block;
    const std::vector<uint8_t> layout = random_layout(x.layout_heads, rows, cols, x.density, seed + 3);
    mask.layout = layout;
    mask.layout_block = x.block;
    mask.layout_heads = x.layout_heads;
    const std::vector<int32_t> seg = x.max_doc ? make_segments(c.B, c.S, x.max_doc, seed + 5) : std::vector<int32_t>{};
    mask.segments = seg;
    expect_matches_reference(c, in, mask, x.density == 0.0f);
  }
}

// A layout looked up by each row's own positions (a generator's left-padded rows: slot j of row b is
// position j - pad[b]): prefill (causal, T = S) and decode rows (one query over the cache) against the
// reference, f32 on every ISA and bf16, forward only (the backward refuses positions by name). With every
// pad 0 the positions are the slots and the result is the plain layout's.
TEST(Attention, BlockLayoutsByRowPositionsMatchReference) {
  struct Positioned {
    Case c;
    Kind kind;
    int64_t block, layout_heads, layout_blocks;
    std::vector<int64_t> pads;
  };
  const std::vector<Positioned> cases = {
      {{2, 2, 96, 96, 32, 0, 0}, Kind::causal, 16, 2, 8, {0, 37}},
      {{3, 4, 130, 130, 16, 0, 0, 2}, Kind::causal, 32, 1, 5, {5, 0, 64}},
      {{2, 2, 1, 160, 64, 0, 0}, Kind::none, 32, 2, 6, {0, 21}},  // decode: one query at slot 159 - ...
      {{2, 3, 2, 200, 24, 0, 0, 1}, Kind::none, 64, 3, 4, {70, 3}},
  };
  uint64_t seed = 9500;
  for (const Positioned& x : cases) {
    const Case& c = x.c;
    SCOPED_TRACE(describe(c, x.kind, true) + " block=" + std::to_string(x.block));
    Inputs in = make_inputs(c, false, seed += 10);
    // Keys before a row's pad are padding; decode queries sit at the newest slots, S - T ...
    in.valid.assign(size_t(c.B * c.S), 0);
    std::vector<int32_t> qpos(size_t(c.B * c.T)), kpos(size_t(c.B * c.S));
    for (int64_t b = 0; b < c.B; ++b) {
      const int64_t pad = x.pads[size_t(b)];
      for (int64_t j = 0; j < c.S; ++j) {
        kpos[size_t(b * c.S + j)] = int32_t(j - pad);
        in.valid[size_t(b * c.S + j)] = j >= pad;
      }
      const int64_t first_slot = x.kind == Kind::causal ? 0 : c.S - c.T;
      for (int64_t i = 0; i < c.T; ++i) qpos[size_t(b * c.T + i)] = int32_t(first_slot + i - pad);
    }
    AttentionMask mask = make_mask(x.kind, c, in);
    const std::vector<uint8_t> layout =
        random_layout(x.layout_heads, x.layout_blocks, x.layout_blocks, 0.5f, seed + 3);
    mask.layout = layout;
    mask.layout_block = x.block;
    mask.layout_heads = x.layout_heads;
    mask.layout_blocks = x.layout_blocks;
    mask.layout_query_positions = qpos;
    mask.layout_key_positions = kpos;
    expect_f32_forward_matches(c, in, mask);
    const size_t nq = in.q.size(), nl = size_t(c.B * c.H * c.T);
    const float scale = 1.0f / std::sqrt(float(c.D));
    std::vector<double> want_out(nq), want_lse(nl);
    const std::vector<bf16> q = to_bf16(in.q), k = to_bf16(in.k), v = to_bf16(in.v);
    ref::attention_forward<double>(to_f64(widen(q)).data(), to_f64(widen(k)).data(), to_f64(widen(v)).data(),
                                   want_out.data(), want_lse.data(), c.B, c.H, c.hk(), c.T, c.S, c.D, double(scale),
                                   mask);
    std::vector<float> out(nq), lse(nl);
    ASSERT_TRUE(attention_forward(std::span<const bf16>(q), k, v, std::span<float>(out), std::span<float>(lse), c.B,
                                  c.H, c.hk(), c.T, c.S, c.D, scale, mask)
                    .is_ok());
    EXPECT_TRUE(close_nmse(std::span<const float>(out), std::span<const double>(want_out), nmse_threshold(DType::bf16)));
    std::vector<float> dq(nq), dk(in.k.size()), dv(in.k.size());
    const Status back = attention_backward(in.q, in.k, in.v, out, lse, in.dout, dq, dk, dv, c.B, c.H, c.hk(), c.T,
                                           c.S, c.D, scale, mask);
    EXPECT_EQ(back.code(), Code::kUnimplemented) << back.to_string();
    // Every pad 0 and prefill: the positions are the slots, and the plain layout (cut to the slots' blocks)
    // gives the same bits.
    if (x.kind != Kind::causal) continue;
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t j = 0; j < c.S; ++j) {
        kpos[size_t(b * c.S + j)] = int32_t(j);
        in.valid[size_t(b * c.S + j)] = 1;
      }
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t i = 0; i < c.T; ++i) qpos[size_t(b * c.T + i)] = int32_t(i);
    const int64_t nb = (c.S + x.block - 1) / x.block;
    std::vector<uint8_t> cut;
    for (int64_t h = 0; h < x.layout_heads; ++h)
      for (int64_t r = 0; r < nb; ++r)
        for (int64_t col = 0; col < nb; ++col)
          cut.push_back(layout[size_t((h * x.layout_blocks + r) * x.layout_blocks + col)]);
    AttentionMask plain = make_mask(x.kind, c, in);
    plain.layout = cut;
    plain.layout_block = x.block;
    plain.layout_heads = x.layout_heads;
    mask.key_valid = in.valid;
    std::vector<float> a(nq), a_lse(nl), p(nq), p_lse(nl);
    ASSERT_TRUE(attention_forward(in.q, in.k, in.v, std::span<float>(a), std::span<float>(a_lse), c.B, c.H, c.hk(),
                                  c.T, c.S, c.D, scale, mask)
                    .is_ok());
    ASSERT_TRUE(attention_forward(in.q, in.k, in.v, std::span<float>(p), std::span<float>(p_lse), c.B, c.H, c.hk(),
                                  c.T, c.S, c.D, scale, plain)
                    .is_ok());
    EXPECT_EQ(a, p);
  }
  AttentionMask bad;
  const std::vector<uint8_t> layout(4, 1);
  const std::vector<int32_t> qpos = {0, 9}, kpos = {0, 1, 2, 3, 0, 1, 2, 3};
  bad.layout = layout;
  bad.layout_block = 4;
  bad.layout_blocks = 2;
  bad.layout_query_positions = qpos;
  bad.layout_key_positions = kpos;
  std::vector<float> q(2 * 2), kv(2 * 4 * 2), out(2 * 2), lse(2);
  const Status s = attention_forward(q, kv, kv, out, lse, 2, 1, 1, 1, 4, 2, 1.0f, bad);
  EXPECT_EQ(s.message(), "attention_forward: mask.layout_query_positions element 1: expected a position below "
                         "layout_blocks x layout_block = 8, found 9");
}

// MPT's gen_slopes: 8 heads 2^-1 .. 2^-8; 12 heads from 16, odd-indexed first.
TEST(Attention, AlibiSlopesAreMpts) {
  const std::vector<float> eight = alibi_slopes(8);
  ASSERT_EQ(eight.size(), 8u);
  for (int h = 0; h < 8; ++h) EXPECT_EQ(eight[size_t(h)], std::exp2(-float(h + 1)));
  const std::vector<float> twelve = alibi_slopes(12);
  ASSERT_EQ(twelve.size(), 12u);
  for (int h = 0; h < 8; ++h) EXPECT_FLOAT_EQ(twelve[size_t(h)], std::exp2(-float(h + 1)));
  for (int h = 8; h < 12; ++h) EXPECT_FLOAT_EQ(twelve[size_t(h)], std::exp2(-0.5f - float(h - 8)));
}

// ALiBi slopes (BLOOM's 2^(-8h/H)): with causal, local, no mask and padding,
// grouped-query heads, decode rows; forward and backward against the reference.
TEST(Attention, AlibiMatchesReference) {
  struct Biased {
    Case c;
    Kind kind;
    bool padded;
  };
  const Biased cases[] = {{{1, 4, 130, 130, 32, 0, 0}, Kind::causal, false},
                          {{2, 2, 77, 90, 16, 13, 20}, Kind::local, true},
                          {{1, 6, 70, 70, 8, 0, 0, 2}, Kind::none, true},
                          {{2, 3, 2, 100, 64, 98, 0, 1}, Kind::causal, false}};
  uint64_t seed = 9900;
  for (const Biased& x : cases) {
    const Case& c = x.c;
    SCOPED_TRACE(describe(c, x.kind, x.padded) + " alibi");
    const Inputs in = make_inputs(c, x.padded, seed += 10);
    AttentionMask mask = make_mask(x.kind, c, in);
    std::vector<float> slopes(size_t(c.H));
    for (int64_t h = 0; h < c.H; ++h) slopes[size_t(h)] = std::exp2(-8.0f * float(h + 1) / float(c.H));
    mask.alibi_slopes = slopes;
    expect_matches_reference(c, in, mask);
  }
}

// A tensor bias (broadcast over batch and/or heads, with -inf entries) and its
// gradient, against the f64 reference; dbias by central differences too.
TEST(Attention, TensorBiasMatchesReference) {
  struct Biased {
    Case c;
    Kind kind;
    bool padded;
    int64_t bias_batch, bias_heads;
  };
  const Biased cases[] = {{{1, 4, 130, 130, 32, 0, 0}, Kind::causal, false, 1, 4},
                          {{2, 2, 77, 90, 16, 13, 20}, Kind::local, true, 2, 1},
                          {{2, 6, 70, 70, 8, 0, 0, 2}, Kind::none, true, 1, 1},
                          {{2, 3, 2, 100, 64, 98, 0, 1}, Kind::causal, false, 2, 3},
                          {{1, 2, 150, 150, 64, 0, 0}, Kind::none, false, 1, 2}};  // full tiles (fused path off)
  uint64_t seed = 12300;
  for (const Biased& x : cases) {
    const Case& c = x.c;
    SCOPED_TRACE(describe(c, x.kind, x.padded) + " bias [" + std::to_string(x.bias_batch) + ", " +
                 std::to_string(x.bias_heads) + ", T, S]");
    const Inputs in = make_inputs(c, x.padded, seed += 10);
    AttentionMask mask = make_mask(x.kind, c, in);
    std::vector<float> bias = random_vector(size_t(x.bias_batch * x.bias_heads * c.T * c.S), seed + 7, -2.0f, 2.0f);
    for (size_t i = 0; i < bias.size(); i += 7) bias[i] = kNegInf;  // masked elements
    mask.bias = bias;
    mask.bias_batch = x.bias_batch;
    mask.bias_heads = x.bias_heads;
    expect_matches_reference(c, in, mask);
  }

  // dbias by central differences of L = sum(dout * out) (bias broadcast over heads: summed).
  const Case c{1, 2, 5, 7, 3, 2, 0, 1};
  const Inputs in = make_inputs(c, false, 777);
  const size_t nq = in.q.size(), nl = size_t(c.B * c.H * c.T);
  std::vector<double> bias = to_f64(random_vector(size_t(c.T * c.S), 778, -1.0f, 1.0f));
  AttentionMask mask;
  mask.kind = Kind::causal;
  mask.kv_offset = 2;
  mask.bias_heads = 1;
  const double scale = 0.7;
  auto loss = [&](const std::vector<double>& b) {
    std::vector<float> bf(b.begin(), b.end());
    AttentionMask m = mask;
    m.bias = bf;
    std::vector<double> out(nq), lse(nl);
    ref::attention_forward<double>(to_f64(in.q).data(), to_f64(in.k).data(), to_f64(in.v).data(), out.data(),
                                   lse.data(), c.B, c.H, c.hk(), c.T, c.S, c.D, scale, m);
    double l = 0;
    for (size_t i = 0; i < nq; ++i) l += double(in.dout[i]) * out[i];
    return l;
  };
  // The bias holds f32 values (the loss rounds it): steps of 1e-3 keep that rounding small.
  const std::vector<double> numeric = testing::numeric_grad(loss, bias, 1e-3);
  std::vector<float> bf(bias.begin(), bias.end()), out(nq), lse(nl), gq(nq), gk(in.k.size()), gv(in.k.size()),
      gb(nl * size_t(c.S));
  mask.bias = bf;
  ASSERT_TRUE(attention_forward(in.q, in.k, in.v, out, lse, c.B, c.H, c.hk(), c.T, c.S, c.D, float(scale), mask).is_ok());
  ASSERT_TRUE(attention_backward(in.q, in.k, in.v, out, lse, in.dout, gq, gk, gv, c.B, c.H, c.hk(), c.T, c.S, c.D,
                                 float(scale), mask, gb)
                  .is_ok());
  std::vector<float> summed(size_t(c.T * c.S), 0.0f);  // over the heads the bias broadcasts to
  for (size_t x = 0; x < gb.size(); ++x) summed[x % summed.size()] += gb[x];
  EXPECT_TRUE(close_nmse(summed, std::span<const double>(numeric), kGradNmse)) << "dbias";
}

// Both backwards against central differences of L = sum(dout * out), with out
// from the f64 reference forward, over q, k and v together.
TEST(Attention, BackwardMatchesFiniteDifferences) {
  const Case c{1, 2, 5, 7, 3, 2, 3, /*Hk=*/1};  // multi-query: dk, dv sum over both heads
  const std::vector<uint8_t> pad = {1, 0, 1, 1, 0, 1, 1};
  const std::vector<uint8_t> pad_first = {0, 1, 1, 1, 1, 1, 1};  // with causal, offset 0: row 0 has no key
  const std::vector<int32_t> docs = {4, 4, 4, 9, 9, 11, 11};  // three documents
  struct Variant {
    Kind kind;
    int64_t offset, window;
    const std::vector<uint8_t>* valid;
    int64_t window_right = 0;
    const std::vector<int32_t>* segments = nullptr;
    bool alibi = false;
    float dropout = 0.0f;
  };
  const std::vector<float> slopes = {0.5f, 0.125f};
  const Variant variants[] = {{Kind::causal, 2, 0, nullptr},
                              {Kind::local, 2, 3, nullptr},
                              {Kind::none, 0, 0, &pad},
                              {Kind::causal, 0, 0, &pad_first},
                              {Kind::local, 1, 2, nullptr, 2, &docs},
                              {Kind::causal, 2, 0, &pad, 0, &docs},
                              {Kind::causal, 2, 0, &pad, 0, nullptr, true},
                              {Kind::causal, 2, 0, nullptr, 0, nullptr, false, 0.3f},  // dropout, fixed seed
                              {Kind::local, 1, 2, &pad, 0, &docs, false, 0.5f}};
  uint64_t seed = 5000;
  for (const Variant& var : variants) {
    AttentionMask mask;
    mask.kind = var.kind;
    mask.kv_offset = var.offset;
    mask.window = var.window;
    if (var.valid) mask.key_valid = *var.valid;
    mask.window_right = var.window_right;
    if (var.segments) mask.segments = *var.segments;
    if (var.alibi) mask.alibi_slopes = slopes;
    mask.dropout = var.dropout;
    mask.dropout_seed = 99;
    mask.dropout_stream = 3;
    SCOPED_TRACE("dropout " + std::to_string(var.dropout));
    SCOPED_TRACE(describe(Case{c.B, c.H, c.hk(), c.T, c.S, c.D, var.offset, var.window}, var.kind, var.valid != nullptr));
    const Inputs in = make_inputs(c, false, seed += 10);
    const size_t nq = in.q.size(), nk = in.k.size(), nl = size_t(c.B * c.H * c.T);
    const float scale = 0.7f;
    std::vector<double> x = to_f64(in.q), dout = to_f64(in.dout);
    for (float f : in.k) x.push_back(f);
    for (float f : in.v) x.push_back(f);
    auto loss = [&](const std::vector<double>& p) {
      std::vector<double> out(nq), lse(nl);
      ref::attention_forward<double>(p.data(), p.data() + nq, p.data() + nq + nk, out.data(), lse.data(), c.B, c.H, c.hk(),
                                     c.T, c.S, c.D, double(scale), mask);
      double l = 0;
      for (size_t i = 0; i < nq; ++i) l += dout[i] * out[i];
      return l;
    };
    const std::vector<double> numeric = testing::numeric_grad(loss, x);

    std::vector<double> rq(nq), rk(nk), rv(nk), rout(nq), rlse(nl);
    ref::attention_forward<double>(x.data(), x.data() + nq, x.data() + nq + nk, rout.data(), rlse.data(), c.B, c.H, c.hk(),
                                   c.T, c.S, c.D, double(scale), mask);
    ref::attention_backward<double>(x.data(), x.data() + nq, x.data() + nq + nk, rout.data(), rlse.data(),
                                    dout.data(), rq.data(), rk.data(), rv.data(), c.B, c.H, c.hk(), c.T, c.S, c.D,
                                    double(scale), mask);
    std::vector<float> ref_grad;
    for (const auto* g : {&rq, &rk, &rv})
      for (double d : *g) ref_grad.push_back(float(d));
    EXPECT_TRUE(close_nmse(ref_grad, std::span<const double>(numeric), kGradNmse)) << "reference";

    std::vector<float> out(nq), lse(nl), gq(nq), gk(nk), gv(nk);
    ASSERT_TRUE(attention_forward(in.q, in.k, in.v, out, lse, c.B, c.H, c.hk(), c.T, c.S, c.D, scale, mask).is_ok());
    ASSERT_TRUE(attention_backward(in.q, in.k, in.v, out, lse, in.dout, gq, gk, gv, c.B, c.H, c.hk(), c.T, c.S, c.D, scale,
                                   mask)
                    .is_ok());
    std::vector<float> fast_grad = gq;
    fast_grad.insert(fast_grad.end(), gk.begin(), gk.end());
    fast_grad.insert(fast_grad.end(), gv.begin(), gv.end());
    EXPECT_TRUE(close_nmse(fast_grad, std::span<const double>(numeric), kGradNmse)) << "fast";
  }
}

// The mask as documented: each output row is plain attention over exactly the
// keys the description allows, gathered by hand.
TEST(Attention, MaskSemantics) {
  const Case c{2, 1, 6, 12, 5, 6, 3};
  const Inputs in = make_inputs(c, true, 77);  // batch 1 fully padded
  const std::vector<int32_t> docs = {0, 0, 0, 1, 1, 1, 1, 1, 2, 2, 2, 2, 5, 5, 5, 5, 5, 5, 6, 6, 6, 6, 6, 6};
  for (Kind kind : kKinds)
  for (int64_t right : {0, 2})
  for (bool with_docs : {false, true}) {
    if (right && kind != Kind::local) continue;
    SCOPED_TRACE(describe(c, kind, true) + " window_right=" + std::to_string(right) + (with_docs ? " docs" : ""));
    AttentionMask mask = make_mask(kind, c, in);
    mask.window_right = right;
    if (with_docs) mask.segments = docs;
    const float scale = 0.5f;
    std::vector<float> out(in.q.size()), lse(size_t(c.B * c.T));
    ASSERT_TRUE(attention_forward(in.q, in.k, in.v, out, lse, c.B, c.H, c.hk(), c.T, c.S, c.D, scale, mask).is_ok());
    for (int64_t b = 0; b < c.B; ++b)
      for (int64_t i = 0; i < c.T; ++i) {
        const int64_t pos = mask.kv_offset + i;
        std::vector<float> ks, vs;
        for (int64_t j = 0; j < c.S; ++j) {
          bool ok = in.valid[size_t(b * c.S + j)] != 0;
          if (kind == Kind::causal) ok = ok && j <= pos;
          if (kind == Kind::local) ok = ok && j <= pos + right && j > pos - c.window;
          if (with_docs) ok = ok && docs[size_t(b * c.S + j)] == docs[size_t(b * c.S + pos)];
          if (!ok) continue;
          ks.insert(ks.end(), in.k.begin() + (b * c.S + j) * c.D, in.k.begin() + (b * c.S + j + 1) * c.D);
          vs.insert(vs.end(), in.v.begin() + (b * c.S + j) * c.D, in.v.begin() + (b * c.S + j + 1) * c.D);
        }
        const int64_t n = int64_t(ks.size()) / c.D;
        const std::span<const float> got(out.data() + (b * c.T + i) * c.D, size_t(c.D));
        if (n == 0) {
          for (float g : got) EXPECT_EQ(g, 0.0f);
          EXPECT_EQ(lse[size_t(b * c.T + i)], kNegInf);
          continue;
        }
        std::vector<double> want(size_t(c.D)), want_lse(1);
        ref::attention_forward<double>(to_f64(std::span<const float>(in.q.data() + (b * c.T + i) * c.D, size_t(c.D))).data(),
                                       to_f64(ks).data(), to_f64(vs).data(), want.data(), want_lse.data(), 1, 1, 1, 1, n,
                                       c.D, double(scale), AttentionMask{});
        EXPECT_TRUE(close_nmse(got, std::span<const double>(want), kNmse)) << "b=" << b << " i=" << i;
      }
  }
}

// Also across the backward's two schedules (NOTE [attention backward per
// head]): 3 kv heads take the per-head pass on 1 thread, the two passes on 2.
TEST(Attention, BitwiseIdenticalForOneAndTwoThreads) {
  for (const Case& c : {Case{2, 4, 150, 200, 64, 50, 0, /*Hk=*/2}, Case{1, 6, 150, 200, 64, 50, 0, /*Hk=*/3},
                        Case{1, 1, 2, 3000, 64, 2998, 0}}) {  // split-KV decoding: one row, several chunks
  for (const float dropout : {0.0f, 0.2f}) {
  SCOPED_TRACE(describe(c, Kind::causal, true) + " dropout " + std::to_string(dropout));
  const Inputs in = make_inputs(c, true, 31);
  AttentionMask mask = make_mask(Kind::causal, c, in);
  mask.dropout = dropout;
  mask.dropout_seed = 8;
  const size_t nq = in.q.size(), nk = in.k.size(), nl = size_t(c.B * c.H * c.T);
  for (Isa isa : {Isa::scalar, cpu_features().best}) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
    std::vector<float> results[2];
    for (int threads : {1, 2}) {
      ScopedOmpThreads team(threads);
      std::vector<float> out(nq), lse(nl), dq(nq), dk(nk), dv(nk);
      ASSERT_TRUE(attention_forward(in.q, in.k, in.v, out, lse, c.B, c.H, c.hk(), c.T, c.S, c.D, 0.125f, mask).is_ok());
      ASSERT_TRUE(attention_backward(in.q, in.k, in.v, out, lse, in.dout, dq, dk, dv, c.B, c.H, c.hk(), c.T, c.S, c.D,
                                     0.125f, mask)
                      .is_ok());
      // the bf16 kernels (NOTE [attention amx], NOTE [attention amx backward]: one or two passes by threads)
      const std::vector<bf16> q16 = to_bf16(in.q), k16 = to_bf16(in.k), v16 = to_bf16(in.v);
      std::vector<float> out16(nq), lse16(nl), dq16(nq), dk16(nk), dv16(nk);
      ASSERT_TRUE(attention_forward(std::span<const bf16>(q16), k16, v16, out16, lse16, c.B, c.H, c.hk(), c.T, c.S,
                                    c.D, 0.125f, mask)
                      .is_ok());
      ASSERT_TRUE(attention_backward(std::span<const bf16>(q16), k16, v16, out16, lse16, in.dout, dq16, dk16, dv16,
                                     c.B, c.H, c.hk(), c.T, c.S, c.D, 0.125f, mask)
                      .is_ok());
      std::vector<float>& all = results[threads - 1];
      for (const auto* part : {&out, &lse, &dq, &dk, &dv, &out16, &lse16, &dq16, &dk16, &dv16})
        all.insert(all.end(), part->begin(), part->end());
    }
    ASSERT_EQ(results[0].size(), results[1].size());
    EXPECT_EQ(std::memcmp(results[0].data(), results[1].data(), results[0].size() * sizeof(float)), 0);
  }
  }
  }
}

// Dropout's elements: each multiplier 0 or 1 / (1 - p), kept with probability 1 - p (within 5 standard
// deviations over 2^17 elements), the same for the same (seed, stream), another pattern for another seed or
// stream; 1 without dropout.
TEST(Attention, DropoutKeepsOneMinusPOfTheElements) {
  const int64_t H = 4, T = 64, S = 128;  // 2 x 4 x 64 x 128 = 2^16 elements per pattern
  for (const float p : {0.1f, 0.5f, 0.9f}) {
    SCOPED_TRACE("p = " + std::to_string(p));
    AttentionMask m;
    m.dropout = p;
    m.dropout_seed = 1234;
    m.dropout_stream = 7;
    AttentionMask other_seed = m, other_stream = m;
    other_seed.dropout_seed = 1235;
    other_stream.dropout_stream = 8;
    int64_t kept = 0, same_seed = 0, same_stream = 0, n = 0;
    for (int64_t b = 0; b < 2; ++b)
      for (int64_t h = 0; h < H; ++h)
        for (int64_t i = 0; i < T; ++i)
          for (int64_t j = 0; j < S; ++j, ++n) {
            const float z = attention_dropout_multiplier(m, H, T, S, b, h, i, j);
            ASSERT_TRUE(z == 0.0f || z == 1.0f / (1.0f - p)) << z;
            ASSERT_EQ(z, attention_dropout_multiplier(m, H, T, S, b, h, i, j));
            kept += z != 0.0f;
            same_seed += (z != 0.0f) == (attention_dropout_multiplier(other_seed, H, T, S, b, h, i, j) != 0.0f);
            same_stream += (z != 0.0f) == (attention_dropout_multiplier(other_stream, H, T, S, b, h, i, j) != 0.0f);
          }
    const double want = double(n) * (1.0 - p), sd = std::sqrt(double(n) * p * (1.0 - p));
    EXPECT_NEAR(double(kept), want, 5 * sd);
    // Independent patterns agree on p^2 + (1 - p)^2 of the elements.
    const double agree = double(n) * (p * p + (1 - p) * (1 - p)), sd2 = std::sqrt(agree * (1 - agree / double(n)));
    EXPECT_NEAR(double(same_seed), agree, 5 * sd2);
    EXPECT_NEAR(double(same_stream), agree, 5 * sd2);
  }
  EXPECT_EQ(attention_dropout_multiplier(AttentionMask{}, 1, 1, 1, 0, 0, 0, 0), 1.0f);
}

// A tensor shard's call (its heads dropout_head_offset .. + H of dropout_heads) drops what the whole model's
// call drops for those heads: the shard's out, lse and gradients are the whole call's heads, bit for bit
// (f32 on every ISA, and bf16); an offset past the heads is named.
TEST(Attention, DropoutOfAShardsHeadsIsTheWholeModels) {
  constexpr int64_t B = 2, Hg = 4, H = 2, T = 70, S = 70, D = 16;
  const std::vector<float> q = random_vector(size_t(B * Hg * T * D), 61, -2.0f, 2.0f), k = random_vector(q.size(), 62),
                           v = random_vector(q.size(), 63), g = random_vector(q.size(), 64);
  auto heads = [&](const std::vector<float>& x, int64_t from, int64_t n) {  // [B, Hg, T, D] -> [B, n, T, D]
    std::vector<float> y;
    for (int64_t b = 0; b < B; ++b) {
      const auto first = x.begin() + ((b * Hg + from) * T) * D;
      y.insert(y.end(), first, first + n * T * D);
    }
    return y;
  };
  AttentionMask whole;
  whole.kind = Kind::causal;
  whole.dropout = 0.3f;
  whole.dropout_seed = 99;
  whole.dropout_stream = 5;
  for (Isa isa : testing::available_isas(Isa::avx512)) {
    SCOPED_TRACE(isa_name(isa));
    ScopedIsaCap cap(isa);
    const float scale = 0.25f;
    std::vector<float> out(q.size()), lse(size_t(B * Hg * T)), dq(q.size()), dk(q.size()), dv(q.size());
    ASSERT_TRUE(attention_forward(q, k, v, out, lse, B, Hg, Hg, T, S, D, scale, whole).is_ok());
    ASSERT_TRUE(attention_backward(q, k, v, out, lse, g, dq, dk, dv, B, Hg, Hg, T, S, D, scale, whole).is_ok());
    for (const int64_t offset : {int64_t(0), int64_t(2)}) {
      AttentionMask shard = whole;
      shard.dropout_heads = Hg;
      shard.dropout_head_offset = offset;
      const std::vector<float> sq = heads(q, offset, H), sk = heads(k, offset, H), sv = heads(v, offset, H),
                               sg = heads(g, offset, H);
      std::vector<float> so(sq.size()), sl(size_t(B * H * T)), sdq(sq.size()), sdk(sq.size()), sdv(sq.size());
      ASSERT_TRUE(attention_forward(sq, sk, sv, so, sl, B, H, H, T, S, D, scale, shard).is_ok());
      EXPECT_EQ(so, heads(out, offset, H)) << "offset " << offset;
      ASSERT_TRUE(attention_backward(sq, sk, sv, so, sl, sg, sdq, sdk, sdv, B, H, H, T, S, D, scale, shard).is_ok());
      EXPECT_EQ(sdq, heads(dq, offset, H)) << "offset " << offset;
      EXPECT_EQ(sdv, heads(dv, offset, H)) << "offset " << offset;
      if (offset == 0) continue;
      const std::vector<bf16> bq = to_bf16(sq), bk = to_bf16(sk), bv = to_bf16(sv);
      const std::vector<bf16> wq = to_bf16(q), wk = to_bf16(k), wv = to_bf16(v);
      std::vector<float> bo(sq.size()), bl(sl.size()), wo(q.size()), wl(lse.size());
      ASSERT_TRUE(attention_forward(std::span<const bf16>(bq), bk, bv, std::span<float>(bo), std::span<float>(bl), B, H,
                                    H, T, S, D, scale, shard)
                      .is_ok());
      ASSERT_TRUE(attention_forward(std::span<const bf16>(wq), wk, wv, std::span<float>(wo), std::span<float>(wl), B,
                                    Hg, Hg, T, S, D, scale, whole)
                      .is_ok());
      EXPECT_EQ(bo, heads(wo, offset, H));
    }
  }
  AttentionMask bad = whole;
  bad.dropout_heads = Hg;
  bad.dropout_head_offset = 3;
  std::vector<float> sq(size_t(B * H * T * D)), so(sq.size()), sl(size_t(B * H * T));
  EXPECT_EQ(attention_forward(sq, sq, sq, so, sl, B, H, H, T, S, D, 1.0f, bad).message(),
            "attention_forward: mask.dropout_head_offset: expected heads offset .. offset + H = 2 within dropout_heads "
            "= 4, found 3");
}

// Every mask family with dropout, forward and backward (f32 on every ISA, bf16), against the f64 reference
// with the same multipliers: causal, a local window with padding, packed documents, a layout, a bias,
// grouped heads, decode-shaped rows (which then take the tiles).
TEST(Attention, DropoutMatchesReference) {
  struct Dropped {
    Case c;
    Kind kind;
    float p;
    bool padded;
    int64_t max_doc = 0, block = 0;
    bool bias = false;
  };
  const Dropped cases[] = {{{2, 2, 130, 130, 16, 0, 0}, Kind::causal, 0.1f, false},
                           {{1, 4, 200, 200, 64, 0, 70, 2}, Kind::local, 0.5f, true},
                           {{2, 2, 100, 100, 17, 0, 0}, Kind::causal, 0.3f, false, 30},
                           {{1, 2, 256, 256, 32, 0, 0}, Kind::causal, 0.2f, false, 0, 32},
                           {{2, 3, 70, 90, 8, 20, 0, 1}, Kind::causal, 0.4f, true, 0, 0, true},
                           {{2, 2, 3, 200, 64, 197, 0}, Kind::causal, 0.25f, false}};
  uint64_t seed = 13000;
  for (const Dropped& x : cases) {
    const Case& c = x.c;
    SCOPED_TRACE(describe(c, x.kind, x.padded) + " dropout " + std::to_string(x.p));
    const Inputs in = make_inputs(c, x.padded, seed += 10);
    AttentionMask mask = make_mask(x.kind, c, in);
    mask.dropout = x.p;
    mask.dropout_seed = seed;
    mask.dropout_stream = 5;
    const std::vector<int32_t> seg = x.max_doc ? make_segments(c.B, c.S, x.max_doc, seed + 5) : std::vector<int32_t>{};
    mask.segments = seg;
    std::vector<uint8_t> layout;
    if (x.block) {
      layout = random_layout(c.H, (c.offset + c.T + x.block - 1) / x.block, (c.S + x.block - 1) / x.block, 0.5f, seed);
      mask.layout = layout;
      mask.layout_block = x.block;
      mask.layout_heads = c.H;
    }
    std::vector<float> bias;
    if (x.bias) {
      bias = random_vector(size_t(c.B * c.T * c.S), seed + 7, -2.0f, 2.0f);
      mask.bias = bias;
      mask.bias_batch = c.B;
    }
    expect_matches_reference(c, in, mask);
  }
}

// Empty problems (no query row, no key, no batch row, no head): both dtypes leave zero gradients and, with keys but
// no allowed one, out 0; nothing is read or written out of bounds.
// NOTE [attention decode rows]: a decode row over a KV cache reads keys only up to its batch row's last valid
// one: the bits of the same call on a cache just that long (left padding and a gap inside stay masked), on every
// ISA, with the long cache split into chunks (split-KV) or not.
TEST(Attention, DecodeStopsAtTheLastValidKey) {
  const int64_t B = 2, H = 4, Hk = 2, T = 1, D = 64, used = 300;
  const float scale = 0.125f;
  for (int64_t S : {int64_t(320), int64_t(4096)}) {
    SCOPED_TRACE("cache " + std::to_string(S));
    const std::vector<float> q = random_vector(size_t(B * H * T * D), 11, -2.0f, 2.0f);
    const std::vector<float> k = random_vector(size_t(B * Hk * S * D), 12, -2.0f, 2.0f);
    const std::vector<float> v = random_vector(size_t(B * Hk * S * D), 13, -2.0f, 2.0f);
    std::vector<uint8_t> valid(size_t(B * S), 0);
    for (int64_t b = 0; b < B; ++b)
      for (int64_t j = 0; j < used - 40 * b; ++j) valid[size_t(b * S + j)] = j >= 3 * b && j != 100;  // pad, gap
    // The same keys in a cache of `used` slots.
    std::vector<float> ks(size_t(B * Hk * used * D)), vs(ks.size());
    std::vector<uint8_t> valid_s(size_t(B * used));
    for (int64_t bh = 0; bh < B * Hk; ++bh) {
      std::copy_n(k.begin() + bh * S * D, used * D, ks.begin() + bh * used * D);
      std::copy_n(v.begin() + bh * S * D, used * D, vs.begin() + bh * used * D);
    }
    for (int64_t b = 0; b < B; ++b) std::copy_n(valid.begin() + b * S, used, valid_s.begin() + b * used);
    for (Isa isa : testing::available_isas()) {
      SCOPED_TRACE(isa_name(isa));
      ScopedIsaCap cap(isa);
      AttentionMask long_mask, short_mask;
      long_mask.key_valid = valid;
      short_mask.key_valid = valid_s;
      std::vector<float> a(q.size()), a_lse(size_t(B * H * T)), p(q.size()), p_lse(a_lse.size());
      ASSERT_TRUE(attention_forward(q, k, v, std::span<float>(a), std::span<float>(a_lse), B, H, Hk, T, S, D, scale,
                                    long_mask)
                      .is_ok());
      ASSERT_TRUE(attention_forward(q, ks, vs, std::span<float>(p), std::span<float>(p_lse), B, H, Hk, T, used, D,
                                    scale, short_mask)
                      .is_ok());
      if (S <= 320) {  // one chunk either way: the same bits
        EXPECT_EQ(a, p);
        EXPECT_EQ(a_lse, p_lse);
      } else {  // the long cache's split-KV chunks combine in another order: the same values to rounding
        for (size_t i = 0; i < a.size(); ++i) EXPECT_NEAR(a[i], p[i], 1e-5f) << i;
      }
    }
  }
}

TEST(Attention, EmptyProblemsGiveZeros) {
  for (const Case& c : {Case{1, 2, 0, 5, 8, 0, 0}, Case{2, 2, 3, 0, 8, 0, 0}, Case{0, 2, 3, 5, 8, 0, 0},
                        Case{1, 0, 3, 5, 8, 0, 0}}) {
    SCOPED_TRACE(describe(c, Kind::none, false));
    const Inputs in = make_inputs(c, false, 61);
    const size_t nq = in.q.size(), nk = in.k.size(), nl = size_t(c.B * c.H * c.T);
    const std::vector<bf16> q16 = to_bf16(in.q), k16 = to_bf16(in.k), v16 = to_bf16(in.v);
    for (const bool half : {false, true}) {
      Guarded<float> out(nq, NAN), lse(nl, NAN), gq(nq, NAN), gk(nk, NAN), gv(nk, NAN);
      const Status f = half ? attention_forward(std::span<const bf16>(q16), k16, v16, out.span(), lse.span(), c.B,
                                                c.H, c.hk(), c.T, c.S, c.D, 0.5f)
                            : attention_forward(in.q, in.k, in.v, out.span(), lse.span(), c.B, c.H, c.hk(), c.T, c.S,
                                                c.D, 0.5f);
      ASSERT_TRUE(f.is_ok()) << f.to_string();
      std::vector<float> o(out.cspan().begin(), out.cspan().end()), l(lse.cspan().begin(), lse.cspan().end());
      const Status b = half ? attention_backward(std::span<const bf16>(q16), k16, v16, o, l, in.dout, gq.span(),
                                                 gk.span(), gv.span(), c.B, c.H, c.hk(), c.T, c.S, c.D, 0.5f)
                            : attention_backward(in.q, in.k, in.v, o, l, in.dout, gq.span(), gk.span(), gv.span(),
                                                 c.B, c.H, c.hk(), c.T, c.S, c.D, 0.5f);
      ASSERT_TRUE(b.is_ok()) << b.to_string();
      for (const Guarded<float>* g : {&out, &gq, &gk, &gv}) {
        EXPECT_GUARDS(*g);
        for (float x : g->cspan()) EXPECT_EQ(x, 0.0f) << (half ? "bf16" : "f32");
      }
    }
  }
}

TEST(Attention, ReferenceModeRunsTheReference) {
  const Case c{1, 2, 9, 11, 5, 2, 0};
  const Inputs in = make_inputs(c, false, 41);
  const AttentionMask mask = make_mask(Kind::causal, c, in);
  std::vector<float> out(in.q.size()), lse(18), want_out(in.q.size()), want_lse(18);
  ref::attention_forward<float>(in.q.data(), in.k.data(), in.v.data(), want_out.data(), want_lse.data(), c.B, c.H, c.hk(),
                                c.T, c.S, c.D, 0.3f, mask);
  ScopedReferenceMode on(true);
  ASSERT_TRUE(attention_forward(in.q, in.k, in.v, out, lse, c.B, c.H, c.hk(), c.T, c.S, c.D, 0.3f, mask).is_ok());
  EXPECT_EQ(out, want_out);
  EXPECT_EQ(lse, want_lse);
}

TEST(Attention, BadArguments) {
  const int64_t B = 1, H = 2, T = 3, S = 4, D = 5;
  std::vector<float> q(B * H * T * D), k(B * H * S * D), v(k.size()), out(q.size()), lse(B * H * T);
  std::vector<float> dq(q.size()), dk(k.size()), dv(k.size());
  std::vector<float> short_q(q.size() - 1);
  EXPECT_EQ(attention_forward(short_q, k, v, out, lse, B, H, H, T, S, D, 1.0f).message(),
            "attention_forward: argument 'q': expected at least 30 elements, found 29");
  EXPECT_EQ(attention_backward(q, k, v, out, lse, q, dq, std::span<float>(dk).first(39), dv, B, H, H, T, S, D, 1.0f)
                .message(),
            "attention_backward: argument 'dk': expected at least 40 elements, found 39");
  AttentionMask local;
  local.kind = Kind::local;
  local.window = 0;
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, T, S, D, 1.0f, local).message(),
            "attention_forward: mask.window: expected >= 1, found 0");
  AttentionMask behind;
  behind.kind = Kind::causal;
  behind.kv_offset = -1;
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, T, S, D, 1.0f, behind).message(),
            "attention_forward: mask.kv_offset: expected >= 0, found -1");
  for (const float p : {1.0f, -0.1f, NAN}) {
    AttentionMask dropped;
    dropped.dropout = p;
    EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, T, S, D, 1.0f, dropped).message(),
              "attention_forward: mask.dropout: expected a probability in [0, 1), found " + std::to_string(p));
  }
  const std::vector<uint8_t> valid(3, 1);
  AttentionMask padded;
  padded.key_valid = valid;
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, T, S, D, 1.0f, padded).message(),
            "attention_forward: argument 'mask.key_valid': expected empty (all keys valid) or exactly 4 elements "
            "([B, S]), found 3");
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, -1, S, D, 1.0f).message(),
            "attention_forward: T: expected >= 0, found -1");
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, T, S, D, INFINITY).message(),
            "attention_forward: scale: expected a finite number, found inf");
  const std::vector<int32_t> shuffled = {0, 1, 0, 2};
  AttentionMask unsorted;
  unsorted.segments = shuffled;
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, T, S, D, 1.0f, unsorted).message(),
            "attention_forward: mask.segments row 0: expected non-decreasing segment ids (documents one after "
            "another), found 1 then 0 at key 2");
  const std::vector<int32_t> docs = {0, 0, 1, 1};
  AttentionMask late;
  late.segments = docs;
  late.kv_offset = 2;
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, T, S, D, 1.0f, late).message(),
            "attention_forward: mask.kv_offset: expected kv_offset + T <= S = 4 with segments (each query's segment "
            "is its position's), found 2 + 3");
  AttentionMask right;
  right.kind = Kind::causal;
  right.window_right = 2;
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, H, T, S, D, 1.0f, right).message(),
            "attention_forward: mask.window_right: expected 0 unless the kind is local, found 2");
  EXPECT_EQ(attention_forward(q, k, v, out, lse, B, H, 3, T, S, D, 1.0f).message(),
            "attention_forward: Hk: expected a divisor of H = 2 (key/value heads), found 3");
  EXPECT_EQ(attention_forward(q, std::span<float>(k).first(19), v, out, lse, B, H, 1, T, S, D, 1.0f).message(),
            "attention_forward: argument 'k': expected at least 20 elements, found 19");
}

}  // namespace
}  // namespace aspen::kernels
