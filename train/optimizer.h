// train/optimizer.h: optimizer steps recorded into the training graph, so one
// compiled program runs forward, backward and the update (W1.4 adds SGD,
// LAMB, clipping, schedules and loss scaling on the same pattern).
//
//   graph::Builder b(g);
//   ... forward, loss; grads = graph::append_gradients(g, loss, params) ...
//   ASPEN_ASSIGN_OR_RETURN(auto opt, train::append_adamw(b, params, grads, {}));
//
// State lives in the program as parameters, updated in place every step:
//   "optimizer.step"                 f32[]   updates done so far (PyTorch's state['step'])
//   "optimizer.exp_avg.<param>"      like the parameter (m), zeros at the start
//   "optimizer.exp_avg_sq.<param>"   like the parameter (v), zeros at the start
// and the learning rate is an input, "optimizer.lr" f32[], so a schedule is a
// stream of values (one per device iteration), never a recompile.
//
// Thread-safety: records into one Builder; no shared state.
#pragma once

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

struct OptimizerGraph {
  graph::ValueId lr;    // the input "optimizer.lr"
  graph::ValueId step;  // this update's number (the state plus one)
};

// Records one AdamW update of every parameter in `params` (values made by
// Builder::parameter, f32) from its gradient `grads[i]`, and the updates of
// the parameters and the optimizer state. A gradient of the wrong type, a
// non-parameter, or bad hyper-parameters: a Status naming it.
Result<OptimizerGraph> append_adamw(graph::Builder& b, std::span<const graph::ValueId> params,
                                    std::span<const graph::ValueId> grads, const AdamWOptions& options);

// The names of the optimizer state of parameter `name`.
std::string exp_avg_name(const std::string& name);
std::string exp_avg_sq_name(const std::string& name);
inline constexpr const char* kStepName = "optimizer.step";
inline constexpr const char* kLrName = "optimizer.lr";

}  // namespace aspen::train
