// graph/op.h: the op list and the op table.
//
// ASPEN_OPS is the one list of ops, grouped by kind. Each op has one OpInfo
// entry (its name, flags, input count, attribute schema, shape/type rule,
// gradient rule, reference kernel, fast kernel and the fast kernel's test
// samples), defined in the ops_<group>.cc file of its group.
// Adding an op: add it to this list, write its entry in its group's file,
// and its kernel in kernels/; nothing else changes (see docs/graph.md).
//
// Each op's number is written beside it: OpKind values are in serialized
// executables, so a number never changes and is never reused (a new op takes
// the next free one, wherever its group puts it in the list). The numbers are
// checked to be 0..kNumOps-1, each once, at compile time.
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
#define ASPEN_OPS(X)                                                                                      \
  /* sources: no inputs */                                                                                \
  X(input, 0) X(parameter, 1) X(constant, 2)                                                              \
  /* elementwise, same shapes in and out (ops_elementwise.cc) */                                          \
  X(add, 3) X(sub, 4) X(mul, 5) X(div, 48) X(scale, 6) X(neg, 7) X(exp, 8) X(tanh, 46) X(sqrt, 47)        \
  X(gelu, 9) X(silu, 10) X(where, 11) X(cast, 12) X(relu, 55) X(sigmoid, 57) X(erf, 58) X(log, 59)        \
  X(max, 60) X(min, 61) X(sin, 67) X(cos, 68) X(floor, 69) X(ceil, 70) X(round, 71)                     \
  /* comparisons and logic: bool out, not differentiated (ops_logic.cc) */                                \
  X(equal, 62) X(less, 63) X(greater, 64) X(logical_and, 65) X(logical_or, 66) X(logical_not, 39)         \
  X(is_nan, 40)                                                                                           \
  /* shape: data moves, values do not change */                                                           \
  X(reshape, 13) X(transpose, 14) X(slice, 15) X(concat, 16) X(broadcast, 17)                             \
  /* reductions over trailing or chosen axes, and the sum of squares clipping reads */                    \
  X(reduce_sum, 18) X(reduce_max, 19) X(sum_squares, 51)                                                  \
  /* indexing */                                                                                          \
  X(gather, 20)                                                                                           \
  /* neural-network blocks, each a kernel of kernels/ */                                                  \
  X(matmul, 21) X(layernorm, 22) X(rmsnorm, 23) X(softmax, 24) X(cross_entropy, 25) X(rotary, 26)         \
  X(attention, 27)                                                                                        \
  /* backward-only ops emitted by gradient rules (not differentiated again) */                            \
  X(gelu_grad, 28) X(silu_grad, 29) X(relu_grad, 56) X(gather_grad, 30) X(layernorm_grad, 31)             \
  X(rmsnorm_grad, 32) X(softmax_grad, 33) X(cross_entropy_grad, 34) X(attention_grad, 35)                 \
  /* collectives: run on the communicator of their group (runtime::Session) */                            \
  X(all_reduce, 36) X(reduce_scatter, 37) X(all_gather, 38)                                             \
  /* the vocab-parallel cross-entropy's pieces (ops_vocab.cc; tensor-parallel models) */                  \
  X(vocab_ce_stats, 52) X(vocab_ce_loss, 53) X(vocab_ce_grad, 54)                                         \
  /* fused: made by the compiler's fusion pass after autodiff (not differentiated) */                     \
  X(bias_gelu, 41) X(add_layernorm, 42) X(matmul_group, 84)                                               \
  /* optimizer steps (ops_optim.cc): outputs feed Builder::update, not differentiated */                  \
  X(adamw, 43) X(sgd, 49) X(lamb, 50)                                                                     \
  /* state writes at run-time positions (ops_state.cc): KV caches, generation state */                    \
  X(write_slice, 44)                                                                                      \
  /* generation: draws token ids inside the program (ops_sampling.cc; not differentiated) */              \
  X(sample, 45)                                                                                           \
  /* dropout in training and uniform draws, from a run-time seed (ops_dropout.cc) */                         \
  X(dropout, 72) X(random_uniform, 76)                                                                    \
  /* convolution and its two backward passes (ops_conv.cc) */                                             \
  X(conv, 73) X(conv_grad_input, 74) X(conv_grad_weight, 75)                                             \
  /* batch normalization in training, by the batch's statistics (ops_batchnorm.cc) */                     \
  X(batch_norm, 77) X(batch_norm_grad, 78)                                                                \
  /* the LSTM recurrence over a sequence (ops_lstm.cc) */                                                 \
  X(lstm, 79) X(lstm_grad, 80)                                                                            \
  /* 2-D max pooling and its backward pass (ops_pool.cc) */                                               \
  X(max_pool, 81) X(max_pool_grad, 82)                                                                    \
  /* products with weights in llama.cpp's quantized blocks (ops_quant.cc; inference only) */              \
  X(matmul_q, 83)
// The next free op number: 85.
// clang-format on

namespace aspen::graph {

enum class OpKind : uint16_t {
#define ASPEN_OP_ENUM(name, number) name = number,
  ASPEN_OPS(ASPEN_OP_ENUM)
#undef ASPEN_OP_ENUM
};

inline constexpr int kNumOps = 0
#define ASPEN_OP_COUNT(name, number) +1
    ASPEN_OPS(ASPEN_OP_COUNT)
#undef ASPEN_OP_COUNT
    ;

namespace detail {
constexpr bool op_numbers_dense() {
  bool seen[kNumOps] = {};
#define ASPEN_OP_SEEN(name, number)                                      \
  if ((number) < 0 || (number) >= kNumOps || seen[number]) return false; \
  seen[number] = true;
  ASPEN_OPS(ASPEN_OP_SEEN)
#undef ASPEN_OP_SEEN
  return true;
}
}  // namespace detail
static_assert(detail::op_numbers_dense(), "ASPEN_OPS: op numbers must be 0..kNumOps-1, each used once");

class Graph;
class Builder;
struct Node;
struct HostArray;
class SampleList;

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
  // For a kernel made by OpInfo::prepare_fixed: the fixed inputs' values
  // changed; work it keeps from them is stale.
  virtual void fixed_inputs_changed() {}
};
// Binds the fast kernel for a node. A null table entry, or a null kernel
// returned, means no fast kernel for these types: lowering then runs the
// reference kernel (correct, slow, and marked so in listings and traces).
using PrepareFn = Result<std::unique_ptr<PreparedKernel>> (*)(const Node& node, std::span<const TensorType> in,
                                                               std::span<const TensorType> out);
// As PrepareFn, for a node whose inputs k with fixed[k] hold the same values
// on every run until PreparedKernel::fixed_inputs_changed() (weights, with
// CompileOptions::hoist_weights): the kernel may keep work made from them
// (matmul: B packed once).
using PrepareFixedFn = Result<std::unique_ptr<PreparedKernel>> (*)(const Node& node, std::span<const TensorType> in,
                                                                   std::span<const TensorType> out,
                                                                   std::span<const char> fixed);
// Lists the cases the kernel sweep checks the fast kernel on (graph/op_sample.h).
using SampleFn = void (*)(SampleList& s);

// What the compiler's passes may do with an op's nodes. Passes ask the table
// (op_has), never a list of ops of their own.
enum OpFlag : uint32_t {
  // Output element i depends on input element i alone, all of one shape: the
  // output may overwrite an input that dies at this node.
  kElementwise = 1u << 0,
  // May write an output over a same-shaped input that dies here (optimizer
  // steps, state writes: they copy the input over first when the two differ).
  kWritesInPlace = 1u << 1,
  // Talks to other devices: runs in program order, and is never folded,
  // recomputed or reordered.
  kCommunicates = 1u << 2,
  // Kept when nothing reads its outputs (an effect outside the graph, or an
  // entry point of the program's signature).
  kKeep = 1u << 3,
  // Never merged with a node that looks the same (each is its own thing:
  // a graph input, a parameter, one message).
  kUnique = 1u << 4,
  // An entry point with no inputs (input, parameter, constant): never recomputed.
  kSource = 1u << 5,
};

struct OpInfo {
  const char* name = nullptr;
  uint32_t flags = 0;  // OpFlag bits
  int min_inputs = 0;
  int max_inputs = 0;  // -1: any number
  std::vector<AttrSpec> attrs = {};
  InferFn infer = nullptr;
  GradFn grad = nullptr;  // nullptr: not differentiable (autodiff reports it if a gradient is needed)
  EvalFn eval = nullptr;
  PrepareFn prepare = nullptr;  // the fast kernel (see PreparedKernel)
  PrepareFixedFn prepare_fixed = nullptr;  // optional, with prepare: see PrepareFixedFn
  SampleFn samples = nullptr;   // required with prepare: the sweep's cases (graph/op_sample.h)
};

const OpInfo& op_info(OpKind op);
inline bool op_has(OpKind op, OpFlag flag) { return (op_info(op).flags & flag) != 0; }
const char* op_name(OpKind op);
std::optional<OpKind> op_from_name(std::string_view name);

}  // namespace aspen::graph
