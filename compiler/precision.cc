// compiler/precision.cc: the precision pass (CompileOptions::compute).
//
// Like autocast: with compute = bf16 (or f16), every f32 matmul, forward and
// backward, becomes
//   matmul(cast(a, bf16), cast(b, bf16)[, bias]) {out_dtype = f32, same trans flags}
// i.e. bf16 inputs with f32 accumulation and output; everything else stays
// f32 (master weights, norms, softmax, loss, gradient sums). One cast is made
// per value, at its first matmul use, and shared by later ones (a weight is
// cast once for the forward and the backward). The pass runs after autodiff
// and recomputation (clones are f32 values, cast where a matmul reads them)
// and before fusion, whose matmul + bias pattern then fuses the new matmuls
// (the bias stays f32, the output's dtype).
#include <map>

#include "compiler/pass.h"
#include "compiler/rewrite.h"
#include "graph/verify.h"

namespace aspen::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::ValueId;

namespace {

class Precision : public Pass {
 public:
  const char* name() const override { return "precision"; }

  Status run(Graph& g, const CompileContext& ctx) override {
    const DType compute = ctx.options.compute;
    if (compute == DType::f32) return Status();
    if (compute != DType::bf16 && compute != DType::f16)
      return Status::invalid_argument("compile options: compute", "f32, bf16 or f16",
                                      std::string(dtype_name(compute)));

    Rewrite rw(g);
    Graph& out = rw.out();
    std::map<int32_t, ValueId> cast_of;  // new value -> its cast to `compute`
    // The shared cast of new value v, made before node `user` on first request.
    auto cast = [&](ValueId v, const Node& user) -> Result<ValueId> {
      auto it = cast_of.find(v.index);
      if (it != cast_of.end()) return it->second;
      Node c;
      c.op = OpKind::cast;
      c.inputs = {v};
      c.attrs.set("dtype", int64_t(compute));
      c.stage = user.stage;
      c.backward = user.backward;
      ASPEN_ASSIGN_OR_RETURN(auto types, graph::check_node(out, c));
      const Node& added = out.node(out.add_node(std::move(c), types));
      cast_of.emplace(v.index, added.outputs[0]);
      return added.outputs[0];
    };

    for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
      Node n = g.node(i);
      for (ValueId& in : n.inputs) in = rw.map(in);
      std::vector<graph::TensorType> types;
      for (ValueId v : g.node(i).outputs) types.push_back(g.type(v));
      const bool convert = n.op == OpKind::matmul && !n.attrs.has("out_dtype") &&
                           out.type(n.inputs[0]).dtype == DType::f32 && out.type(n.inputs[1]).dtype == DType::f32;
      if (convert) {
        for (size_t k = 0; k < 2; ++k) {
          ASPEN_ASSIGN_OR_RETURN(n.inputs[k], cast(n.inputs[k], n));
        }
        n.attrs.set("out_dtype", int64_t(DType::f32));
        auto checked = graph::check_node(out, n);
        if (!checked.is_ok()) return checked.status().with_context("matmul node " + std::to_string(i));
        types = *checked;
      }
      rw.emit(std::move(n), types, g.node(i).outputs);
    }
    g = std::move(rw).finish();
    return Status();
  }
};

}  // namespace

std::unique_ptr<Pass> make_precision() { return std::make_unique<Precision>(); }

}  // namespace aspen::compiler
