// compiler/fusion.cc: the fusion pass (O2).
//
// Patterns, each replacing nodes by one that runs as one kernel:
//   add(matmul(a, b), broadcast(bias [N]))   -> matmul(a, b, bias)        (oneDNN's bias epilogue)
//   gelu(add(x, broadcast(bias [C])))        -> bias_gelu(x, bias)
//   layernorm(add(x, r), gamma, beta)        -> add_layernorm(x, r, gamma, beta), whose first
//                                               output h replaces the add (the residual stream)
// Before those, two rewrites of what exporters write out in pieces (ONNX
// imports; the constants may be folded broadcasts):
//   mul(x, c) with c a constant of one value everywhere -> scale(x, c)
//   0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))       -> gelu(x) {tanh=1}
//   0.5 x (1 + erf(x / sqrt(2)))                          -> gelu(x) {tanh=0}
// in any order of the products and sums (constants within 1e-5 relative), and
// NOTE [bernoulli dropout]: torch's bernoulli mask (x * (uniform < keep) / keep) -> dropout(x)
// NOTE [attention in pieces]: scaled dot-product attention as torch's math
// SDPA writes it,
//   matmul(where(is_nan(p), 0, p), v) with p = softmax(matmul(q c1, kT c2) [+ mask])
//   -> attention(q, transpose(kT), v) {scale = c1 c2, mask}
// where q [B, H, T, D], kT [B, H, D, S] (or k [B, H, S, D] read with trans_b),
// v [B, H, S, D], f32, the where is optional, and the mask a constant that is
// all 0 ("none") or 0 on and below the diagonal and -inf (or below -1e30)
// above it, with T == S ("causal"). The fused kernel skips the masked half and
// its backward recomputes the probabilities instead of keeping them: GPT-2
// small exported from torch trains 5 % faster. It applies only when the
// scores, the probabilities and the guard have no other users.
// NOTE [matmul groups]: after those, matmuls of one a by [N, K] weights (trans_b, no trans_a, the same
// weight type, K and bias or none), whose a has at most 8 rows (decode products: a layer's q, k and v; its
// gate and up), become one matmul_group (graph/ops_fused.cc), which runs them in one parallel region (NOTE
// [gemv groups]); so do such matmul_q products (quantized weights) of one block format; at most 16 a group.
// The group takes the first member's place when every weight and bias exists there (parameters made later
// move up with it), else the last's when no member's result is read before it; else the matmuls stay apart.
// Only the last node of a GELU is replaced: the pieces die with dead-code
// elimination unless something else reads them.
// A pattern applies only when the nodes it removes have no other users (the
// matmul, and the add under gelu) and, for add_layernorm, when no user of the
// sum comes before the layernorm (the fused node takes the layernorm's place).
// The fused node takes the place of the last node of its pattern, where all
// its inputs already exist.
#include <algorithm>
#include <cmath>
#include <map>
#include <optional>
#include <string>
#include <tuple>
#include <vector>

#include "compiler/pass.h"
#include "compiler/rewrite.h"
#include "graph/builder.h"
#include "graph/verify.h"

namespace aspen::compiler {

using graph::Graph;
using graph::Node;
using graph::OpKind;
using graph::ValueId;

namespace {

// The one value of every element of v when v is a constant (or a broadcast of
// one) whose elements are all equal.
std::optional<double> uniform(const Graph& g, ValueId v) {
  const Node* n = &g.producer(v);
  if (n->op == OpKind::broadcast) n = &g.producer(n->inputs[0]);
  if (n->op != OpKind::constant || !n->constant || n->constant->numel() == 0) return std::nullopt;
  const Tensor& t = *n->constant;
  if (t.dtype() != DType::f32) return std::nullopt;
  const std::span<const float> x = t.span<float>();
  for (float e : x)
    if (e != x[0]) return std::nullopt;
  return double(x[0]);
}

bool near(double a, double b) { return std::abs(a - b) <= 1e-5 * std::abs(b); }

// v as a product: its factors that are not uniform constants (through nested
// mul, scale, div by a constant and neg), and the product of the constants.
struct Product {
  std::vector<ValueId> factors;
  double constant = 1.0;
};
void collect(const Graph& g, ValueId v, Product& p, int depth) {
  const Node& n = g.producer(v);
  if (depth < 8) {
    if (n.op == OpKind::mul) {
      for (ValueId in : n.inputs)
        if (std::optional<double> c = uniform(g, in); c && g.type(in) == g.type(v)) {
          p.constant *= *c;
        } else {
          collect(g, in, p, depth + 1);
        }
      return;
    }
    if (n.op == OpKind::scale) {
      p.constant *= n.attrs.f("alpha");
      collect(g, n.inputs[0], p, depth + 1);
      return;
    }
    if (n.op == OpKind::neg) {
      p.constant = -p.constant;
      collect(g, n.inputs[0], p, depth + 1);
      return;
    }
    if (n.op == OpKind::div)
      if (std::optional<double> c = uniform(g, n.inputs[1]); c && *c != 0) {
        p.constant /= *c;
        collect(g, n.inputs[0], p, depth + 1);
        return;
      }
  }
  p.factors.push_back(v);
}
Product product(const Graph& g, ValueId v) {
  Product p;
  collect(g, v, p, 0);
  return p;
}

// x when v is x times `c` (a single factor, the constants multiplying to c).
ValueId times(const Graph& g, ValueId v, double c) {
  const Product p = product(g, v);
  return p.factors.size() == 1 && near(p.constant, c) ? p.factors[0] : ValueId{};
}

// The x of 1 + f(...) where f is tanh or erf as in GELU, given x; else false.
bool gelu_inner(const Graph& g, ValueId one_plus, ValueId x, bool& tanh_form) {
  const Node& a = g.producer(one_plus);
  if (a.op != OpKind::add) return false;
  for (int side = 0; side < 2; ++side) {
    std::optional<double> one = uniform(g, a.inputs[size_t(1 - side)]);
    if (!one || !near(*one, 1.0)) continue;
    const Node& f = g.producer(a.inputs[size_t(side)]);
    if (f.op == OpKind::erf && times(g, f.inputs[0], 1.0 / std::sqrt(2.0)) == x) {
      tanh_form = false;
      return true;
    }
    if (f.op != OpKind::tanh) continue;
    const ValueId inner = times(g, f.inputs[0], std::sqrt(2.0 / M_PI));
    if (!inner.valid() || g.producer(inner).op != OpKind::add) continue;
    const Node& sum = g.producer(inner);
    for (int k = 0; k < 2; ++k) {
      if (sum.inputs[size_t(k)] != x) continue;
      const Product cube = product(g, sum.inputs[size_t(1 - k)]);
      bool all_x = cube.factors.size() == 3;
      for (ValueId c : cube.factors) all_x = all_x && c == x;
      if (all_x && near(cube.constant, 0.044715)) {
        tanh_form = true;
        return true;
      }
    }
  }
  return false;
}

// NOTE [attention in pieces]: what the pattern found.
struct Sdpa {
  ValueId q, k, v;  // k as [B, H, S, D] when k_transposed is false, else kT [B, H, D, S]
  bool k_transposed = true;
  double scale = 1.0;
  std::string mask;
};

// The constant behind v (through one broadcast), or null.
const Tensor* constant_of(const Graph& g, ValueId v) {
  const Node* n = &g.producer(v);
  if (n->op == OpKind::broadcast) n = &g.producer(n->inputs[0]);
  return n->op == OpKind::constant && n->constant && n->constant->dtype() == DType::f32 ? n->constant.get() : nullptr;
}

// "none", "causal" or "" (neither) for an additive mask constant broadcast to [..., T, S]: every [T, S]
// slice of it (an exporter may expand it over the batch) the same kind.
std::string mask_kind(const Tensor& m, int64_t T, int64_t S) {
  const Shape& sh = m.shape();
  const int r = sh.rank();
  const int64_t rows = r >= 2 ? sh[r - 2] : 1, cols = r >= 1 ? sh[r - 1] : 1;
  if ((rows != 1 && rows != T) || (cols != 1 && cols != S) || rows * cols == 0) return "";
  const std::span<const float> x = m.span<float>();
  bool zeros = true, causal = T == S;
  for (size_t base = 0; base < x.size(); base += size_t(rows * cols))
    for (int64_t i = 0; i < T; ++i)
      for (int64_t j = 0; j < S; ++j) {
        const float e = x[base + size_t((rows == 1 ? 0 : i) * cols + (cols == 1 ? 0 : j))];
        zeros = zeros && e == 0.0f;
        causal = causal && (j <= i ? e == 0.0f : e <= -1e30f);
      }
  return zeros ? "none" : causal ? "causal" : "";
}

std::optional<Sdpa> match_sdpa(const Graph& g, const Node& out, const std::vector<int>& users) {
  auto only = [&](ValueId v, int n) { return users[size_t(v.index)] == n; };
  auto is = [&](ValueId v, OpKind op) { return g.producer(v).op == op; };
  auto flag = [](const Node& n, const char* name) { return n.attrs.has(name) && n.attrs.i(name) != 0; };
  if (out.op != OpKind::matmul || out.inputs.size() != 2 || flag(out, "trans_a") || flag(out, "trans_b"))
    return std::nullopt;
  const ValueId v = out.inputs[1];
  ValueId p = out.inputs[0];
  const graph::TensorType& vt = g.type(v);
  if (vt.dtype != DType::f32 || vt.shape.rank() != 4 || g.type(p).shape.rank() != 4) return std::nullopt;
  if (is(p, OpKind::where) && only(p, 1)) {  // where(is_nan(x), 0, x)
    const Node& w = g.producer(p);
    const std::optional<double> zero = uniform(g, w.inputs[1]);
    if (!is(w.inputs[0], OpKind::is_nan) || !zero || *zero != 0.0 || g.producer(w.inputs[0]).inputs[0] != w.inputs[2] ||
        !only(w.inputs[0], 1) || !only(w.inputs[2], 2))
      return std::nullopt;
    p = w.inputs[2];
  } else if (!only(p, 1)) {
    return std::nullopt;
  }
  if (!is(p, OpKind::softmax)) return std::nullopt;
  ValueId s = g.producer(p).inputs[0];
  if (!only(s, 1)) return std::nullopt;
  const graph::TensorType& st = g.type(s);
  const int64_t T = st.shape[2], S = st.shape[3];
  Sdpa m;
  m.mask = "none";
  if (is(s, OpKind::add)) {
    const Node& add = g.producer(s);
    int side = constant_of(g, add.inputs[1]) ? 1 : constant_of(g, add.inputs[0]) ? 0 : -1;
    if (side < 0) return std::nullopt;
    m.mask = mask_kind(*constant_of(g, add.inputs[size_t(side)]), T, S);
    if (m.mask.empty()) return std::nullopt;
    s = add.inputs[size_t(1 - side)];
    if (!only(s, 1)) return std::nullopt;
  }
  if (!is(s, OpKind::matmul)) return std::nullopt;
  const Node& mm = g.producer(s);
  if (mm.inputs.size() != 2 || flag(mm, "trans_a")) return std::nullopt;
  m.k_transposed = !flag(mm, "trans_b");
  const Product a = product(g, mm.inputs[0]), b = product(g, mm.inputs[1]);
  if (a.factors.size() != 1 || b.factors.size() != 1) return std::nullopt;
  m.q = a.factors[0];
  m.k = b.factors[0];
  m.v = v;
  m.scale = a.constant * b.constant;
  const Shape& qs = g.type(m.q).shape;
  const Shape& ks = g.type(m.k).shape;
  const int64_t B = qs[0], H = qs[1], D = qs.rank() == 4 ? qs[3] : -1;
  const Shape want_k = m.k_transposed ? Shape{B, H, D, S} : Shape{B, H, S, D};
  if (qs.rank() != 4 || qs != Shape{B, H, T, D} || ks != want_k || vt.shape != Shape{B, H, S, D} ||
      g.type(m.q).dtype != DType::f32 || g.type(m.k).dtype != DType::f32)
    return std::nullopt;
  return m;
}

// NOTE [bernoulli dropout]: torch's in-place Dropout exported in training mode is a bernoulli mask,
//   mul(x, div(cast(less(random_uniform(like, seed) {low 0, high 1}, keep)), keep))
// with keep a uniform constant (1 - the dropout ratio), the mask's pieces used nowhere else: that is
// dropout(x, seed) {ratio 1 - keep, the draw's stream}, which keeps the same share of elements (its own
// draws), recomputes its mask in backward instead of keeping it, and is the identity for a negative seed
// (validation), where the draws themselves would be refused. Returns the dropout node, inputs unmapped, and
// adds the pieces' nodes (random_uniform, less, cast, div) to `pieces` (they are left out of the graph).
std::optional<Node> match_bernoulli_dropout(const Graph& g, const Node& mul, const std::vector<int>& users,
                                            std::vector<int32_t>& pieces) {
  if (mul.op != OpKind::mul) return std::nullopt;
  for (int side = 0; side < 2; ++side) {
    const ValueId x = mul.inputs[size_t(side)], m = mul.inputs[size_t(1 - side)];
    if (g.type(x) != g.type(mul.outputs[0]) || users[size_t(m.index)] != 1) continue;
    const Node& div = g.producer(m);
    if (div.op != OpKind::div) continue;
    const std::optional<double> keep = uniform(g, div.inputs[1]);
    const Node& cast = g.producer(div.inputs[0]);
    if (!keep || cast.op != OpKind::cast || users[size_t(div.inputs[0].index)] != 1) continue;
    const Node& less = g.producer(cast.inputs[0]);
    if (less.op != OpKind::less || users[size_t(cast.inputs[0].index)] != 1) continue;
    const std::optional<double> keep2 = uniform(g, less.inputs[1]);
    const Node& draw = g.producer(less.inputs[0]);
    if (!keep2 || !near(*keep2, *keep) || draw.op != OpKind::random_uniform ||
        users[size_t(less.inputs[0].index)] != 1 || draw.attrs.f("low") != 0.0 || draw.attrs.f("high") != 1.0)
      continue;
    if (!(*keep > 0.0 && *keep <= 1.0)) continue;
    for (ValueId v : {less.inputs[0], cast.inputs[0], div.inputs[0], m}) pieces.push_back(g.value(v).producer);
    Node d;
    d.op = OpKind::dropout;
    d.inputs = {x, draw.inputs[1]};
    d.attrs.set("ratio", 1.0 - *keep);
    d.attrs.set("stream", draw.attrs.i_or("stream", 0));
    return d;
  }
  return std::nullopt;
}

}  // namespace

// The rewrites before the fusions (see the top of the file).
Status simplify_exported_patterns(Graph& g) {
  Rewrite rw(g);
  bool changed = false;
  std::vector<int> users(size_t(g.num_values()), 0);
  for (const Node& n : g.nodes())
    for (ValueId v : n.inputs) ++users[size_t(v.index)];
  for (ValueId v : g.roots()) ++users[size_t(v.index)];
  // NOTE [bernoulli dropout]: the masks found first, so that their pieces (before the product) are left out.
  std::map<int32_t, Node> dropouts;
  std::vector<char> left_out(g.nodes().size(), 0);
  for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
    std::vector<int32_t> pieces;
    if (std::optional<Node> d = match_bernoulli_dropout(g, g.node(i), users, pieces)) {
      dropouts.emplace(i, std::move(*d));
      for (int32_t k : pieces) left_out[size_t(k)] = 1;
    }
  }
  for (int32_t i = 0; i < int32_t(g.nodes().size()); ++i) {
    const Node& node = g.node(i);
    if (left_out[size_t(i)]) {
      changed = true;
      continue;
    }
    if (std::optional<Sdpa> m = match_sdpa(g, node, users)) {  // NOTE [attention in pieces]
      ValueId k = rw.map(m->k);
      if (m->k_transposed) {
        Node t;
        t.op = OpKind::transpose;
        t.inputs = {k};
        t.attrs.set("perm", std::vector<int64_t>{0, 1, 3, 2});
        t.stage = node.stage;
        t.scope = node.scope;
        const Shape& kt = g.type(m->k).shape;
        k = rw.emit(std::move(t), {graph::TensorType{DType::f32, Shape{kt[0], kt[1], kt[3], kt[2]}}}, {}).outputs[0];
      }
      Node a;
      a.op = OpKind::attention;
      a.inputs = {rw.map(m->q), k, rw.map(m->v)};
      a.attrs.set("scale", m->scale);
      a.attrs.set("mask", m->mask);
      a.stage = node.stage;
      a.scope = node.scope;
      const Shape& os = g.type(node.outputs[0]).shape;
      rw.emit(std::move(a), {g.type(node.outputs[0]), graph::TensorType{DType::f32, Shape{os[0], os[1], os[2]}}},
              node.outputs);
      changed = true;
      continue;
    }
    std::optional<Node> with;
    if (auto d = dropouts.find(i); d != dropouts.end()) with = d->second;
    if (!with && node.op == OpKind::mul && g.type(node.outputs[0]).dtype == DType::f32) {
      const Product p = product(g, node.outputs[0]);
      bool tanh_form = false;
      if (p.factors.size() == 2 && near(p.constant, 0.5)) {
        for (int k = 0; k < 2 && !with; ++k)
          if (g.type(p.factors[size_t(k)]) == g.type(node.outputs[0]) &&
              gelu_inner(g, p.factors[size_t(1 - k)], p.factors[size_t(k)], tanh_form)) {
            Node gelu;
            gelu.op = OpKind::gelu;
            gelu.inputs = {p.factors[size_t(k)]};
            gelu.attrs.set("tanh", int64_t(tanh_form));
            with = std::move(gelu);
          }
      }
      for (int side = 0; side < 2 && !with; ++side)
        if (std::optional<double> c = uniform(g, node.inputs[size_t(1 - side)]);
            c && g.type(node.inputs[size_t(side)]) == g.type(node.outputs[0])) {
          Node scale;
          scale.op = OpKind::scale;
          scale.inputs = {node.inputs[size_t(side)]};
          scale.attrs.set("alpha", *c);
          with = std::move(scale);
        }
    }
    Node n = with ? *with : node;
    n.stage = node.stage;
    n.scope = node.scope;
    n.backward = node.backward;
    for (ValueId& v : n.inputs) v = rw.map(v);
    std::vector<graph::TensorType> types;
    for (ValueId v : node.outputs) types.push_back(g.type(v));
    rw.emit(std::move(n), types, node.outputs);
    changed = changed || with.has_value();
  }
  if (changed) g = std::move(rw).finish();
  return Status();
}

namespace {

Status group_matmuls(Graph& g);  // NOTE [matmul groups]

class Fusion : public Pass {
 public:
  const char* name() const override { return "fusion"; }

  Status run(Graph& g, const CompileContext&) override {
    ASPEN_RETURN_IF_ERROR(simplify_exported_patterns(g));
    const int32_t n = int32_t(g.nodes().size());
    std::vector<std::vector<int32_t>> users(size_t(g.num_values()));
    for (int32_t i = 0; i < n; ++i)
      for (ValueId v : g.node(i).inputs) users[size_t(v.index)].push_back(i);
    std::vector<int32_t> is_output(size_t(g.num_values()), 0);
    for (ValueId v : g.roots()) is_output[size_t(v.index)] = 1;
    auto sole_user = [&](ValueId v) { return users[size_t(v.index)].size() == 1 && !is_output[size_t(v.index)]; };
    // A broadcast of a vector [last dim of `like`]: its source, else invalid.
    auto bias_of = [&](ValueId v, ValueId like) -> ValueId {
      const Node& b = g.producer(v);
      if (b.op != OpKind::broadcast) return {};
      const graph::TensorType& src = g.type(b.inputs[0]);
      const graph::TensorType& t = g.type(like);
      if (t.shape.rank() < 1 || src.shape != Shape{t.shape[-1]} || src.dtype != t.dtype) return {};
      return b.inputs[0];
    };

    std::vector<char> skip(size_t(n), 0);
    struct Emit {
      Node node;                         // inputs are values of the old graph
      std::vector<ValueId> old_outputs;  // old values its outputs stand for
    };
    std::map<int32_t, Emit> emit;

    for (int32_t i = 0; i < n; ++i) {
      const Node& node = g.node(i);
      if (node.op == OpKind::add) {  // matmul + bias
        for (int side = 0; side < 2; ++side) {
          const ValueId mm = node.inputs[size_t(side)], other = node.inputs[size_t(1 - side)];
          const int32_t mi = g.value(mm).producer;
          const Node& m = g.node(mi);
          if (m.op != OpKind::matmul || m.inputs.size() != 2 || skip[size_t(mi)] || !sole_user(mm)) continue;
          const ValueId bias = bias_of(other, mm);
          if (!bias.valid()) continue;
          Node fused = m;
          fused.inputs.push_back(bias);
          skip[size_t(mi)] = 1;
          skip[size_t(i)] = 1;
          emit[i] = Emit{std::move(fused), {node.outputs[0]}};
          break;
        }
      } else if (node.op == OpKind::gelu) {  // bias + gelu
        const ValueId sum = node.inputs[0];
        const int32_t ai = g.value(sum).producer;
        const Node& a = g.node(ai);
        if (a.op != OpKind::add || skip[size_t(ai)] || !sole_user(sum)) continue;
        for (int side = 0; side < 2; ++side) {
          const ValueId bias = bias_of(a.inputs[size_t(1 - side)], a.inputs[size_t(side)]);
          if (!bias.valid()) continue;
          Node fused;
          fused.op = OpKind::bias_gelu;
          fused.stage = node.stage;
          fused.scope = node.scope;
          fused.inputs = {a.inputs[size_t(side)], bias};
          fused.attrs.set("tanh", node.attrs.i_or("tanh", 1));
          skip[size_t(ai)] = 1;
          skip[size_t(i)] = 1;
          emit[i] = Emit{std::move(fused), {node.outputs[0]}};
          break;
        }
      } else if (node.op == OpKind::layernorm) {  // residual add + layernorm
        const ValueId sum = node.inputs[0];
        const int32_t ai = g.value(sum).producer;
        const Node& a = g.node(ai);
        if (a.op != OpKind::add || skip[size_t(ai)]) continue;
        bool later = true;
        for (int32_t u : users[size_t(sum.index)]) later = later && u >= i;
        if (!later) continue;
        Node fused;
        fused.op = OpKind::add_layernorm;
        fused.stage = node.stage;
        fused.scope = node.scope;
        fused.inputs = {a.inputs[0], a.inputs[1], node.inputs[1], node.inputs[2]};
        fused.attrs.set("eps", node.attrs.f("eps"));
        skip[size_t(ai)] = 1;
        skip[size_t(i)] = 1;
        emit[i] = Emit{std::move(fused), {sum, node.outputs[0], node.outputs[1], node.outputs[2]}};
      }
    }
    if (emit.empty()) return group_matmuls(g);

    Rewrite rw(g);
    for (int32_t i = 0; i < n; ++i) {
      auto e = emit.find(i);
      if (skip[size_t(i)] && e == emit.end()) continue;
      Node node = e != emit.end() ? e->second.node : g.node(i);
      const std::vector<ValueId> old_outputs = e != emit.end() ? e->second.old_outputs : g.node(i).outputs;
      for (ValueId& v : node.inputs) v = rw.map(v);
      auto types = graph::check_node(rw.out(), node);
      if (!types.is_ok()) return types.status().with_context("fusing at node " + std::to_string(i));
      rw.emit(std::move(node), *types, old_outputs);
    }
    g = std::move(rw).finish();
    return group_matmuls(g);
  }
};

}  // namespace

namespace {

// NOTE [matmul groups].
Status group_matmuls(Graph& g) {
  constexpr int64_t kMaxRows = 8;  // graph/ops_nn.cc's kGemvMaxRows: the products the GEMV takes
  constexpr size_t kMaxGroup = 16;
  const int32_t n = int32_t(g.nodes().size());
  std::vector<int32_t> first_use(size_t(g.num_values()), n);
  for (int32_t i = n - 1; i >= 0; --i)
    for (ValueId v : g.node(i).inputs) first_use[size_t(v.index)] = i;
  // (a, bias or not, op, weight type or block format, K, stage) -> the products in graph order
  std::map<std::tuple<int32_t, size_t, int, std::string, int64_t, int32_t>, std::vector<int32_t>> candidates;
  for (int32_t i = 0; i < n; ++i) {
    const Node& m = g.node(i);
    if ((m.op != OpKind::matmul && m.op != OpKind::matmul_q) || m.inputs.size() < 2) continue;
    const graph::TensorType &a = g.type(m.inputs[0]), &b = g.type(m.inputs[1]);
    if (a.dtype != DType::f32 || a.shape.rank() < 1 || a.shape[-1] < 1 || a.shape.numel() / a.shape[-1] > kMaxRows ||
        b.shape.rank() != 2 || g.type(m.outputs[0]).dtype != DType::f32)
      continue;
    std::string weights;
    if (m.op == OpKind::matmul) {
      if (m.attrs.i_or("trans_a", 0) != 0 || m.attrs.i_or("trans_b", 0) != 1 || m.attrs.has("out_dtype") ||
          b.shape[1] != a.shape[-1])
        continue;
      weights = dtype_name(b.dtype);
    } else {  // matmul_q: its checks passed when it was built; the format and k must match
      weights = m.attrs.s("format");
    }
    candidates[{m.inputs[0].index, m.inputs.size(), int(m.op), weights, a.shape[-1], m.stage}].push_back(i);
  }
  std::vector<std::vector<int32_t>> groups;
  for (const auto& [key, members] : candidates)
    for (size_t c = 0; c + 1 < members.size(); c += kMaxGroup)
      groups.emplace_back(members.begin() + long(c), members.begin() + long(std::min(members.size(), c + kMaxGroup)));
  std::vector<int32_t> place(size_t(n), -1);  // the group emitted at node i
  std::vector<char> skip(size_t(n), 0);
  for (size_t k = 0; k < groups.size(); ++k) {
    const std::vector<int32_t>& members = groups[k];
    if (members.size() < 2) continue;
    const int32_t first = members.front(), last = members.back();
    bool at_first = true, at_last = true;
    for (int32_t i : members) {
      for (size_t j = 1; j < g.node(i).inputs.size(); ++j) {
        const int32_t p = g.value(g.node(i).inputs[j]).producer;
        at_first = at_first && (p < first || graph::op_has(g.node(p).op, graph::kSource));  // sources move up
      }
      at_last = at_last && first_use[size_t(g.node(i).outputs[0].index)] > last;
    }
    if (!at_first && !at_last) continue;
    for (int32_t i : members) skip[size_t(i)] = 1;
    place[size_t(at_first ? first : last)] = int32_t(k);
  }
  if (std::all_of(place.begin(), place.end(), [](int32_t p) { return p < 0; })) return Status();

  Rewrite rw(g);
  for (int32_t i = 0; i < n; ++i) {
    if (place[size_t(i)] >= 0) {
      const std::vector<int32_t>& members = groups[size_t(place[size_t(i)])];
      const Node& m0 = g.node(members[0]);
      Node group;
      group.op = OpKind::matmul_group;
      group.stage = m0.stage;
      group.scope = m0.scope;  // the members' common scope ("h.3.attn" of q_proj, k_proj and v_proj)
      for (int32_t mi : members) group.scope = graph::common_scope(group.scope, g.node(mi).scope);
      group.attrs.set("op", int64_t(m0.op));
      group.attrs.set("bias", int64_t(m0.inputs.size() == 3));
      if (m0.op == OpKind::matmul_q) {
        group.attrs.set("format", m0.attrs.s("format"));
        group.attrs.set("k", m0.attrs.i("k"));
      } else {
        group.attrs.set("trans_b", int64_t(1));
      }
      group.inputs = {rw.map(m0.inputs[0])};
      std::vector<ValueId> old_outputs;
      for (int32_t mi : members) {
        for (size_t j = 1; j < g.node(mi).inputs.size(); ++j) {
          const int32_t p = g.value(g.node(mi).inputs[j]).producer;
          if (p > i && !skip[size_t(p)]) {  // a source (a parameter) made later: made here instead
            rw.copy(p);
            skip[size_t(p)] = 1;
          }
          group.inputs.push_back(rw.map(g.node(mi).inputs[j]));
        }
        old_outputs.push_back(g.node(mi).outputs[0]);
      }
      auto types = graph::check_node(rw.out(), group);
      if (!types.is_ok()) return types.status().with_context("grouping the matmuls at node " + std::to_string(i));
      rw.emit(std::move(group), *types, old_outputs);
    }
    if (!skip[size_t(i)]) rw.copy(i);
  }
  g = std::move(rw).finish();
  return Status();
}

}  // namespace

std::unique_ptr<Pass> make_fusion() { return std::make_unique<Fusion>(); }

}  // namespace aspen::compiler
