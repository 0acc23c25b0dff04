// graph/ops_reduce.cc: broadcast and reductions, each the other's gradient.
//
//   broadcast(x, shape): x's dimensions align with the trailing dimensions of
//       `shape` (numpy rules: each equal, or 1 in x); out has `shape`.
//   reduce_sum / reduce_max (x, axes, keepdims): over the listed axes.
// Gradient rules:
//   broadcast:  dx = reduce_sum(g, the broadcast axes), reshaped to x
//   reduce_sum: dx = broadcast(g with the reduced axes kept as 1, x's shape)
//   reduce_max: none (nothing in the models differentiates through it)
#include <algorithm>
#include <limits>

#include "graph/ops_registry.h"
#include "graph/ops_util.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using Grads = Result<std::vector<std::optional<ValueId>>>;
using OutGrads = std::span<const std::optional<ValueId>>;

Status infer_broadcast(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_ASSIGN_OR_RETURN(Shape to, to_shape(n, "shape", n.attrs.ints("shape")));
  const Shape& from = in[0].shape;
  if (from.rank() > to.rank())
    return rule_error(n, "shape", "rank >= " + std::to_string(from.rank()) + " (the input's)", to.to_string());
  const int lead = to.rank() - from.rank();
  for (int i = 0; i < from.rank(); ++i)
    if (from[i] != 1 && from[i] != to[lead + i])
      return rule_error(n, "dimension " + std::to_string(lead + i),
                        std::to_string(from[i]) + " or a 1 in the input to broadcast from",
                        "input " + from.to_string() + " against " + to.to_string());
  out = {TensorType{in[0].dtype, to}};
  return Status();
}

// For each flat index of `to`, the flat index of `from` it reads.
std::vector<int64_t> broadcast_index(const Shape& from, const Shape& to) {
  const int lead = to.rank() - from.rank();
  std::vector<int64_t> idx(size_t(to.numel()));
  std::vector<int64_t> coord(size_t(to.rank()), 0);
  for (int64_t flat = 0; flat < to.numel(); ++flat) {
    int64_t src = 0;
    for (int i = 0; i < from.rank(); ++i) src = src * from[i] + (from[i] == 1 ? 0 : coord[size_t(lead + i)]);
    idx[size_t(flat)] = src;
    for (int d = to.rank() - 1; d >= 0; --d) {
      if (++coord[size_t(d)] < to[d]) break;
      coord[size_t(d)] = 0;
    }
  }
  return idx;
}

Status eval_broadcast(const Node&, std::span<const HostArray* const> in, std::span<HostArray> out) {
  std::vector<int64_t> idx = broadcast_index(in[0]->type.shape, out[0].type.shape);
  for (size_t i = 0; i < idx.size(); ++i) out[0].data[i] = in[0]->data[size_t(idx[i])];
  return Status();
}

Result<std::vector<char>> reduced_axes(const Node& n, const Shape& s) {
  std::vector<char> r(size_t(s.rank()), 0);
  for (int64_t a : n.attrs.ints("axes")) {
    ASPEN_ASSIGN_OR_RETURN(int ax, axis_of(n, "axes", a, s.rank()));
    if (r[size_t(ax)]) return rule_error(n, "axes", "each axis once", "axis " + std::to_string(a) + " twice");
    r[size_t(ax)] = 1;
  }
  return r;
}

Shape reduced_shape(const Shape& s, const std::vector<char>& axes, bool keepdims) {
  std::vector<int64_t> d;
  for (int i = 0; i < s.rank(); ++i) {
    if (!axes[size_t(i)]) d.push_back(s[i]);
    else if (keepdims) d.push_back(1);
  }
  return *Shape::make(d.data(), int(d.size()));
}

Status infer_reduce(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, "input", in[0]));
  ASPEN_ASSIGN_OR_RETURN(std::vector<char> axes, reduced_axes(n, in[0].shape));
  out = {TensorType{in[0].dtype, reduced_shape(in[0].shape, axes, n.attrs.i_or("keepdims", 0) != 0)}};
  return Status();
}

// Maps each flat input index to its flat output index (keepdims layout and
// squeezed layout have the same element order).
std::vector<int64_t> reduce_index(const Node& n, const Shape& s) {
  std::vector<char> axes = *reduced_axes(n, s);
  Shape kept = reduced_shape(s, axes, true);
  std::vector<int64_t> idx(size_t(s.numel()));
  std::vector<int64_t> coord(size_t(s.rank()), 0);
  for (int64_t flat = 0; flat < s.numel(); ++flat) {
    int64_t dst = 0;
    for (int i = 0; i < s.rank(); ++i) dst = dst * kept[i] + (axes[size_t(i)] ? 0 : coord[size_t(i)]);
    idx[size_t(flat)] = dst;
    for (int d = s.rank() - 1; d >= 0; --d) {
      if (++coord[size_t(d)] < s[d]) break;
      coord[size_t(d)] = 0;
    }
  }
  return idx;
}

Status eval_reduce_sum(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  std::vector<int64_t> idx = reduce_index(n, in[0]->type.shape);
  std::fill(out[0].data.begin(), out[0].data.end(), 0.0);
  for (size_t i = 0; i < idx.size(); ++i) out[0].data[size_t(idx[i])] += in[0]->data[i];
  return Status();
}

Status eval_reduce_max(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  std::vector<int64_t> idx = reduce_index(n, in[0]->type.shape);
  std::fill(out[0].data.begin(), out[0].data.end(), -std::numeric_limits<double>::infinity());
  for (size_t i = 0; i < idx.size(); ++i)
    out[0].data[size_t(idx[i])] = std::max(out[0].data[size_t(idx[i])], in[0]->data[i]);
  return Status();
}

std::vector<int64_t> keepdims_shape(const Node& n, const Shape& s) {
  return dims(reduced_shape(s, *reduced_axes(n, s), true));
}

Grads grad_broadcast(Builder& b, const Node& n, OutGrads g) {
  // Copies: the builder appends values below, which may move the type table.
  const Shape from = b.type(n.inputs[0]).shape;
  const Shape to = b.type(n.outputs[0]).shape;
  const int lead = to.rank() - from.rank();
  std::vector<int64_t> axes;
  for (int i = 0; i < to.rank(); ++i)
    if (i < lead || from[i - lead] != to[i]) axes.push_back(i);
  ValueId s = axes.empty() ? *g[0] : b.reduce_sum(*g[0], axes, /*keepdims=*/true);
  return std::vector<std::optional<ValueId>>{b.reshape(s, dims(from))};
}

Grads grad_reduce_sum(Builder& b, const Node& n, OutGrads g) {
  const Shape s = b.type(n.inputs[0]).shape;  // a copy (see grad_broadcast)
  ValueId kept = b.reshape(*g[0], keepdims_shape(n, s));
  return std::vector<std::optional<ValueId>>{b.broadcast(kept, dims(s))};
}

}  // namespace

void register_reduce_ops(OpTable& t) {
  t.define(OpKind::broadcast, {.min_inputs = 1, .max_inputs = 1, .attrs = {{"shape", AttrKind::ints, true}},
                               .infer = infer_broadcast, .grad = grad_broadcast, .eval = eval_broadcast});
  const std::vector<AttrSpec> reduce_attrs = {{"axes", AttrKind::ints, true}, {"keepdims", AttrKind::i64, false}};
  t.define(OpKind::reduce_sum, {.min_inputs = 1, .max_inputs = 1, .attrs = reduce_attrs, .infer = infer_reduce,
                                .grad = grad_reduce_sum, .eval = eval_reduce_sum});
  // reduce_max has no gradient rule yet: nothing in the models differentiates through it
  // (softmax and cross-entropy carry their own stable forms).
  t.define(OpKind::reduce_max,
           {.min_inputs = 1, .max_inputs = 1, .attrs = reduce_attrs, .infer = infer_reduce, .eval = eval_reduce_max});
}

}  // namespace aspen::graph
