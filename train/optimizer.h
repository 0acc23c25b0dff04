// train/optimizer.h: optimizer steps recorded into the training graph, so one
// compiled program runs forward, backward and the update: AdamW, SGD
// (momentum, Nesterov) and LAMB, each one fused op per parameter
// (graph/ops_optim.cc). Clipping, schedules and loss scaling feed the runtime
// scalars "optimizer.lr" and "optimizer.grad_scale" (train/program.h).
//
//   graph::Builder b(g);
//   ... forward, loss; grads = graph::append_gradients(g, loss, params) ...
//   ASPEN_ASSIGN_OR_RETURN(auto opt, train::append_adamw(b, params, grads, {}));
//
// State lives in the program as parameters, updated in place every step:
//   "optimizer.step"                 f32[]   updates done so far (PyTorch's state['step'])
//   "optimizer.exp_avg.<param>"      like the parameter (m), zeros at the start (AdamW, LAMB)
//   "optimizer.exp_avg_sq.<param>"   like the parameter (v), zeros at the start (AdamW, LAMB)
//   "optimizer.momentum_buffer.<param>"  SGD with momentum > 0 (PyTorch's name)
// (f32, or the f16 / bf16 of OptimizerOptions::first_order_dtype and second_order_dtype)
// and the learning rate is an input, "optimizer.lr" f32[], so a schedule is a
// stream of values (one per device iteration), never a recompile.
//
// Thread-safety: records into one Builder; no shared state.
#pragma once

#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "graph/builder.h"

namespace aspen::train {

struct AdamWOptions {
  // torch.optim.AdamW's defaults.
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 1e-2;
  // Parameters whose name contains any of these get no weight decay (the
  // usual exclusion of biases and norms: {"bias", "ln_", "norm"}).
  std::vector<std::string> no_decay = {};
};

// RMSprop is torch.optim.RMSprop's rule (alpha, eps outside the root, L2 weight decay in the gradient,
// momentum, centered), recorded as elementwise ops; state "optimizer.square_avg.<param>", and
// "optimizer.grad_avg.<param>" (centered) and "optimizer.momentum_buffer.<param>" (momentum).
enum class OptimizerKind { adamw, sgd, lamb, rmsprop };
// "adamw", "sgd", "lamb", "rmsprop"; parse_optimizer_kind is the inverse (InvalidArgument listing them).
const char* optimizer_kind_name(OptimizerKind k);
Result<OptimizerKind> parse_optimizer_kind(std::string_view name);

// A parameter group beyond the first (torch.optim's param_groups[k], k >= 1): its parameters by name and the
// settings it has of its own (unset: the optimizer's). Its learning rate is the step's rate times lr_scale:
// schedules and PopTorch's setOptimizer move every group's rate in proportion (the host refuses another
// change: python/aspen/optim.py).
struct ParamGroup {
  std::vector<std::string> params;
  double lr_scale = 1.0;
  std::optional<double> weight_decay, beta1, beta2, eps, momentum, alpha;
};

// Every optimizer's hyper-parameters (each kind reads its own).
struct OptimizerOptions {
  OptimizerKind kind = OptimizerKind::adamw;
  double beta1 = 0.9, beta2 = 0.999, eps = 1e-8;  // AdamW, LAMB
  double weight_decay = 1e-2;                      // decoupled (AdamW, LAMB); L2 in the gradient (SGD)
  double momentum = 0.0;                           // SGD
  bool nesterov = false;                           // SGD (needs momentum)
  // AdamW's weight decay as torch.optim.Adam's: an L2 term added to the gradient before the moments
  // (weight_decay · p), instead of decoupled from them.
  bool l2_weight_decay = false;
  double alpha = 0.99;                             // RMSprop's smoothing of the squared gradient
  bool centered = false;                           // RMSprop: by the gradient's variance
  std::vector<std::string> no_decay = {};          // name patterns without weight decay
  // Parameter groups with settings of their own (a parameter in none takes the settings above); a group's
  // weight_decay is applied as it is (no_decay does not apply to it). A parameter in two groups is an
  // InvalidArgument; names of parameters this update does not step (another shard's) are ignored.
  std::vector<ParamGroup> groups = {};
  // PopTorch's accum_type: the dtype gradients are rounded to (nearest even) as each micro-batch makes them, and
  // their sum over micro-batches after every addition (train/program.h): f32 (no rounding), f16 or bf16. The
  // accumulators stay f32 buffers holding values of that dtype: the numbers of a half-precision accumulation,
  // not its memory.
  DType gradient_dtype = DType::f32;
  // PopTorch's first_order_momentum_accum_type (SGD: velocity_accum_type) and second_order_momentum_accum_type:
  // the dtype the first-order state (exp_avg; SGD's and RMSprop's momentum_buffer, RMSprop's grad_avg) and the
  // second-order state (exp_avg_sq, RMSprop's square_avg) are kept in: f32, or f16 / bf16 in half the memory.
  // The update reads the state widened to f32 and keeps its new value rounded to nearest even.
  DType first_order_dtype = DType::f32, second_order_dtype = DType::f32;
  // Record the input "optimizer.grad_scale" f32[] that multiplies every
  // gradient first (1/loss_scale times the clipping factor); else 1.
  bool grad_scale_input = false;
  // Advance "optimizer.step" in the program. Off for the shards of a
  // data-parallel step, which run at once: each reads the count, and the
  // host advances it once after them all.
  bool update_step = true;
};

struct OptimizerGraph {
  graph::ValueId lr;          // the input "optimizer.lr"
  graph::ValueId step;        // this update's number (the state plus one)
  graph::ValueId grad_scale;  // the input "optimizer.grad_scale" (invalid unless asked for)
};

// Records one update of every parameter by the options' optimizer (see
// append_adamw for the contract).
Result<OptimizerGraph> append_optimizer(graph::Builder& b, std::span<const graph::ValueId> params,
                                        std::span<const graph::ValueId> grads, const OptimizerOptions& options);

// Records one AdamW update of every parameter in `params` (values made by
// Builder::parameter, f32) from its gradient `grads[i]`, and the updates of
// the parameters and the optimizer state. A gradient of the wrong type, a
// non-parameter, or bad hyper-parameters: a Status naming it.
Result<OptimizerGraph> append_adamw(graph::Builder& b, std::span<const graph::ValueId> params,
                                    std::span<const graph::ValueId> grads, const AdamWOptions& options);

// `x` rounded to `dtype` (nearest even) and widened back to f32: x itself for f32 (gradient_dtype's rounding).
graph::ValueId round_to(graph::Builder& b, graph::ValueId x, DType dtype);

// The names of the optimizer state of parameter `name`.
std::string exp_avg_name(const std::string& name);
std::string exp_avg_sq_name(const std::string& name);
std::string momentum_buffer_name(const std::string& name);
inline constexpr const char* kStepName = "optimizer.step";
inline constexpr const char* kLrName = "optimizer.lr";
inline constexpr const char* kGradScaleName = "optimizer.grad_scale";
inline constexpr const char* kOptimizerPrefix = "optimizer.";

}  // namespace aspen::train
