// graph/ops_logic.cc: comparisons and logic. Outputs are bool, one per element; inputs of a binary op
// have equal types (broadcast explicitly). Not differentiated: nothing flows through a truth value (where
// gives its condition no gradient).
//
//   equal(a, b), less(a, b), greater(a, b): a and b of any one dtype -> bool; NaN compares false
//   logical_and(a, b), logical_or(a, b), logical_not(x): bool -> bool
//   is_nan(x): a float type -> bool
// Fast kernels (kernels/logic.h): comparisons of f32, i32, i64, bool and u8; the logic ops; is_nan of f32.
// bf16 and f16 run the reference.
#include <cmath>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_registry.h"
#include "graph/ops_util.h"
#include "kernels/logic.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using Prepared = Result<std::unique_ptr<PreparedKernel>>;
using In = std::span<const void* const>;
using Out = std::span<void* const>;
using Types = std::span<const TensorType>;

Status infer_compare(const Node& n, Types in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_same(n, in, 0, 1));
  out = {TensorType{DType::boolean, in[0].shape}};
  return Status();
}

Status expect_bool(const Node& n, const char* what, const TensorType& t) {
  if (t.dtype != DType::boolean) return rule_error(n, what, "bool", t.to_string());
  return Status();
}

Status infer_logic(const Node& n, Types in, std::vector<TensorType>& out) {
  for (size_t k = 0; k < in.size(); ++k) ASPEN_RETURN_IF_ERROR(expect_bool(n, k ? "b" : "a", in[k]));
  if (in.size() == 2) ASPEN_RETURN_IF_ERROR(expect_same(n, in, 0, 1));
  out = {in[0]};
  return Status();
}

Status infer_is_nan(const Node& n, Types in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "x", in[0]));
  out = {TensorType{DType::boolean, in[0].shape}};
  return Status();
}

template <class F>
Status eval2(std::span<const HostArray* const> in, std::span<HostArray> out, F f) {
  const std::vector<double>&a = in[0]->data, &b = in[1]->data;
  for (size_t i = 0; i < a.size(); ++i) out[0].data[i] = f(a[i], b[i]) ? 1.0 : 0.0;
  return Status();
}

kernels::Compare compare_of(OpKind op) {
  return op == OpKind::equal  ? kernels::Compare::equal
         : op == OpKind::less ? kernels::Compare::less
                              : kernels::Compare::greater;
}

Prepared prepare_compare(const Node& n, Types in, Types) {
  const int64_t N = in[0].shape.numel();
  const kernels::Compare op = compare_of(n.op);
  auto typed = [&](auto zero) -> Prepared {
    using T = decltype(zero);
    return make_kernel([op, N](In i, Out o) {
      return kernels::compare_forward<T>(op, in_span<T>(i, 0, N), in_span<T>(i, 1, N), out_span<uint8_t>(o, 0, N), N);
    });
  };
  switch (in[0].dtype) {
    case DType::f32:
      return typed(float());
    case DType::i32:
      return typed(int32_t());
    case DType::i64:
      return typed(int64_t());
    case DType::boolean:
    case DType::u8:
      return typed(uint8_t());
    default:
      return no_fast_kernel();
  }
}

Prepared prepare_logic(const Node& n, Types in, Types) {
  const int64_t N = in[0].shape.numel();
  if (n.op == OpKind::logical_not)
    return make_kernel(
        [N](In i, Out o) { return kernels::not_forward(in_span<uint8_t>(i, 0, N), out_span<uint8_t>(o, 0, N), N); });
  const kernels::Logic op = n.op == OpKind::logical_and ? kernels::Logic::logical_and : kernels::Logic::logical_or;
  return make_kernel([op, N](In i, Out o) {
    return kernels::logic_forward(op, in_span<uint8_t>(i, 0, N), in_span<uint8_t>(i, 1, N), out_span<uint8_t>(o, 0, N),
                                  N);
  });
}

Prepared prepare_is_nan(const Node&, Types in, Types) {
  if (in[0].dtype != DType::f32) return no_fast_kernel();
  const int64_t N = in[0].shape.numel();
  return make_kernel(
      [N](In i, Out o) { return kernels::is_nan_forward(in_span<float>(i, 0, N), out_span<uint8_t>(o, 0, N), N); });
}

// Samples for the kernel sweep (graph/op_sample.h): every dtype with a fast kernel, an odd shape and one
// large enough for the parallel path; ties are likely among integers drawn from a few values, and one f32
// sample is half ties, so equal is tested on equal values too.
const Shape kOdd{3, 5, 7}, kLarge{2, 130, 131};

void compare_samples(SampleList& s, OpKind op) {
  for (DType dt : {DType::f32, DType::i32, DType::i64, DType::boolean, DType::u8})
    for (const Shape& shape : {kOdd, kLarge})
      s.add(std::string(dtype_name(dt)) + " " + shape.to_string(),
            [&](Builder& b) {
              b.op(op, {b.input("a", dt, shape), b.input("b", dt, shape)});
            },
            {.int_hi = dt == DType::boolean ? 2 : 3});
  std::vector<double> b_values(105);
  for (size_t i = 0; i < b_values.size(); ++i) b_values[i] = i % 2 ? 0.5 : 0.25 * double(i % 5);
  s.add("f32 ties",
        [&](Builder& b) {
          b.op(op, {b.input("a", DType::f32, kOdd), b.input("b", DType::f32, kOdd)});
        },
        {.values = {{"a", std::vector<double>(105, 0.5)}, {"b", b_values}}});
  s.add("bf16", [&](Builder& b) {
     b.op(op, {b.input("a", DType::bf16, kOdd), b.input("b", DType::bf16, kOdd)});
   }).fast = false;
}
void samples_equal(SampleList& s) { compare_samples(s, OpKind::equal); }
void samples_less(SampleList& s) { compare_samples(s, OpKind::less); }
void samples_greater(SampleList& s) { compare_samples(s, OpKind::greater); }

void logic_samples(SampleList& s, OpKind op) {
  for (const Shape& shape : {kOdd, kLarge})
    s.add("bool " + shape.to_string(),
          [&](Builder& b) {
            std::vector<ValueId> in{b.input("a", DType::boolean, shape)};
            if (op != OpKind::logical_not) in.push_back(b.input("b", DType::boolean, shape));
            b.op(op, in);
          },
          {.int_hi = 2});
}
void samples_logical_and(SampleList& s) { logic_samples(s, OpKind::logical_and); }
void samples_logical_or(SampleList& s) { logic_samples(s, OpKind::logical_or); }
void samples_logical_not(SampleList& s) { logic_samples(s, OpKind::logical_not); }

void samples_is_nan(SampleList& s) {
  std::vector<double> x(105);
  for (size_t i = 0; i < x.size(); ++i) x[i] = i % 3 == 0 ? std::nan("") : i % 3 == 1 ? double(i) : -INFINITY;
  s.add("f32 with NaN and infinities", [](Builder& b) { b.op(OpKind::is_nan, {b.input("x", DType::f32, kOdd)}); },
        {.values = {{"x", x}}});
  s.add("f32 large", [](Builder& b) { b.op(OpKind::is_nan, {b.input("x", DType::f32, kLarge)}); });
  s.add("bf16", [](Builder& b) { b.op(OpKind::is_nan, {b.input("x", DType::bf16, kOdd)}); }).fast = false;
}

}  // namespace

void register_logic_ops(OpTable& t) {
  for (OpKind op : {OpKind::equal, OpKind::less, OpKind::greater})
    t.define(op, {.min_inputs = 2,
                  .max_inputs = 2,
                  .infer = infer_compare,
                  .eval =
                      [](const Node& n, auto in, auto out) {
                        if (n.op == OpKind::equal) return eval2(in, out, [](double a, double b) { return a == b; });
                        if (n.op == OpKind::less) return eval2(in, out, [](double a, double b) { return a < b; });
                        return eval2(in, out, [](double a, double b) { return a > b; });
                      },
                  .prepare = prepare_compare,
                  .samples = op == OpKind::equal  ? samples_equal
                             : op == OpKind::less ? samples_less
                                                  : samples_greater});
  t.define(OpKind::logical_and,
           {.flags = kElementwise,
            .min_inputs = 2,
            .max_inputs = 2,
            .infer = infer_logic,
            .eval = [](const Node&, auto in,
                       auto out) { return eval2(in, out, [](double a, double b) { return a != 0 && b != 0; }); },
            .prepare = prepare_logic,
            .samples = samples_logical_and});
  t.define(OpKind::logical_or,
           {.flags = kElementwise,
            .min_inputs = 2,
            .max_inputs = 2,
            .infer = infer_logic,
            .eval = [](const Node&, auto in,
                       auto out) { return eval2(in, out, [](double a, double b) { return a != 0 || b != 0; }); },
            .prepare = prepare_logic,
            .samples = samples_logical_or});
  t.define(OpKind::logical_not, {.flags = kElementwise,
                                 .min_inputs = 1,
                                 .max_inputs = 1,
                                 .infer = infer_logic,
                                 .eval =
                                     [](const Node&, auto in, auto out) {
                                       for (size_t i = 0; i < out[0].data.size(); ++i)
                                         out[0].data[i] = in[0]->data[i] == 0 ? 1.0 : 0.0;
                                       return Status();
                                     },
                                 .prepare = prepare_logic,
                                 .samples = samples_logical_not});
  t.define(OpKind::is_nan, {.min_inputs = 1,
                            .max_inputs = 1,
                            .infer = infer_is_nan,
                            .eval =
                                [](const Node&, auto in, auto out) {
                                  for (size_t i = 0; i < out[0].data.size(); ++i)
                                    out[0].data[i] = std::isnan(in[0]->data[i]) ? 1.0 : 0.0;
                                  return Status();
                                },
                            .prepare = prepare_is_nan,
                            .samples = samples_is_nan});
}

}  // namespace aspen::graph
