// graph/ops_sampling.cc: drawing tokens inside the compiled program (generation), the graph form of
// kernels/sampling.h (its reference template, in f64, is the op's meaning).
//
//   sample(logits [B, V], temperature f32 [B], top_k i32 [B], top_p f32 [B], repetition_penalty f32 [B],
//          seed i64/i32 [], step i64/i32 [][, history i32 [B, L]]) -> ids i32 [B]
//       Per row: repetition penalty over the row's history ids (negative: padding), then temperature
//       (0: greedy argmax, lowest index among ties), top-k (0: off), top-p (1: off), and an inverse-CDF draw
//       keyed by (seed, step, row). History is optional (no penalty without it).
//
// Every setting is a runtime input, not an attribute: changing temperature, top-k, top-p, the penalty, the
// seed or the step between calls never recompiles. Values outside their domain (negative temperature,
// top_p outside (0, 1], ...) are a Status from the run, naming the argument and row. Seeds and steps are
// read as 64-bit integers; the reference interpreter holds values as f64, so it reproduces the compiled
// program for seeds and steps below 2^53.
//
// Gradient: none (ids are integers; not differentiable).
// Fast kernel: f32 logits (other float types run the reference).
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstddef>
#include <vector>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"
#include "kernels/sampling.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

constexpr size_t kHistory = 7;  // the optional input's index

Status expect_int_scalar(const Node& n, const char* what, const TensorType& t) {
  if ((t.dtype != DType::i32 && t.dtype != DType::i64) || t.shape.rank() != 0)
    return rule_error(n, what, "an i32 or i64 scalar (rank 0)", t.to_string());
  return Status();
}

Status infer_sample(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "logits", in[0]));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "logits", in[0], 2, 2));
  if (in[0].shape[1] < 1) return rule_error(n, "logits: dimension 1 (V)", ">= 1", in[0].to_string());
  const int64_t B = in[0].shape[0];
  const TensorType f{DType::f32, Shape{B}}, i{DType::i32, Shape{B}};
  ASPEN_RETURN_IF_ERROR(expect_type(n, "temperature", in[1], f, "one per row of logits"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "top_k", in[2], i, "one per row of logits"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "top_p", in[3], f, "one per row of logits"));
  ASPEN_RETURN_IF_ERROR(expect_type(n, "repetition_penalty", in[4], f, "one per row of logits"));
  ASPEN_RETURN_IF_ERROR(expect_int_scalar(n, "seed", in[5]));
  ASPEN_RETURN_IF_ERROR(expect_int_scalar(n, "step", in[6]));
  if (in.size() > kHistory) {
    const TensorType& h = in[kHistory];
    if (h.dtype != DType::i32 || h.shape.rank() != 2 || h.shape[0] != B)
      return rule_error(n, "history", "i32 [" + str(B) + ", L] (token ids per row of logits)", h.to_string());
  }
  out = {i};
  return Status();
}

std::vector<int32_t> to_i32(const std::vector<double>& d) {
  std::vector<int32_t> r(d.size());
  for (size_t k = 0; k < d.size(); ++k) r[k] = int32_t(d[k]);  // i32 inputs: exact
  return r;
}

uint64_t to_u64(double v) { return uint64_t(int64_t(v)); }

Status eval_sample(const Node&, Ins in, Outs out) {
  const int64_t B = in[0]->type.shape[0], V = in[0]->type.shape[1];
  const int64_t L = in.size() > kHistory ? in[kHistory]->type.shape[1] : 0;
  const std::vector<int32_t> top_k = to_i32(in[2]->data);
  const std::vector<int32_t> history = L > 0 ? to_i32(in[kHistory]->data) : std::vector<int32_t>{};
  const double *x = in[0]->data.data(), *t = in[1]->data.data(), *p = in[3]->data.data(),
               *r = in[4]->data.data();
  ASPEN_RETURN_IF_ERROR(
      kernels::check_sampling_values<double>("sample", x, history.data(), t, top_k.data(), p, r, B, V, L));
  std::vector<int32_t> ids(static_cast<size_t>(B));
  kernels::ref::sample_tokens<double>(x, history.data(), t, top_k.data(), p, r, to_u64(in[5]->data[0]),
                                      to_u64(in[6]->data[0]), ids.data(), B, V, L);
  for (int64_t b = 0; b < B; ++b) out[0].data[size_t(b)] = ids[size_t(b)];
  return Status();
}

uint64_t read_u64(const void* p, bool wide) {
  return wide ? uint64_t(*static_cast<const int64_t*>(p)) : uint64_t(int64_t(*static_cast<const int32_t*>(p)));
}

// The workspace (one slot per thread of the preparing team, at most B) is made here: run() does not allocate.
Prepared prepare_sample(const Node&, Types in, Types) {
  if (in[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t B = in[0].shape[0], V = in[0].shape[1];
  const int64_t L = in.size() > kHistory ? in[kHistory].shape[1] : 0;
  const bool seed_wide = in[5].dtype == DType::i64, step_wide = in[6].dtype == DType::i64;
  const int64_t slots = std::max<int64_t>(1, std::min<int64_t>(B, omp_get_max_threads()));
  std::vector<std::byte> ws(static_cast<size_t>(kernels::sample_tokens_workspace_bytes(V, slots)));
  return make_kernel([B, V, L, seed_wide, step_wide, ws = std::move(ws)](In i, Out o) mutable {
    const kernels::SamplingParams params{in_span<float>(i, 1, B), in_span<int32_t>(i, 2, B), in_span<float>(i, 3, B),
                                         in_span<float>(i, 4, B), read_u64(i[5], seed_wide),
                                         read_u64(i[6], step_wide)};
    const std::span<const int32_t> history =
        L > 0 ? in_span<int32_t>(i, kHistory, B * L) : std::span<const int32_t>();
    return kernels::sample_tokens(in_span<float>(i, 0, B * V), history, params, out_span<int32_t>(o, 0, B), B, V, L,
                                  ws);
  });
}

// Samples for the kernel sweep (graph/op_sample.h): logits with clear gaps (no near-ties, no
// near-boundary masses for a draw to land on), rows cycling through greedy, temperature, top-k, top-p and
// the penalty; without history, with an empty one, and with one holding padding (-1); i32 and i64 seeds.
// graph/ops_sampling_test.cc checks the draws across steps and every value error.
void samples_sample(SampleList& s) {
  constexpr int64_t B = 7, V = 129;
  for (int64_t L : {int64_t(-1), int64_t(0), int64_t(6)})
    for (DType seed_type : {DType::i64, DType::i32}) {
      SampleFeeds f;
      std::vector<double>& logits = f.values["logits"];
      for (int64_t i = 0; i < B * V; ++i) logits.push_back(double(float(std::sin(double(i) * 1.7 + 5.0) * 3.0)));
      for (int64_t b = 0; b < B; ++b) {
        f.values["temperature"].push_back(b % 4 == 0 ? 0.0 : double(0.5f + 0.25f * float(b % 3)));
        f.values["top_k"].push_back(b % 3 == 1 ? 5 : 0);
        f.values["top_p"].push_back(b % 4 == 2 ? double(0.9f) : 1.0);
        f.values["repetition_penalty"].push_back(b % 2 ? double(1.3f) : 1.0);
      }
      f.values["seed"] = {double(L + 11)};
      f.values["step"] = {3.0};
      for (int64_t i = 0; i < B * std::max<int64_t>(L, 0); ++i)
        f.values["history"].push_back(i % 3 == 2 ? -1.0 : double((i * 7) % V));
      s.add(
           "history " + std::to_string(L) + ", seed " + std::string(dtype_name(seed_type)),
           [&](Builder& b) {
             std::vector<ValueId> in{b.input("logits", DType::f32, Shape{B, V}),
                                     b.input("temperature", DType::f32, Shape{B}),
                                     b.input("top_k", DType::i32, Shape{B}),
                                     b.input("top_p", DType::f32, Shape{B}),
                                     b.input("repetition_penalty", DType::f32, Shape{B}),
                                     b.input("seed", seed_type, Shape{}),
                                     b.input("step", DType::i64, Shape{})};
             if (L >= 0) in.push_back(b.input("history", DType::i32, Shape{B, L}));
             b.op(OpKind::sample, in);
           },
           std::move(f))
          .tol = 0;  // ids: exactly the reference's
    }
}

}  // namespace

void register_sampling_ops(OpTable& t) {
  t.define(OpKind::sample, {.min_inputs = 7,
                            .max_inputs = 8,
                            .infer = infer_sample,
                            .eval = eval_sample,
                            .prepare = prepare_sample,
                            .samples = samples_sample});
}

}  // namespace aspen::graph
