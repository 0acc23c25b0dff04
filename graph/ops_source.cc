// graph/ops_source.cc: ops with no inputs: input, parameter, constant.
#include "graph/ops_registry.h"
#include "graph/ops_util.h"

namespace aspen::graph {

namespace {
using namespace opsutil;

// input and parameter: the type is given by attributes.
Status infer_declared(const Node& n, std::span<const TensorType>, std::vector<TensorType>& out) {
  const int64_t dt = n.attrs.i("dtype");
  if (dt < 0 || dt >= kNumDTypes) return rule_error(n, "dtype", "a dtype id in [0, 7)", std::to_string(dt));
  ASPEN_ASSIGN_OR_RETURN(Shape shape, to_shape(n, "shape", n.attrs.ints("shape")));
  out = {TensorType{DType(dt), shape}};
  return Status();
}

Status eval_fed(const Node& n, std::span<const HostArray* const>, std::span<HostArray>) {
  return Status::error(Code::kInternal, std::string(op_name(n.op)) + " '" + n.name + "'",
                       "a value fed by the interpreter", "a call to eval");
}

Status infer_constant(const Node& n, std::span<const TensorType>, std::vector<TensorType>& out) {
  if (!n.constant) return rule_error(n, "data", "a tensor", "none");
  out = {TensorType{n.constant->dtype(), n.constant->shape()}};
  return Status();
}

Status eval_constant(const Node& n, std::span<const HostArray* const>, std::span<HostArray> out) {
  out[0] = HostArray::from_tensor(*n.constant);
  return Status();
}

}  // namespace

void register_source_ops(OpTable& t) {
  const std::vector<AttrSpec> declared = {{"dtype", AttrKind::i64, true}, {"shape", AttrKind::ints, true}};
  t.define(OpKind::input, {.flags = kSource | kKeep | kUnique,
                           .min_inputs = 0,
                           .max_inputs = 0,
                           .attrs = declared,
                           .infer = infer_declared,
                           .eval = eval_fed});
  t.define(OpKind::parameter, {.flags = kSource | kKeep | kUnique,
                               .min_inputs = 0,
                               .max_inputs = 0,
                               .attrs = declared,
                               .infer = infer_declared,
                               .eval = eval_fed});
  t.define(OpKind::constant,
           {.flags = kSource, .min_inputs = 0, .max_inputs = 0, .infer = infer_constant, .eval = eval_constant});
}

}  // namespace aspen::graph
