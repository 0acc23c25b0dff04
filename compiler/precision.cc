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
// (the bias stays f32, the output's dtype). Attention over more than a few
// query rows takes bf16 q, k and v the same way (bf16_attention below).
//
// With partials = the compute type, each converted matmul writes its result
// in that type (out_dtype = bf16/f16; a bias is cast too) and a cast back to
// f32 stands for the old output: the rest of the graph is unchanged.
//
// With stochastic_rounding, a parameter's cast (a master weight's compute copy, made once per program run:
// per micro-batch in training) rounds stochastically from the graph's run-time seed (NOTE [stochastic cast]):
// unbiased, so small updates of the f32 masters reach the narrow copy on average, and reproducible from the
// seed. Activations keep round-to-nearest.
#include <map>
#include <optional>

#include "compiler/pass.h"
#include "compiler/rewrite.h"
#include "graph/verify.h"
#include "kernels/attention.h"

namespace aspen::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::ValueId;

namespace {

// With compute = bf16, attention and its gradient over more than kernels::kAttentionDecodeRows query rows
// take bf16 q, k and v (out_dtype f32: kernels/attention.h's bf16 kernels, AMX tiles where the CPU has
// them). Decoding steps keep f32 attention: their split-KV rows (NOTE [attention split-KV decoding]) are
// f32 only, and casting a long KV cache every step would cost as much as the step's attention. f16 compute
// keeps f32 attention (no f16 kernel).
bool bf16_attention(const Node& n, const Graph& g, DType compute) {
  if (compute != DType::bf16 || (n.op != OpKind::attention && n.op != OpKind::attention_grad) ||
      n.attrs.has("out_dtype"))
    return false;
  const graph::TensorType& q = g.type(n.inputs[0]);
  return q.dtype == DType::f32 && q.shape[2] > kernels::kAttentionDecodeRows;
}

// A parameter's stochastic-rounding stream: FNV-1a of its name (63 bits), the same on every build.
uint64_t name_stream(const std::string& name) {
  uint64_t h = 1469598103934665603ULL;
  for (unsigned char ch : name) h = (h ^ ch) * 1099511628211ULL;
  return h & 0x7fffffffffffffffULL;
}

class Precision : public Pass {
 public:
  const char* name() const override { return "precision"; }

  Status run(Graph& g, const CompileContext& ctx) override {
    const DType compute = ctx.options.compute;
    if (compute == DType::f32) return Status();
    if (compute != DType::bf16 && compute != DType::f16)
      return Status::invalid_argument("compile options: compute", "f32, bf16 or f16",
                                      std::string(dtype_name(compute)));
    const DType partials = ctx.options.partials;
    if (partials != DType::f32 && partials != compute)
      return Status::invalid_argument("compile options: partials",
                                      "f32 or the compute type (" + std::string(dtype_name(compute)) + ")",
                                      std::string(dtype_name(partials)));

    // The graph's run-time seed, for stochastic rounding: needed only where a parameter is cast (a training
    // step's norm and optimizer programs cast none, and have no seed).
    std::optional<ValueId> seed_in;
    const bool stochastic = ctx.options.stochastic_rounding;
    if (stochastic) {
      seed_in = g.find_input(kRandomSeedInput);
      if (seed_in && g.type(*seed_in) != graph::TensorType{DType::i64, Shape{1}})
        return Status::invalid_argument("compile options: stochastic_rounding: the seed input '" +
                                            std::string(kRandomSeedInput) + "'",
                                        "i64[1]", g.type(*seed_in).to_string());
    }
    Rewrite rw(g);
    Graph& out = rw.out();
    const int32_t seed_node = seed_in ? g.value(*seed_in).producer : -1;
    if (seed_in) rw.copy(seed_node);  // first: a cast before the node that declares it may read it
    std::map<int32_t, ValueId> cast_of;  // new value -> its cast to `compute`
    // The shared cast of new value v, made before node `user` on first request. A parameter's rounds
    // stochastically under stochastic_rounding (NOTE [stochastic cast]), on a stream named by the parameter.
    auto cast = [&](ValueId v, const Node& user) -> Result<ValueId> {
      auto it = cast_of.find(v.index);
      if (it != cast_of.end()) return it->second;
      Node c;
      c.op = OpKind::cast;
      c.inputs = {v};
      c.attrs.set("dtype", int64_t(compute));
      const Node& from = out.producer(v);
      if (stochastic && from.op == OpKind::parameter && out.type(v).dtype == DType::f32) {
        if (!seed_in)
          return Status::invalid_argument("compile options: stochastic_rounding (casting parameter '" + from.name +
                                              "')",
                                          std::string("a graph with the run-time seed input '") + kRandomSeedInput +
                                              "' (i64[1])",
                                          "no such input");
        c.inputs.push_back(rw.map(*seed_in));
        c.attrs.set("stream", int64_t(name_stream(from.name)));
      }
      c.stage = user.stage;
      c.scope = user.scope;
      c.backward = user.backward;
      ASPEN_ASSIGN_OR_RETURN(auto types, graph::check_node(out, c));
      const Node& added = out.node(out.add_node(std::move(c), types));
      cast_of.emplace(v.index, added.outputs[0]);
      return added.outputs[0];
    };

    for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
      if (i == seed_node) continue;
      Node n = g.node(i);
      for (ValueId& in : n.inputs) in = rw.map(in);
      std::vector<graph::TensorType> types;
      for (ValueId v : g.node(i).outputs) types.push_back(g.type(v));
      const bool convert = n.op == OpKind::matmul && !n.attrs.has("out_dtype") &&
                           out.type(n.inputs[0]).dtype == DType::f32 && out.type(n.inputs[1]).dtype == DType::f32;
      if (convert) {
        const size_t narrow = partials == DType::f32 ? 2 : n.inputs.size();  // a, b (and the bias)
        for (size_t k = 0; k < narrow; ++k) {
          ASPEN_ASSIGN_OR_RETURN(n.inputs[k], cast(n.inputs[k], n));
        }
        n.attrs.set("out_dtype", int64_t(partials));
        auto checked = graph::check_node(out, n);
        if (!checked.is_ok()) return checked.status().with_context("matmul node " + std::to_string(i));
        if (partials != DType::f32) {
          const graph::ValueId narrow_out = out.node(out.add_node(n, *checked)).outputs[0];
          Node back;
          back.op = OpKind::cast;
          back.inputs = {narrow_out};
          back.attrs.set("dtype", int64_t(DType::f32));
          back.stage = n.stage;
          back.scope = n.scope;
          back.backward = n.backward;
          rw.emit(std::move(back), types, g.node(i).outputs);
          continue;
        }
        types = *checked;
      } else if (bf16_attention(n, out, compute)) {  // q, k, v cast; out, lse and the gradients stay f32
        for (size_t k = 0; k < 3; ++k) {
          ASPEN_ASSIGN_OR_RETURN(n.inputs[k], cast(n.inputs[k], n));
        }
        n.attrs.set("out_dtype", int64_t(DType::f32));
        auto checked = graph::check_node(out, n);
        if (!checked.is_ok()) return checked.status().with_context("attention node " + std::to_string(i));
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
