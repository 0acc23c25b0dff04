// train/plan.h: one training step as data: for every device of the mesh, the
// list of what it does, in order (DESIGN.md: "schedules as per-device
// instruction streams").
//
// make_plan is a pure function of a PlanSpec: the mesh (data x pipe x tensor,
// parallel/mesh.h) and where it lives among the processes, the step's shape
// (fused, or micro-batches of gradient accumulation; pipeline stages with
// their edges and schedule, train/pipeline.h), the trained parameters (sizes,
// owning stage, optimizer shards, tied copies, which are whole on every
// tensor shard) and the exchange's settings (ZeRO-1, overlap, compression,
// buckets). It touches no device, thread or MPI: tests check plans as data
// (golden plans in train/testdata/plans/, check_plan, simulate_plan), and
// `aspen train --print-plan` shows the configured layout's.
//
// Device d of the plan is the mesh rank (parallel/mesh.h: rank = (data · pipe
// + pipe coordinate) · tensor + tensor coordinate). The instructions of one
// step, in the order a device runs them:
//
//   fused              forward, backward and optimizer in one program (one device)
//   forward m          a pipeline stage's forward of micro-batch m
//   backward m         a stage's backward of m (from what its forward kept); or, without
//                      stages, forward and backward of micro-batch m (train/program.h's micro
//                      programs); `next` marks the accumulating program (+= rather than =)
//   send / recv        an edge's activation (or, `grad`, its gradient) of micro-batch m to or
//                      from device `peer`; a tied parameter's gradient (`tied`) to its owner
//   tied_weight        send / recv: a tied parameter's new value from its owner to another stage
//   reduce             gradients summed over `group` (an axis of the mesh): into the copies of
//                      their owners (`owners`, local replica by parameter) or into every copy;
//                      `overlapped`: while the previous backward still runs, each tensor when it
//                      is final; `buckets`: the cross-process all-reduce's buckets
//   tensor_sum         the gradients of the parameters whole on every tensor shard, summed over
//                      the tensor group (each shard differentiated the whole loss)
//   loss               the last stage's micro-batch losses to the replica's other stages
//   norm               Σg² of optimizer shard (or stage) `shard`'s reduced gradients
//   decide             the host's decision, with every device of the job: the step's loss (the
//                      mean over every micro-batch), the norm, the loss scale, skip or clip
//   step               the optimizer step of shard `shard` (skipped when the host skips)
//   broadcast          ZeRO-1: shard `shard`'s new weights from the process that stepped it
//   copy_tied          tensor shards in one process: tied weights' new values to the other
//                      stages' copies
//
// Thread-safety: pure functions of their arguments.
#pragma once

#include <cstdint>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "parallel/data_parallel.h"
#include "parallel/mesh.h"
#include "train/pipeline.h"

namespace aspen::train {

// A value crossing from one pipeline stage to a later one (train/pipeline.h's PipelineEdge).
struct PlanEdge {
  int from = 0, to = 0;
  bool differentiable = false;  // its gradient travels back
  int64_t bytes = 0;
};

struct PlanParam {
  std::string name = {};
  int64_t elements = 0;
  int owner = 0;                // the pipeline stage that steps it
  std::vector<int> stages = {};  // every stage that uses it (owner included), increasing
  bool whole_on_shards = true;  // tensor shards: each holds all of it (its gradient is summed over them)
};

struct PlanShard {  // an optimizer shard: parameters [begin, end) (train/program.h)
  int begin = 0, end = 0;
};

struct PlanSpec {
  parallel::MeshShape mesh = {};
  int processes = 1;        // where the mesh lives: parallel::place (whole replicas, or the model across)
  bool fused = false;       // one device, forward + backward + optimizer in one program
  int micro_batches = 1;    // gradient accumulation
  PipelineSchedule schedule = PipelineSchedule::one_f_one_b;
  std::vector<PlanEdge> edges;                   // with stages
  std::vector<PlanParam> params;                 // trained parameters, in order
  std::vector<PlanShard> shards;                 // optimizer shards without stages (one with tensor shards)
  std::vector<std::vector<int>> accumulators;    // with stages: by stage, the parameters whose gradient it keeps
  bool shard_optimizer_state = false;            // ZeRO-1 across processes
  bool overlap = false;                          // the exchange overlaps the last backward
  parallel::Compression compression = parallel::Compression::none;
  int64_t bucket_bytes = int64_t(25) << 20;
  bool needs_norm = false;  // the host needs the gradient norm (clipping, dynamic loss scaling, one device)
};

enum class InstrKind {
  fused, forward, backward, send, recv, reduce, tensor_sum, loss, norm, decide, step, broadcast, copy_tied
};
const char* instr_kind_name(InstrKind k);

// What a send or recv carries.
enum class Payload { activation, gradient, tied_gradient, tied_weight };

struct Instr {
  InstrKind kind = InstrKind::forward;
  int micro = -1;               // forward, backward, send, recv of an edge
  bool next = false;            // backward: the accumulating program
  Payload payload = Payload::activation;
  int edge = -1;                // send, recv: the pipeline edge (or the tied parameter)
  int peer = -1;                // send, recv: the other device; broadcast: the root process
  parallel::Axis axis = parallel::Axis::data;  // reduce, tensor_sum, loss: the group's axis
  std::vector<int> group;       // reduce, tensor_sum, loss, broadcast, decide: the devices taking part
  bool to_owners = false;       // reduce: into the owners' copies (else every copy)
  bool overlapped = false;      // reduce: during the previous backward
  std::vector<int> params;      // reduce, tensor_sum, norm, step, broadcast: the parameters
  std::vector<int> owners;      // reduce to owners: by entry of params, the local replica that gets the sum
  std::vector<int> crossing = {};         // reduce: the parameters this device all-reduces across processes
  std::vector<parallel::Bucket> buckets = {};  // reduce: their buckets (indices into crossing)
  int shard = -1;               // norm, step, broadcast
  bool operator==(const Instr&) const = default;
};

struct DevicePlan {
  int rank = 0;
  parallel::Coord coord;
  int process = 0;
  std::vector<Instr> instrs;
};

struct Plan {
  PlanSpec spec;
  parallel::Placement placement;
  std::vector<DevicePlan> devices;  // by mesh rank
};

// The plan of one optimizer step. InvalidArgument naming the field for a
// spec that does not describe a layout (a mesh that does not fit the
// processes, edges or parameters naming stages out of range, shards that do
// not cover the parameters, a fused step with more than one device).
Result<Plan> make_plan(const PlanSpec& spec);

// Checks what every layout's plan must satisfy, naming the first failure
// (device, instruction, what was expected): each send matched by one recv
// of the same payload and each recv by one send; each group's collectives
// issued by all its members in the same order with the same arguments; each
// pipeline stage's forward and backward of every micro-batch exactly once
// (each micro-batch's forward before its backward); and a run of the plan
// (simulate_plan) that ends without deadlock.
Status check_plan(const Plan& plan);

// A run of the plan with a cost per pass (forward 1, backward 2 by default;
// transfers and collectives free): sends never wait, a recv waits for its
// send, a collective for every member. Deadlock: FailedPrecondition naming
// the devices and what each waits for.
struct PlanCosts {
  double forward = 1.0, backward = 2.0;
};
struct SimResult {
  double makespan = 0.0;       // the passes' end (before the step's collectives)
  std::vector<double> busy;    // by device: time in passes
  double bubble() const;       // 1 - mean(busy) / makespan
};
Result<SimResult> simulate_plan(const Plan& plan, const PlanCosts& costs = {});

// The instructions of a device after the host's decision (none before it is reached).
std::span<const Instr> after_decision(const DevicePlan& device);

// The plan as text: a header with the spec, then each device's instructions,
// one per line (golden files, `aspen train --print-plan`).
std::string plan_text(const Plan& plan);
std::string instr_text(const Instr& instr);
// The transfer a send or a receive of the device with mesh rank `self` takes part in, the same text at both
// ends ("activation e3 m1 0->1"): the profile draws an arrow from the one to the other (profile/perfetto.h).
std::string transfer_key(const Instr& instr, int self);

}  // namespace aspen::train
