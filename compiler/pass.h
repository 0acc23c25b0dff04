// compiler/pass.h: the pass interface and the pipeline.
//
// A pass is small: Status run(Graph&, const CompileContext&). It may replace
// the graph wholesale (graphs are append-only, so rewriting passes build a
// new one). The verifier runs after every pass when
// CompileOptions::verify_each_pass is set (tests and debug builds).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/dtype.h"
#include "core/status.h"
#include "graph/graph.h"

namespace aspen::compiler {

// O0: no fusion or folding (the graph as built, cleaned of dead code);
// O1: + common subexpressions and constant folding; O2: + fusion.
enum class OptLevel : int { O0 = 0, O1 = 1, O2 = 2 };

struct CompileOptions {
  OptLevel opt_level = OptLevel::O2;
#ifdef NDEBUG
  bool verify_each_pass = false;
#else
  bool verify_each_pass = true;
#endif
  // Recompute forward values the backward reads, except at checkpoints
  // (Builder::checkpoint); off: keep every activation.
  bool recompute = false;
  // Largest constant (elements) that folding may create.
  int64_t max_folded_elements = int64_t(1) << 20;
  // Matmul compute type: f32, or bf16 (inputs cast to bf16, f32 accumulation
  // and output; everything else stays f32). compiler/precision.cc.
  DType compute = DType::f32;
  // Matmul partials type with a narrow compute type: f32 (the default), or
  // the compute type itself (each matmul's result is rounded to it, then read
  // back as f32: half the bytes between matmul and cast, f32 accuracy lost).
  DType partials = DType::f32;
  // With a narrow compute type: the casts of f32 parameters (master weights) round stochastically (NOTE
  // [stochastic cast] in graph/ops_elementwise.cc) from the graph's run-time seed input
  // compiler::kRandomSeedInput, each parameter on a stream of its own (PopTorch's
  // Precision.enableStochasticRounding). The graph must have that input.
  bool stochastic_rounding = false;
  // Weight-only values (compiler/memory_plan.h) are computed once and kept
  // until a parameter they read changes, not on every run: for programs whose
  // weights change between runs only through the session (inference,
  // generation). A lowering choice: the optimized graph, and so the
  // executable cache's key, is the same either way.
  bool hoist_weights = false;
};

// The run-time seed input (i64 [1], one per micro-batch; negative: no randomness) that training dropout and
// stochastic rounding draw from (the ONNX importer's models::kDropoutSeedInput).
inline constexpr const char* kRandomSeedInput = "dropout_seed";

struct CompileContext {
  CompileOptions options;
};

class Pass {
 public:
  virtual ~Pass() = default;
  virtual const char* name() const = 0;
  virtual Status run(graph::Graph& graph, const CompileContext& context) = 0;
};

std::unique_ptr<Pass> make_dead_code_elimination();
std::unique_ptr<Pass> make_common_subexpression_elimination();
std::unique_ptr<Pass> make_constant_folding();
std::unique_ptr<Pass> make_fusion();         // compiler/fusion.cc
// What exporters write out in pieces, as aspen's ops: a product with a uniform constant -> scale, GELU's
// tanh and erf forms -> gelu (compiler/fusion.cc; the fusion pass's first step). The ONNX importer runs it
// too, so that a training graph differentiates gelu (one gelu_grad) rather than its eight pieces.
Status simplify_exported_patterns(graph::Graph& g);
std::unique_ptr<Pass> make_recomputation();  // compiler/recompute.cc
std::unique_ptr<Pass> make_memory_schedule();  // compiler/schedule.cc
std::unique_ptr<Pass> make_precision();      // compiler/precision.cc

// The passes the options ask for, in pipeline order.
std::vector<std::unique_ptr<Pass>> default_pipeline(const CompileOptions& options);

// Runs passes in order, verifying after each when asked. A failure names the pass.
Status run_passes(graph::Graph& graph, const std::vector<std::unique_ptr<Pass>>& passes, const CompileContext& context);

}  // namespace aspen::compiler
