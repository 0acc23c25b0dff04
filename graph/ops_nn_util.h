// graph/ops_nn_util.h: helpers shared by the neural-network op groups
// (ops_nn.cc, ops_matmul.cc, ops_attention.cc, ops_fused.cc); private to graph/.
#pragma once

#include <cmath>
#include <initializer_list>
#include <cstddef>
#include <memory>
#include <mutex>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/weight_copies.h"
#include "graph/ops_util.h"
#include "kernels/gemv.h"

namespace aspen::kernels {
struct QuantFormat;
}

namespace aspen::graph::nnutil {

using namespace opsutil;
using Grads = Result<std::vector<std::optional<ValueId>>>;
using OutGrads = std::span<const std::optional<ValueId>>;
using Ins = std::span<const HostArray* const>;
using Outs = std::span<HostArray>;

// The dtype of saved statistics (mean, rstd, lse).
inline constexpr DType kStat = DType::f32;

inline std::string str(int64_t v) { return std::to_string(v); }

inline Status expect_type(const Node& n, const std::string& what, const TensorType& t, const TensorType& want,
                          const std::string& why) {
  if (t == want) return Status();
  return rule_error(n, what, want.to_string() + " (" + why + ")", t.to_string());
}

inline Status expect_dtype(const Node& n, const char* what, const TensorType& t, DType want, const char* whose) {
  if (t.dtype == want) return Status();
  return rule_error(n, what, std::string(dtype_name(want)) + " (" + whose + " dtype)", t.to_string());
}

inline Result<bool> flag(const Node& n, const char* name) {
  const int64_t v = n.attrs.i_or(name, 0);
  if (v != 0 && v != 1) return rule_error(n, name, "0 or 1", str(v));
  return v == 1;
}

inline Shape drop_last(const Shape& s) { return *Shape::make(s.begin(), s.rank() - 1); }

// x [..., C], float, C >= 1. Returns C.
inline Result<int64_t> last_axis(const Node& n, const char* what, const TensorType& x) {
  ASPEN_RETURN_IF_ERROR(expect_float(n, what, x));
  ASPEN_RETURN_IF_ERROR(expect_rank(n, what, x, 1));
  if (x.shape[-1] < 1) return rule_error(n, std::string(what) + ": last dimension", ">= 1", x.to_string());
  return x.shape[-1];
}

inline int64_t rows_of(const Shape& s) { return s[-1] == 0 ? 0 : s.numel() / s[-1]; }

inline Status expect_eps(const Node& n) {
  const double eps = n.attrs.f("eps");
  if (!std::isfinite(eps) || eps < 0) return rule_error(n, "eps", "a finite number >= 0", std::to_string(eps));
  return Status();
}

// Gradients reaching any output but the first are not supported.
inline Status first_output_only(const Node& n, OutGrads g, std::initializer_list<const char*> names) {
  const char* const* name = names.begin();
  for (size_t i = 1; i < g.size(); ++i)
    if (g[i])
      return Status::error(
          Code::kUnimplemented,
          std::string(op_name(n.op)) + ": gradient of output " + std::to_string(i) + " (" + name[i] + ")",
          std::string("none (only output 0, ") + name[0] + ", is differentiated)", "one");
  return Status();
}

inline std::vector<std::optional<ValueId>> no_grads(const Node& n) {
  return std::vector<std::optional<ValueId>>(n.inputs.size());
}

// ---- fast kernels: f32 only; other float types fall back to the reference.
using Prepared = Result<std::unique_ptr<PreparedKernel>>;
using In = std::span<const void* const>;
using Out = std::span<void* const>;
using Types = std::span<const TensorType>;

// Every float value (in or out) is f32; integer and mask inputs are checked by each prepare.
inline bool floats_are_f32(Types in, Types out) {
  for (const auto& t : in)
    if (is_float(t.dtype) && t.dtype != DType::f32) return false;
  for (const auto& t : out)
    if (is_float(t.dtype) && t.dtype != DType::f32) return false;
  return true;
}

inline const float* f32_in(In i, size_t k) { return static_cast<const float*>(i[k]); }

// A fixed weight in a kernel's own layout (the quantized products' and the bf16 decode row's packing), made by
// `pack(w, out)` on the first run after it was (re)bound and again after changed() (fixed_inputs_changed).
class PackedWeights {
 public:
  explicit PackedWeights(size_t bytes) : bytes_(bytes) {}
  ~PackedWeights() { count_kernel_copy_bytes(-int64_t(packed_.size())); }
  PackedWeights(const PackedWeights&) = delete;
  PackedWeights& operator=(const PackedWeights&) = delete;
  template <class Pack>
  const void* of(const void* w, Pack pack) {
    std::lock_guard<std::mutex> lock(mu_);
    if (!ready_) {
      if (packed_.size() != bytes_) count_kernel_copy_bytes(int64_t(bytes_) - int64_t(packed_.size()));
      packed_.resize(bytes_);
      pack(w, packed_.data());
      ready_ = true;
    }
    return packed_.data();
  }
  void changed() {
    std::lock_guard<std::mutex> lock(mu_);
    ready_ = false;
  }

 private:
  size_t bytes_;
  std::mutex mu_;
  bool ready_ = false;
  std::vector<std::byte> packed_;
};

}  // namespace aspen::graph::nnutil

namespace aspen::graph {
// NOTE [gemv route] (ops_matmul.cc): the kernels/gemv.h product a matmul node with these types runs as, if it
// goes there (f32 out, a few rows of a, a weight shared by the batch).
std::optional<kernels::GemvShape> matmul_gemv_route(const Node& n, std::span<const TensorType> in,
                                                    std::span<const TensorType> out);
// a as that product reads it: a itself, or rounded to bf16 into the matmul's scratch (g.x_bf16: NOTE [mixed
// matmul]), valid until the calling thread's next matmul.
const float* gemv_rows_of(const kernels::GemvShape& g, const float* a);
// Valid blocks of `format` for N rows of K values (ops_quant.cc; the samples of the ops that take them): random
// bytes (the quants, Q4_K's 6-bit scales) with each block's f16 scales set to moderate values (random bytes
// there would be infinities and NaNs).
std::vector<double> random_quant_blocks(const kernels::QuantFormat& format, int64_t N, int64_t K, uint64_t seed);
}  // namespace aspen::graph
