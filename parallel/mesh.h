// parallel/mesh.h: the devices of a job arranged on named axes.
//
// A Mesh is data × pipe × tensor over N = data·pipe·tensor devices. Every
// device has a global rank in [0, N) and coordinates (d, p, t); tensor varies
// fastest, then pipe, then data:
//
//   rank = (d · pipe + p) · tensor + t
//
// so the devices of one tensor group are adjacent ranks (and usually share a
// process), and a pipeline neighbour is `tensor` ranks away. A group along an
// axis is the list of ranks that share the other two coordinates, in
// increasing order of the axis coordinate; a device's rank inside that group
// is its coordinate on the axis. Example: data=2, pipe=1, tensor=2 gives the
// data groups {0,2} and {1,3} and the tensor groups {0,1} and {2,3}.
//
// Thread-safety: a Mesh is an immutable value.
#pragma once

#include <array>
#include <string>
#include <string_view>
#include <vector>

#include "core/status.h"

namespace aspen::parallel {

enum class Axis : int { data = 0, pipe = 1, tensor = 2 };
inline constexpr std::array<Axis, 3> kAxes = {Axis::data, Axis::pipe, Axis::tensor};
std::string_view axis_name(Axis axis);  // "data", "pipe", "tensor"

struct MeshShape {
  int data = 1;    // replicas (replication_factor)
  int pipe = 1;    // pipeline stages
  int tensor = 1;  // tensor shards
  int operator[](Axis a) const { return a == Axis::data ? data : a == Axis::pipe ? pipe : tensor; }
  std::string to_string() const;  // "data=2 x pipe=1 x tensor=2"
};

struct Coord {
  int data = 0, pipe = 0, tensor = 0;
  int operator[](Axis a) const { return a == Axis::data ? data : a == Axis::pipe ? pipe : tensor; }
  bool operator==(const Coord&) const = default;
};

class Mesh {
 public:
  // Checks that every axis is >= 1. The number of devices is their product.
  static Result<Mesh> create(MeshShape shape);
  // As above, and checks that the product equals `devices` (the devices the
  // job actually has, e.g. threads × MPI ranks). The error names all numbers.
  static Result<Mesh> create(MeshShape shape, int devices);

  const MeshShape& shape() const { return shape_; }
  int size() const { return shape_.data * shape_.pipe * shape_.tensor; }
  int axis_size(Axis a) const { return shape_[a]; }

  Coord coord(int rank) const;      // rank in [0, size()) (checked)
  int rank(const Coord& c) const;   // coordinates in range (checked)

  // The ranks that share every coordinate of `rank` except `axis`, ordered by
  // their coordinate on `axis` (so rank's index in it is coord(rank)[axis]).
  std::vector<int> group(Axis axis, int rank) const;
  // Every group along `axis`, each as above, ordered by their smallest rank.
  std::vector<std::vector<int>> groups(Axis axis) const;

 private:
  explicit Mesh(MeshShape s) : shape_(s) {}
  MeshShape shape_;
};

// Where a mesh's devices live among a job's `processes` processes (MPI ranks; 1 without MPI), the one
// place that multiplies the axes for it: either each process holds whole replicas (data a multiple of the
// processes: data / processes replicas, each with its pipe x tensor devices), or the model spans the
// processes (pipe x tensor > 1 and data x pipe x tensor = processes: one device each, `across`).
struct Placement {
  MeshShape shape;
  int processes = 1;
  bool across = false;
  int model_devices() const { return shape.pipe * shape.tensor; }  // the devices one replica spans
  int local_replicas() const { return across ? 1 : shape.data / processes; }
  // The devices one process drives: 1 across, else its replicas' model devices.
  int process_devices() const { return across ? 1 : local_replicas() * model_devices(); }
  // The global replica (data coordinate) of process `process`'s local replica `local`.
  int replica(int process, int local) const {
    return across ? process / model_devices() : process * local_replicas() + local;
  }
};
// The replicas a job of `processes` processes runs when none are asked for: one per process, or, when a
// replica spans several devices (pipe x tensor > 1) that divide the processes, the model across them.
int default_replicas(int pipe, int tensor, int processes);
// InvalidArgument naming `what` (where the replica count comes from, e.g. "config: batch.replicas") when the
// shape fits neither way, with the counts that would.
Result<Placement> place(const MeshShape& shape, int processes, const std::string& what);

}  // namespace aspen::parallel
