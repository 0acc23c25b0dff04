// train/pipeline.h: pipeline parallelism's programs and schedules.
//
// A forward graph with a scalar loss is cut into `stages` consecutive parts,
// one per device. The cut comes from the nodes' stage tags when the model has
// them (graph::Builder::set_stage, PopTorch's BeginBlock) and is otherwise
// balanced automatically: only where few values cross (between transformer
// blocks, one), at the points whose estimated cost before them is nearest to
// k/stages of the whole.
//
// Values that cross from stage t to a later stage s are edges: stage t's
// forward program outputs "pipe.<e>", stage s's programs take it as an input,
// and stage s's backward program outputs its gradient "pipe.grad.<e>", which
// stage t's backward program takes. Inputs, parameters and constants are
// copied into every stage that uses them. Each stage has
//   forward          its part of the forward pass (the last stage's outputs
//                    the loss, each stage its training outputs) and the values
//                    its backward reads ("pipe.saved.<v>": NOTE [stashed
//                    activations] in pipeline.cc)
//   backward_first   takes those values (or, with ProgramOptions::
//   backward_next    recompute_stages, recomputes its forward from the inputs
//                    it was given and also outputs the loss and the training
//                    outputs), then accumulates its parameters' gradients as
//                    train/program.h's micro programs do (= g, then += g) and
//                    outputs the gradients of its input edges
//   norm, step       over the parameters the stage owns (the first stage that
//                    uses each), like train/program.h's shards
// A parameter several stages use (GPT-2's tied wte: the embedding and the
// lm_head) has one accumulator per stage; the later ones are named
// "train.grad.<p>@<s>" and the host adds them into the owner's before the
// norm and the step.
//
// Schedules (pipeline_order): GPipe runs every micro-batch forward, then every
// backward; 1F1B runs stages - s - 1 forwards first on stage s, then
// alternates one forward and one backward, so at most `stages` micro-batches
// are in flight. Both have the ideal bubble (p - 1) / (m + p - 1).
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <array>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"
#include "graph/graph.h"
#include "train/program.h"

namespace aspen::train {

enum class PipelineSchedule { gpipe, one_f_one_b };
const char* pipeline_schedule_name(PipelineSchedule s);  // "gpipe", "1f1b"
Result<PipelineSchedule> parse_pipeline_schedule(std::string_view name);

struct PipeStep {
  bool forward = true;
  int micro = 0;
  bool operator==(const PipeStep&) const = default;
};
// Each stage's passes in order, for `micro` micro-batches.
std::vector<std::vector<PipeStep>> pipeline_order(PipelineSchedule schedule, int stages, int micro);
// (p - 1) / (m + p - 1): the idle fraction of a balanced pipeline.
double pipeline_bubble_theory(int stages, int micro);

struct PipelineEdge {
  std::string name;  // "pipe.<index>"; its gradient is "pipe.grad.<index>"
  int from = 0, to = 0;
  graph::TensorType type;
  bool differentiable = false;  // a float value (integer edges carry no gradient)
};

struct PipelineStage {
  graph::Graph forward;            // inputs: what it uses of the forward graph's inputs, and its in-edges
  std::vector<int> in_edges, out_edges;  // indices into PipelineSplit::edges
  std::vector<std::string> inputs;       // the forward graph's inputs it takes (not edges)
};

struct PipelineSplit {
  std::vector<PipelineStage> stages;
  std::vector<PipelineEdge> edges;
  std::vector<int> stage_of;  // by forward-graph node: its stage (-1: inputs, parameters, constants)
  // The forward graph's outputs other than the loss, by the stage that computes them: that stage's
  // forward and backward programs output them (TrainingOptions::outputs).
  std::map<std::string, int> output_stage;
};

// How an untagged graph is cut. `node_costs` (by forward-graph node index;
// empty: estimated_node_cost) is what the cut balances: measured times
// (train/pipeline_balance.h) or the estimate. `every_narrow_point` cuts at
// every narrow point instead (the finest automatic cut: the pieces whose
// times a measurement takes); `stages` is then ignored.
//
// Moving stages (NOTE [moving stages] in pipeline.cc): `stage_speed` (one per
// stage; empty: all 1) scales each stage's cost (its device's time per unit of
// cost: a slower core's is higher), so the cut balances times rather than
// costs; `keep_grouping` (a previous cut's stage_of; empty: none) keeps what
// makes two cuts compute the same bits: every parameter several nodes use
// keeps its uses together on one stage, or apart, as that cut had them.
// `micro_batches` (> 0) makes the cut minimise the step's time, Σ t_s + (m - 1)
// · max t_s for stage times t_s (costs times speeds) and m micro-batches,
// rather than the dearest stage (0, the default: then the sum of squares).
struct PipelineCut {
  std::vector<double> node_costs;
  bool every_narrow_point = false;
  std::vector<double> stage_speed = {};
  std::vector<int> keep_grouping = {};
  int micro_batches = 0;
};

// A rough cost of a node: multiply-adds for products, elements otherwise.
double estimated_node_cost(const graph::Graph& g, const graph::Node& n);

// The cut of `forward` (output `loss`) into `stages` stages. Errors
// (InvalidArgument naming the numbers): fewer compute nodes than stages, a
// tagged stage outside [0, stages), a value flowing from a later stage to an
// earlier one, a stage left empty, a loss not on the last stage, node_costs
// of another length than the graph's nodes, stage_speed of another length than
// the stages or not > 0, keep_grouping of another length than the graph's
// nodes or that no cut into `stages` can keep.
Result<PipelineSplit> split_pipeline(const graph::Graph& forward, int stages, const std::string& loss,
                                     const PipelineCut& cut = {});

inline constexpr const char* kPipeGradPrefix = "pipe.grad.";
// A stage's forward value its backward reads (NOTE [stashed activations] in pipeline.cc): "pipe.saved.<value>",
// an output of the stage's forward program and an input of its backward programs.
inline constexpr const char* kPipeSavedPrefix = "pipe.saved.";

struct PipelinePrograms {
  std::vector<graph::Graph> graphs;
  struct Stage {
    int forward = -1;
    int backward_first = -1, backward_next = -1;  // backward_next only with accumulation
    int norm = -1, step = -1;                     // -1 when the stage owns no parameter
    std::vector<size_t> owned;                    // indices into params, in order
    // Every program of the stage (-1 for those it lacks).
    std::array<int, 5> programs() const { return {forward, backward_first, backward_next, norm, step}; }
  };
  std::vector<Stage> stages;
  std::vector<std::string> params;  // every trained parameter, in forward-graph order
  // A parameter used by several stages: its accumulators on the later stages,
  // which the host adds into the owner's ("train.grad.<p>") in stage order.
  struct Shared {
    size_t param = 0;
    std::vector<std::string> extra;
  };
  std::vector<Shared> shared;
  PipelineSplit split;
};

// The programs of every stage; options as for build_training_programs (the
// step is always split: options.split and shards are ignored).
Result<PipelinePrograms> build_pipeline_programs(const graph::Graph& forward, int stages, const ProgramOptions& options,
                                                const PipelineCut& cut = {});

}  // namespace aspen::train
