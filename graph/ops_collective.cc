// graph/ops_collective.cc: collective ops. The compiler's placement
// inserts them and the runtime runs them on the communicator each device was
// given for the group (runtime::Session::set_communicator); here they have types,
// gradients and a single-device meaning.
//
//   all_reduce(x) {group, group_size, reduce: "sum" | "mean"}: same type
//   reduce_scatter(x) {group, group_size}: dimension 0 divided by group_size (sum)
//   all_gather(x) {group, group_size}: dimension 0 multiplied by group_size
// `group` names a mesh axis ("data", "pipe", "tensor").
// Gradient rules: all_reduce -> all_reduce of g (same reduction);
// all_gather <-> reduce_scatter. (Point-to-point tensors between pipeline
// stages are not ops: a training plan's send/recv instructions carry them
// through a parallel::Transport, train/plan.h.)
//
// Reference meaning: the interpreter runs one device, where a group of one is
// the identity. Any other group size is not interpretable (Unimplemented).
#include "graph/ops_registry.h"
#include "graph/ops_util.h"

namespace aspen::graph {

namespace {
using namespace opsutil;
using Grads = Result<std::vector<std::optional<ValueId>>>;
using OutGrads = std::span<const std::optional<ValueId>>;

Status check_group(const Node& n) {
  const int64_t size = n.attrs.i("group_size");
  if (size < 1) return rule_error(n, "group_size", ">= 1", std::to_string(size));
  return Status();
}

Status infer_all_reduce(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(check_group(n));
  ASPEN_RETURN_IF_ERROR(expect_float(n, "input", in[0]));
  const std::string& r = n.attrs.s("reduce");
  if (r != "sum" && r != "mean") return rule_error(n, "reduce", "\"sum\" or \"mean\"", "\"" + r + "\"");
  out = {in[0]};
  return Status();
}

Status infer_scatter_gather(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  ASPEN_RETURN_IF_ERROR(check_group(n));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "input", in[0], 1));
  const int64_t size = n.attrs.i("group_size");
  std::vector<int64_t> d = dims(in[0].shape);
  if (n.op == OpKind::reduce_scatter) {
    if (d[0] % size != 0)
      return rule_error(n, "dimension 0", "a multiple of group_size " + std::to_string(size), std::to_string(d[0]));
    d[0] /= size;
  } else {
    d[0] *= size;
  }
  ASPEN_ASSIGN_OR_RETURN(Shape s, to_shape(n, "output shape", d));
  out = {TensorType{in[0].dtype, s}};
  return Status();
}

Status eval_group_of_one(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  if (n.attrs.i("group_size") != 1)
    return Status::unimplemented(std::string(op_name(n.op)) + " over group '" + n.attrs.s("group") + "'",
                                 "group size for the one-device reference interpreter (1)");
  out[0].data = in[0]->data;
  return Status();
}

Attrs same_group(const Node& n) {
  return Attrs{{"group", n.attrs.s("group")}, {"group_size", n.attrs.i("group_size")}};
}

Grads grad_all_reduce(Builder& b, const Node& n, OutGrads g) {
  Attrs a = same_group(n);
  a.set("reduce", n.attrs.s("reduce"));
  return std::vector<std::optional<ValueId>>{b.op1(OpKind::all_reduce, {*g[0]}, a)};
}
Grads grad_all_gather(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.op1(OpKind::reduce_scatter, {*g[0]}, same_group(n))};
}
Grads grad_reduce_scatter(Builder& b, const Node& n, OutGrads g) {
  return std::vector<std::optional<ValueId>>{b.op1(OpKind::all_gather, {*g[0]}, same_group(n))};
}

}  // namespace

void register_collective_ops(OpTable& t) {
  const AttrSpec group{"group", AttrKind::str, true}, size{"group_size", AttrKind::i64, true};
  t.define(OpKind::all_reduce, {.flags = kCommunicates,
                                .min_inputs = 1,
                                .max_inputs = 1,
                                .attrs = {group, size, {"reduce", AttrKind::str, true}},
                                .infer = infer_all_reduce,
                                .grad = grad_all_reduce,
                                .eval = eval_group_of_one});
  t.define(OpKind::reduce_scatter, {.flags = kCommunicates,
                                    .min_inputs = 1,
                                    .max_inputs = 1,
                                    .attrs = {group, size},
                                    .infer = infer_scatter_gather,
                                    .grad = grad_reduce_scatter,
                                    .eval = eval_group_of_one});
  t.define(OpKind::all_gather, {.flags = kCommunicates,
                                .min_inputs = 1,
                                .max_inputs = 1,
                                .attrs = {group, size},
                                .infer = infer_scatter_gather,
                                .grad = grad_all_gather,
                                .eval = eval_group_of_one});
}

}  // namespace aspen::graph
