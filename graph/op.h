// graph/op.h: the op list and the op table.
//
// ASPEN_OPS is the one list of ops, grouped by kind. Each op has one OpInfo
// entry (its name, input count, attribute schema, shape/type rule, gradient
// rule, reference kernel and fast kernel), defined in the ops_<group>.cc file
// of its group.
// Adding an op: add it to this list, write its entry in its group's file,
// and its kernel in kernels/; nothing else changes (see docs/graph.md).
//
// OpKind values are written into serialized executables: append, never
// renumber (the list order is the numbering).
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "graph/types.h"

// clang-format off
#define ASPEN_OPS(X)                                                                      \
  /* sources: no inputs */                                                                \
  X(input) X(parameter) X(constant)                                                       \
  /* elementwise, same shapes in and out */                                               \
  X(add) X(sub) X(mul) X(scale) X(neg) X(exp) X(gelu) X(silu) X(where) X(cast)            \
  /* shape: data moves, values do not change */                                         \
  X(reshape) X(transpose) X(slice) X(concat) X(broadcast)                                 \
  /* reductions over trailing or chosen axes */                                           \
  X(reduce_sum) X(reduce_max)                                                             \
  /* indexing */                                                                          \
  X(gather)                                                                               \
  /* neural-network blocks, each a kernel of kernels/ */                                  \
  X(matmul) X(layernorm) X(rmsnorm) X(softmax) X(cross_entropy) X(rotary) X(attention)    \
  /* backward-only ops emitted by gradient rules (not differentiated again) */            \
  X(gelu_grad) X(silu_grad) X(gather_grad) X(layernorm_grad) X(rmsnorm_grad)              \
  X(softmax_grad) X(cross_entropy_grad) X(attention_grad)                                 \
  /* collectives: run on the communicator of their group (runtime::Session) */           \
  X(all_reduce) X(reduce_scatter) X(all_gather) X(send) X(recv)                          \
  /* fused: made by the compiler's fusion pass after autodiff (not differentiated) */     \
  X(bias_gelu) X(add_layernorm)                                                           \
  /* optimizer steps (graph/ops_optim.cc): outputs feed Builder::update, not differentiated */ \
  X(adamw)                                                                                \
  /* state writes at run-time positions (graph/ops_state.cc): KV caches, generation state */ \
  X(write_slice)                                                                          \
  /* generation: draws token ids inside the program (graph/ops_sampling.cc; not differentiated) */ \
  X(sample)                                                                               \
  /* elementwise, appended later (same shapes in and out; ops_elementwise.cc) */          \
  X(tanh) X(sqrt) X(div)                                                                  \
  /* optimizers appended later (ops_optim.cc), and the sum of squares clipping reads */    \
  X(sgd) X(lamb) X(sum_squares)                                                          \
  /* the vocab-parallel cross-entropy's pieces (ops_vocab.cc; tensor-parallel models) */  \
  X(vocab_ce_stats) X(vocab_ce_loss) X(vocab_ce_grad)
// clang-format on

namespace aspen::graph {

enum class OpKind : uint16_t {
#define ASPEN_OP_ENUM(name) name,
  ASPEN_OPS(ASPEN_OP_ENUM)
#undef ASPEN_OP_ENUM
};

inline constexpr int kNumOps = 0
#define ASPEN_OP_COUNT(name) +1
    ASPEN_OPS(ASPEN_OP_COUNT)
#undef ASPEN_OP_COUNT
    ;

class Graph;
class Builder;
struct Node;
struct HostArray;

enum class AttrKind { i64, f64, str, ints };
struct AttrSpec {
  const char* name;
  AttrKind kind;
  bool required;
};

// out[i] receives the type of output i. `in` are the input types.
using InferFn = Status (*)(const Node& node, std::span<const TensorType> in, std::vector<TensorType>& out);
// Emits the gradient of the node's inputs, given the gradients of its outputs
// (nullopt: that output does not reach the loss). Returns one entry per input
// (nullopt: no gradient flows to it, e.g. an index input).
using GradFn = Result<std::vector<std::optional<ValueId>>> (*)(Builder& b, const Node& node,
                                                                std::span<const std::optional<ValueId>> out_grads);
// The reference kernel: computes outputs from inputs in f64 (see interpreter.h).
using EvalFn = Status (*)(const Node& node, std::span<const HostArray* const> in, std::span<HostArray> out);

// A kernel bound to one node's exact types at compile time (for example a
// oneDNN primitive made for that shape), run many times on buffers the memory
// plan places. run() gets one pointer per input and per output, in order.
class PreparedKernel {
 public:
  virtual ~PreparedKernel() = default;
  virtual Status run(std::span<const void* const> in, std::span<void* const> out) = 0;
};
// Binds the fast kernel for a node. A null table entry, or a null kernel
// returned, means no fast kernel for these types: lowering then runs the
// reference kernel (correct, slow, and marked so in listings and traces).
using PrepareFn = Result<std::unique_ptr<PreparedKernel>> (*)(const Node& node, std::span<const TensorType> in,
                                                               std::span<const TensorType> out);

struct OpInfo {
  const char* name = nullptr;
  int min_inputs = 0;
  int max_inputs = 0;  // -1: any number
  std::vector<AttrSpec> attrs = {};
  InferFn infer = nullptr;
  GradFn grad = nullptr;  // nullptr: not differentiable (autodiff reports it if a gradient is needed)
  EvalFn eval = nullptr;
  PrepareFn prepare = nullptr;  // the fast kernel (see PreparedKernel)
};

const OpInfo& op_info(OpKind op);
const char* op_name(OpKind op);
std::optional<OpKind> op_from_name(std::string_view name);

}  // namespace aspen::graph
