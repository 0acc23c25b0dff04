#include "graph/cost.h"

#include <cstdint>

namespace aspen::graph {

namespace {

double numel(const Graph& g, ValueId v) { return double(g.type(v).shape.numel()); }

// A product's 2·M·N·K: its output's elements times K.
double product_flops(const Graph& g, ValueId a, ValueId out, bool trans_a, int64_t k_attr) {
  const Shape& as = g.type(a).shape;
  const double K = k_attr > 0 ? double(k_attr) : as.rank() == 0 ? 1.0 : double(trans_a && as.rank() >= 2 ? as[-2] : as[-1]);
  return 2.0 * numel(g, out) * K;
}

}  // namespace

double node_flops(const Graph& g, const Node& n) {
  switch (n.op) {
    case OpKind::matmul:
      return n.inputs.empty() || n.outputs.empty()
                 ? 0.0
                 : product_flops(g, n.inputs[0], n.outputs[0], n.attrs.i_or("trans_a", 0) != 0, 0);
    case OpKind::matmul_q:
      return n.inputs.empty() || n.outputs.empty() ? 0.0
                                                   : product_flops(g, n.inputs[0], n.outputs[0], false, n.attrs.i("k"));
    case OpKind::matmul_group: {
      if (n.inputs.empty()) return 0.0;
      const bool quantized = n.attrs.i_or("op", int64_t(OpKind::matmul)) == int64_t(OpKind::matmul_q);
      const int64_t k = quantized ? n.attrs.i("k") : 0;
      const bool trans_a = !quantized && n.attrs.i_or("trans_a", 0) != 0;
      double sum = 0.0;
      for (ValueId out : n.outputs) sum += product_flops(g, n.inputs[0], out, trans_a, k);
      return sum;
    }
    case OpKind::attention:
    case OpKind::attention_grad: {
      if (n.inputs.size() < 3) return 0.0;
      const Shape &q = g.type(n.inputs[0]).shape, &k = g.type(n.inputs[1]).shape, &v = g.type(n.inputs[2]).shape;
      if (q.rank() != 4 || k.rank() != 4 || v.rank() != 4) return 0.0;
      const double forward = 2.0 * double(q[0]) * double(q[1]) * double(q[2]) * double(k[2]) * double(q[3] + v[3]);
      return n.op == OpKind::attention ? forward : 2.0 * forward;
    }
    case OpKind::conv:              // (x, w): y
    case OpKind::conv_grad_input:   // (dy, w): dx
    case OpKind::conv_grad_weight: {  // (x, dy): dw
      if (n.inputs.size() < 2 || n.outputs.empty()) return 0.0;
      const ValueId dy_or_y = n.op == OpKind::conv ? n.outputs[0] : n.op == OpKind::conv_grad_input ? n.inputs[0] : n.inputs[1];
      const ValueId w = n.op == OpKind::conv_grad_weight ? n.outputs[0] : n.inputs[1];
      const Shape& ws = g.type(w).shape;
      if (ws.rank() < 1 || ws[0] == 0) return 0.0;
      return 2.0 * numel(g, dy_or_y) * numel(g, w) / double(ws[0]);
    }
    case OpKind::lstm:
    case OpKind::lstm_grad: {  // r [4H, H] is input 1 of both; T·B from xw (lstm) or dy (lstm_grad) [T, B, ...]
      if (n.inputs.size() < 2) return 0.0;
      const Shape& x = g.type(n.inputs[0]).shape;
      if (x.rank() != 3) return 0.0;
      return 2.0 * double(x[0]) * double(x[1]) * numel(g, n.inputs[1]);
    }
    default:
      return 0.0;
  }
}

}  // namespace aspen::graph
