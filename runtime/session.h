// runtime/session.h: loads an Executable onto one or more devices of this
// process and runs it.
//
//   ASPEN_ASSIGN_OR_RETURN(auto exe, compiler::compile(graph));
//   ASPEN_ASSIGN_OR_RETURN(auto session, Session::create(std::move(exe)));
//   ASPEN_RETURN_IF_ERROR(session->set_parameter("fc.weight", w));
//   ASPEN_ASSIGN_OR_RETURN(auto outputs, session->run({{"x", &x}}));
//
// (examples/cpp/graph_session.cc is a whole program; CI runs it.)
//
// Parameters are state owned by the session (zeros until set) and shared,
// read-only, by every replica. Inputs are copied into a device's arena before
// its program runs and named outputs copied out after. A wrong input name,
// type or shape is a Status naming it.
//
// Replicas: with SessionOptions::replicas = R, the program runs on R devices
// side by side, each with its own thread team, arena and prepared kernels
// (lowered again from the same optimized graph). Each input then carries a
// [R] dimension (after the [iterations] one, when there is one) holding each
// replica's slice, and outputs come back with the same [R] dimension. This is
// inference replication (PopTorch's replicationFactor without gradients).
//
// Training replicas (data parallel, train/runner.cc) drive each replica
// themselves: for_each_replica() runs a function on every replica's team at
// once, and inside it run_replica() runs one program on that replica alone,
// between collectives of the function's own. Parameters whose names start
// with one of SessionOptions::replica_local are held once per replica (the
// gradient accumulators); every other parameter is shared, so a program that
// updates one may run on one replica at a time only (run() refuses it with
// replicas > 1), or on several when they update disjoint parameters.
//
// Programs: a session may hold several executables on the same devices
// (Session::create with a list), sharing parameters by name: generation's
// prefill and decode programs share the weights and the KV cache, a training
// and an evaluation program share the weights. A parameter that two programs
// declare with different types is an error at create(). run() picks the
// program by index (the order given); arenas are sized for the largest.
//
// Weight-only values (CompileOptions::hoist_weights): each device keeps, per
// program, the values computed from parameters and constants alone, and runs
// their instructions again only when a parameter they read has changed since
// they last ran (kernels that keep work made from such values, a matmul's
// packed weights, are told then too): set_parameter, parameter_of (a pointer to write through) and
// a run of a program that updates the parameter count as changes.
//
// Thread-safety: one run at a time per session.
#pragma once

#include <atomic>
#include <chrono>
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "compiler/executable.h"
#include "core/tensor.h"
#include "parallel/communicator.h"
#include "profile/trace.h"
#include "runtime/device.h"

namespace aspen::runtime {

struct SessionOptions {
  int threads = 0;  // per device; 0: the free cores divided among the replicas
  std::string device_name = "cpu";  // devices are named <device_name><index>
  profile::TraceRecorder* trace = nullptr;  // when set, every instruction is recorded
  int replicas = 1;
  // Parameter name prefixes that every replica holds its own copy of.
  std::vector<std::string> replica_local = {};
  // When set, replica r holds its copy of a replica-local parameter only if
  // replica_uses(r, name) (pipeline stages: a stage's gradients only on its
  // devices). A program that needs a copy its replica lacks is refused when
  // run there, naming it.
  std::function<bool(int replica, const std::string& name)> replica_uses = {};
};

// How outputs of several iterations in one call come back (PopTorch's OutputMode).
enum class OutputMode { all, final, sum, every_n };

struct RunOptions {
  // Steps run per call without returning to the host. Each input then carries
  // a leading dimension of this size (one slice per step).
  int64_t iterations = 1;
  OutputMode output_mode = OutputMode::final;
  int64_t every_n = 1;  // with OutputMode::every_n: steps every_n, 2·every_n, ...
};

// The leading dimension an output gets for these options (0: none, as one step).
int64_t returned_steps(const RunOptions& options);

// The test hooks' slow work (NOTE [slowed instruction], NOTE [slowed device] in train/runner.h): spins for
// `seconds`, or until `fraction` more of the time since `began` has passed, as slower hardware would take.
void spin_for(double seconds);
void spin_extra(std::chrono::steady_clock::time_point began, double fraction);

class Session {
 public:
  static Result<std::unique_ptr<Session>> create(std::unique_ptr<compiler::Executable> exe,
                                                 const SessionOptions& options = {});
  static Result<std::unique_ptr<Session>> create(std::vector<std::unique_ptr<compiler::Executable>> programs,
                                                 const SessionOptions& options = {});
  int programs() const { return int(programs_.size()); }
  // What the session holds, as planned (the profile's planned memory beside the measured RSS): parameters
  // shared by the replicas, the replicas' own copies of replica-local ones, each replica's arena (the largest
  // program's plan) and weight-only values (casts and layouts of weights made once). Kernels' private copies
  // (oneDNN's reordered weights, packed GEMV weights) are not in it.
  struct Footprint {
    int64_t parameters = 0, replica_copies = 0, arenas = 0, weight_only = 0;
    int64_t total() const { return parameters + replica_copies + arenas + weight_only; }
  };
  Footprint footprint() const;
  const compiler::Executable& executable(int program = 0) const {
    return *replicas_.front().exes.at(size_t(program));
  }
  int replicas() const { return int(replicas_.size()); }
  // The outputs of `program` whose producers write straight into the caller's tensors (NOTE [outputs
  // written in place] in session.cc), by name: for tests and reports.
  std::vector<std::string> direct_outputs(int program = 0) const;
  CpuDevice& device(int replica = 0) { return *replicas_.at(size_t(replica)).device; }
  const CpuDevice& device(int replica = 0) const { return *replicas_.at(size_t(replica)).device; }

  Status set_parameter(const std::string& name, const Tensor& value);
  Result<Tensor> get_parameter(const std::string& name) const;
  // Every parameter of every program: name and type, in first-declared order.
  const std::vector<compiler::Binding>& parameters() const { return parameter_list_; }
  // Runs the program once. Every input must be given, with its exact type.
  Result<std::map<std::string, Tensor>> run(const std::map<std::string, const Tensor*>& inputs);
  // Runs options.iterations steps in one call; see RunOptions. Inputs carry
  // a leading [iterations] dimension when iterations > 1 (then [replicas]
  // when replicas > 1); outputs come back as the output mode says (all:
  // [iterations, ...]; every_n: [iterations / every_n, ...]; final and sum:
  // no step dimension; sum in f32 for float outputs), then [replicas].
  Result<std::map<std::string, Tensor>> run(const std::map<std::string, const Tensor*>& inputs,
                                            const RunOptions& options, int program = 0);

  // Runs fn(r) for every replica r at once, each on its own device's team,
  // and waits for all. Returns the first failure, preferring one that is not
  // kAborted (the cause rather than the peers it stopped).
  Status for_each_replica(const std::function<Status(int replica)>& fn);
  // Runs `program` once on replica r alone: on the calling thread inside
  // for_each_replica's fn(r), else on r's team. Inputs have the program's own
  // shapes (no iterations or replica dimension); outputs likewise.
  Result<std::map<std::string, Tensor>> run_replica(int replica, const std::map<std::string, const Tensor*>& inputs,
                                                    int program);
  // As above, and on_ready(u) is called on the running thread as soon as
  // update u of the program (Executable::updates) has left its parameter
  // final (Executable::update_ready), while the program goes on: a
  // data-parallel step reduces each gradient as the backward pass finishes it.
  // on_ready must not touch what later instructions use.
  Result<std::map<std::string, Tensor>> run_replica(int replica, const std::map<std::string, const Tensor*>& inputs,
                                                    int program, const std::function<void(int update)>& on_ready);
  // The communicator replica r's collective instructions of group `group`
  // (the op's "group" attribute: "data", "tensor", ...; send and recv use
  // "pipe") run on; a collective over more than one device without one is a
  // FailedPrecondition naming the group. Not owned; it must outlive the runs.
  Status set_communicator(int replica, const std::string& group, parallel::Communicator* comm);
  // The parameter replica r computes with (its own copy when replica-local,
  // else the shared one), for work in place between runs; nullptr when there
  // is no such parameter. Handing out the pointer counts as a change of the
  // parameter (weight-only values made from it are made again at the next
  // run), so fetch it again before each write rather than keeping it.
  Tensor* parameter_of(int replica, const std::string& name);

 private:
  struct Replica {
    std::vector<std::unique_ptr<compiler::Executable>> exes;  // by program
    std::unique_ptr<CpuDevice> device;
    std::vector<Tensor> own;  // by parameters_ index: this replica's copy of a replica-local one (else empty)
    std::map<std::string, parallel::Communicator*> comms;  // by group name
    std::vector<std::string> missing;  // by program: a replica-local parameter it needs that this replica lacks
    std::vector<char> held;            // by parameters_ index: this replica holds its copy (or it is shared)
    // By program: its weight-only values, and the change count of each
    // parameter they read (ProgramInfo::watched) when they were made.
    struct Derived {
      std::shared_ptr<uint8_t> bytes;
      std::vector<uint64_t> made_at;
      bool made = false;
    };
    std::vector<Derived> derived;
    // By program, by output binding: the value whose producer writes straight into the caller's output
    // buffer (NOTE [outputs written in place] in session.cc), or -1 where it goes through the arena.
    std::vector<std::vector<int32_t>> direct;
  };
  int replica_index(const Replica& r) const;
  struct ProgramInfo {
    std::vector<int64_t> instruction_bytes;  // bytes each instruction touches, for traces
    std::vector<int64_t> instruction_flops;  // its products' FLOPs (graph/cost.h), for traces
    std::vector<size_t> parameter_index;     // the program's parameter k -> parameters_ index
    std::string updates_shared;              // a shared parameter the program updates ("": none)
    std::vector<std::vector<int>> ready_after;  // by instruction: the updates final after it
    std::vector<std::string> instruction_inputs;  // by instruction: its node's input types, for traces
    // It has derived or keeps_fixed instructions; the parameters_ indices
    // (not ones it updates) that they read.
    bool watches = false;
    std::vector<size_t> watched;
    std::vector<size_t> updated;                // parameters_ indices it updates
  };
  void changed(size_t parameter) { changes_[parameter].fetch_add(1, std::memory_order_relaxed); }
  Session() = default;
  // Where one step's inputs come from and outputs go (nullptr: not returned
  // this step), by binding index; sum: accumulate f32 outputs.
  struct StepIO {
    std::vector<const void*> inputs;
    std::vector<void*> outputs;
    bool sum = false;
    const std::function<void(int)>* on_ready = nullptr;  // see run_replica
  };
  const void* resolve(const Replica& r, int program, int32_t value) const;
  Status execute_program(Replica& r, int program, const StepIO& io);

  std::vector<Replica> replicas_;
  profile::TraceRecorder* trace_ = nullptr;
  // NOTE [slowed instruction]: a test hook (the profile diff's detection trials): the environment's
  // ASPEN_TEST_SLOW_INSTRUCTION="<program>:<node>:<fraction>" makes that instruction take (1 + fraction) times
  // its time, by spinning after it. Read once when the session is made; unset: never consulted.
  struct Slowed {
    int program = -1, node = -1;
    double fraction = 0;
  } slowed_;
  std::vector<ProgramInfo> programs_;
  Result<std::map<std::string, Tensor>> make_outputs(const compiler::Executable& exe, const std::vector<int64_t>& lead,
                                                     bool zero) const;
  Status check_inputs(const compiler::Executable& exe, const std::map<std::string, const Tensor*>& inputs,
                      int64_t steps, int64_t replicas) const;

  std::vector<Tensor> parameters_;  // shared by the programs and the replicas (empty for a replica-local one)
  std::vector<char> local_;         // by parameters_ index: held per replica
  std::vector<compiler::Binding> parameter_list_;  // name and type of each (value: -1)
  std::unique_ptr<std::atomic<uint64_t>[]> changes_;  // by parameters_ index: how often it changed
};

}  // namespace aspen::runtime
