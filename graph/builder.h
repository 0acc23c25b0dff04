// graph/builder.h: records ops into a Graph; computes nothing.
//
//   Graph g;
//   Builder b(g);
//   ValueId x = b.input("x", DType::f32, Shape{4, 8});
//   ValueId w = b.parameter("fc.weight", DType::f32, Shape{16, 8});
//   ValueId y = b.gelu(b.matmul(x, w, /*trans_a=*/false, /*trans_b=*/true));
//   b.output("y", y);
//   ASPEN_RETURN_IF_ERROR(b.status());
//
// (examples/cpp/graph_session.cc builds, compiles and runs this graph; CI runs it.)
//
// Errors are sticky: the first op whose types do not fit its rule sets
// status() (with the node and the rule, as the verifier words it) and every
// later op returns an invalid ValueId without recording anything. Model code
// stays free of checks after every call and still reports the first mistake.
//
// Stage and checkpoint annotations (`set_stage`, `checkpoint`) mark nodes for
// pipeline placement and recomputation; they do not change meaning.
#pragma once

#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "graph/graph.h"

namespace aspen::graph {

// The scope path a and b share, in whole '.'-separated parts ("h.3.attn.q" and "h.3.attn.k": "h.3.attn").
std::string common_scope(std::string_view a, std::string_view b);

class Builder {
 public:
  explicit Builder(Graph& graph) : g_(graph) {}

  const Status& status() const { return status_; }
  Graph& graph() { return g_; }
  // The reference is valid until the next op is recorded (recording may move
  // the value table): copy it when building more ops with it.
  const TensorType& type(ValueId v) const { return g_.type(v); }

  // Sources.
  ValueId input(std::string name, DType dtype, Shape shape);
  ValueId parameter(std::string name, DType dtype, Shape shape);
  ValueId constant(Tensor value);
  ValueId scalar(float value, DType dtype = DType::f32);  // a rank-0 constant
  void output(std::string name, ValueId v);
  // After each step, the parameter `param` (a value made by parameter())
  // holds `value`, of the same type (Graph::add_update).
  void update(ValueId param, ValueId value);

  // Any op, by kind: the general form every helper below uses.
  std::vector<ValueId> op(OpKind kind, std::vector<ValueId> inputs, Attrs attrs = {});
  ValueId op1(OpKind kind, std::vector<ValueId> inputs, Attrs attrs = {});

  // Elementwise (same shapes; use broadcast() to expand).
  ValueId add(ValueId a, ValueId b) { return op1(OpKind::add, {a, b}); }
  ValueId sub(ValueId a, ValueId b) { return op1(OpKind::sub, {a, b}); }
  ValueId mul(ValueId a, ValueId b) { return op1(OpKind::mul, {a, b}); }
  ValueId scale(ValueId x, double alpha) { return op1(OpKind::scale, {x}, {{"alpha", alpha}}); }
  ValueId neg(ValueId x) { return op1(OpKind::neg, {x}); }
  ValueId exp(ValueId x) { return op1(OpKind::exp, {x}); }
  ValueId tanh(ValueId x) { return op1(OpKind::tanh, {x}); }
  ValueId sqrt(ValueId x) { return op1(OpKind::sqrt, {x}); }
  ValueId div(ValueId a, ValueId b) { return op1(OpKind::div, {a, b}); }
  ValueId gelu(ValueId x, bool tanh_form = true) { return op1(OpKind::gelu, {x}, {{"tanh", int64_t(tanh_form)}}); }
  ValueId silu(ValueId x) { return op1(OpKind::silu, {x}); }
  ValueId where(ValueId cond, ValueId a, ValueId b) { return op1(OpKind::where, {cond, a, b}); }
  ValueId cast(ValueId x, DType to) { return op1(OpKind::cast, {x}, {{"dtype", int64_t(to)}}); }

  // a [..., M, K] x b [K, N] (transposes by flag; graph/ops_matmul.cc).
  ValueId matmul(ValueId a, ValueId b, bool trans_a = false, bool trans_b = false) {
    return op1(OpKind::matmul, {a, b}, {{"trans_a", int64_t(trans_a)}, {"trans_b", int64_t(trans_b)}});
  }

  // Shape.
  ValueId reshape(ValueId x, std::vector<int64_t> shape) { return op1(OpKind::reshape, {x}, {{"shape", shape}}); }
  // NOTE [unit-axis transposes]: a permutation that moves only axes of extent 1 is made a reshape.
  ValueId transpose(ValueId x, std::vector<int64_t> perm);
  ValueId slice(ValueId x, int64_t axis, int64_t begin, int64_t end) {
    return op1(OpKind::slice, {x}, {{"axis", axis}, {"begin", begin}, {"end", end}});
  }
  ValueId concat(std::vector<ValueId> xs, int64_t axis) { return op1(OpKind::concat, std::move(xs), {{"axis", axis}}); }
  // Numpy-style: x's dimensions align with the trailing ones of `shape`; each is equal or 1.
  ValueId broadcast(ValueId x, std::vector<int64_t> shape) { return op1(OpKind::broadcast, {x}, {{"shape", shape}}); }
  ValueId reduce_sum(ValueId x, std::vector<int64_t> axes, bool keepdims = false) {
    return op1(OpKind::reduce_sum, {x}, {{"axes", axes}, {"keepdims", int64_t(keepdims)}});
  }
  ValueId reduce_max(ValueId x, std::vector<int64_t> axes, bool keepdims = false) {
    return op1(OpKind::reduce_max, {x}, {{"axes", axes}, {"keepdims", int64_t(keepdims)}});
  }
  // table [V, C], ids (i32) [...] -> [..., C].
  ValueId gather(ValueId table, ValueId ids) { return op1(OpKind::gather, {table, ids}); }

  // Annotations.
  // NOTE [name scopes]: nodes recorded while a Scope lives carry its path (Node::scope, "h.3.attn": scopes
  // nest, joined by '.'), so that profiles can group time and FLOPs by model layer. Compiler passes and
  // autodiff hand a node's scope to what they make of it (a gradient: its forward node's).
  // Models name scopes after their parameters' module paths, so that a layer's time and its weights share a
  // name (`Scope::at`: the whole path, whatever the scope around it).
  //   { Builder::Scope layer(b, "h." + std::to_string(i)); ... }
  //   { auto fc = Builder::Scope::at(b, "transformer.h.3.mlp.c_fc"); ... }
  class Scope {
   public:
    Scope(Builder& b, std::string_view name) : b_(b), saved_(b.scope_) {
      if (!b.scope_.empty() && !name.empty()) b.scope_ += '.';
      b.scope_ += name;
    }
    static Scope at(Builder& b, std::string_view path) { return Scope(b, path, 0); }
    ~Scope() { b_.scope_ = std::move(saved_); }
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    Scope(Builder& b, std::string_view path, int) : b_(b), saved_(b.scope_) { b.scope_ = path; }
    Builder& b_;
    std::string saved_;
  };
  const std::string& scope() const { return scope_; }
  void set_scope(std::string scope) { scope_ = std::move(scope); }
  void set_stage(int32_t stage) { stage_ = stage; }
  // Nodes recorded while set mark themselves as backward (autodiff sets it).
  void set_backward(bool on) { backward_ = on; }
  int32_t stage() const { return stage_; }
  // Marks the producer of v as the end of a recomputation segment.
  void checkpoint(ValueId v);

 private:
  ValueId source(OpKind kind, std::string name, TensorType type, std::shared_ptr<const Tensor> data);

  Graph& g_;
  Status status_;
  int32_t stage_ = -1;
  bool backward_ = false;
  std::string scope_;
};

}  // namespace aspen::graph
