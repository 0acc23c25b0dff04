// graph/ops_util.h: helpers for writing op table entries (private to graph/).
#pragma once

#include <span>
#include <string>
#include <vector>

#include "graph/builder.h"
#include "graph/interpreter.h"
#include "graph/op.h"

namespace aspen::graph::opsutil {

inline bool is_int(DType t) { return t == DType::i32 || t == DType::i64 || t == DType::u8; }

// "<op>: <what>: expected E, found F".
inline Status rule_error(const Node& n, const std::string& what, std::string expected, std::string found) {
  return Status::invalid_argument(std::string(op_name(n.op)) + ": " + what, std::move(expected), std::move(found));
}

inline Status expect_float(const Node& n, const char* what, const TensorType& t) {
  if (!is_float(t.dtype)) return rule_error(n, what, "a float type (f32, bf16, f16)", t.to_string());
  return Status();
}

inline Status expect_int(const Node& n, const char* what, const TensorType& t) {
  if (t.dtype != DType::i32 && t.dtype != DType::i64) return rule_error(n, what, "i32 or i64 indices", t.to_string());
  return Status();
}

inline Status expect_same(const Node& n, std::span<const TensorType> in, size_t a, size_t b) {
  if (in[a] != in[b])
    return rule_error(n, "inputs " + std::to_string(a) + " and " + std::to_string(b), "equal types",
                      in[a].to_string() + " and " + in[b].to_string());
  return Status();
}

inline Status expect_rank(const Node& n, const char* what, const TensorType& t, int min_rank, int max_rank = 8) {
  if (t.shape.rank() < min_rank || t.shape.rank() > max_rank)
    return rule_error(n, what,
                      min_rank == max_rank ? "rank " + std::to_string(min_rank)
                                           : "rank " + std::to_string(min_rank) + ".." + std::to_string(max_rank),
                      t.to_string());
  return Status();
}

inline std::vector<int64_t> dims(const Shape& s) { return std::vector<int64_t>(s.begin(), s.end()); }

inline Result<Shape> to_shape(const Node& n, const char* what, const std::vector<int64_t>& d) {
  auto s = Shape::make(d.data(), int(d.size()));
  if (!s.is_ok()) return rule_error(n, what, s.status().expected(), s.status().found());
  return s;
}

// Normalizes a possibly negative axis against `rank`.
inline Result<int> axis_of(const Node& n, const char* what, int64_t axis, int rank) {
  if (axis < -rank || axis >= rank)
    return rule_error(n, what, "an axis in [" + std::to_string(-rank) + ", " + std::to_string(rank) + ")",
                      std::to_string(axis));
  return int(axis < 0 ? axis + rank : axis);
}

// Zeros shaped like v (broadcast of a scalar constant).
inline ValueId zeros_like(Builder& b, ValueId v) {
  const TensorType t = b.type(v);  // a copy: b.scalar() appends values and may move the table
  return b.broadcast(b.scalar(0.0f, t.dtype), dims(t.shape));
}

// A PreparedKernel from a callable `Status(in, out)`; the callable captures
// what was decided at compile time (sizes, attributes, plans). `changed()` is
// what fixed_inputs_changed() does (prepare_fixed kernels; none otherwise).
struct NothingKept {
  void operator()() const {}
};
template <class F, class G = NothingKept>
class FnKernel final : public PreparedKernel {
 public:
  FnKernel(F f, G changed) : f_(std::move(f)), changed_(std::move(changed)) {}
  Status run(std::span<const void* const> in, std::span<void* const> out) override { return f_(in, out); }
  void fixed_inputs_changed() override { changed_(); }

 private:
  F f_;
  G changed_;
};
template <class F, class G = NothingKept>
Result<std::unique_ptr<PreparedKernel>> make_kernel(F f, G changed = {}) {
  return std::unique_ptr<PreparedKernel>(new FnKernel<F, G>(std::move(f), std::move(changed)));
}
// "No fast kernel for these types": lowering falls back to the reference.
inline Result<std::unique_ptr<PreparedKernel>> no_fast_kernel() { return std::unique_ptr<PreparedKernel>(); }

template <class T>
std::span<const T> in_span(std::span<const void* const> in, size_t i, int64_t n) {
  return {static_cast<const T*>(in[i]), size_t(n)};
}
template <class T>
std::span<T> out_span(std::span<void* const> out, size_t i, int64_t n) {
  return {static_cast<T*>(out[i]), size_t(n)};
}

}  // namespace aspen::graph::opsutil
