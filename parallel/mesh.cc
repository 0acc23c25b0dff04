#include "parallel/mesh.h"

#include <algorithm>

#include "core/check.h"

namespace aspen::parallel {

std::string_view axis_name(Axis axis) {
  switch (axis) {
    case Axis::data: return "data";
    case Axis::pipe: return "pipe";
    case Axis::tensor: return "tensor";
  }
  return "?";
}

std::string MeshShape::to_string() const {
  return "data=" + std::to_string(data) + " x pipe=" + std::to_string(pipe) + " x tensor=" + std::to_string(tensor);
}

Result<Mesh> Mesh::create(MeshShape shape) {
  for (Axis a : kAxes) {
    if (shape[a] < 1)
      return Status::invalid_argument("mesh axis '" + std::string(axis_name(a)) + "'", "a size >= 1",
                                      std::to_string(shape[a]), "mesh " + shape.to_string());
  }
  const long long n = 1LL * shape.data * shape.pipe * shape.tensor;
  if (n > (1 << 24))
    return Status::invalid_argument("mesh " + shape.to_string(), "at most 16777216 devices",
                                    std::to_string(n) + " devices");
  return Mesh(shape);
}

Result<Mesh> Mesh::create(MeshShape shape, int devices) {
  if (devices < 1)
    return Status::invalid_argument("device count", "a count >= 1", std::to_string(devices));
  ASPEN_ASSIGN_OR_RETURN(Mesh mesh, create(shape));
  if (mesh.size() != devices)
    return Status::invalid_argument(
        "mesh " + shape.to_string(), std::to_string(devices) + " devices (data x pipe x tensor = the device count)",
        std::to_string(shape.data) + " x " + std::to_string(shape.pipe) + " x " + std::to_string(shape.tensor) +
            " = " + std::to_string(mesh.size()),
        "choose axis sizes whose product is " + std::to_string(devices));
  return mesh;
}

int default_replicas(int pipe, int tensor, int processes) {
  const int model = std::max(1, pipe) * std::max(1, tensor);
  return model > 1 && processes > 1 && processes % model == 0 ? processes / model : processes;
}

Result<Placement> place(const MeshShape& shape, int processes, const std::string& what) {
  ASPEN_RETURN_IF_ERROR(Mesh::create(shape).status());
  if (processes < 1) return Status::invalid_argument("process count", "a count >= 1", std::to_string(processes));
  Placement p{.shape = shape, .processes = processes, .across = false};
  const int model = p.model_devices();
  p.across = processes > 1 && model > 1 && shape.data * model == processes;
  if (p.across || shape.data % processes == 0) return p;
  return Status::invalid_argument(
      what,
      "a multiple of the " + std::to_string(processes) +
          " processes of this MPI job, or with the model across processes, replicas x stages x shards (" +
          std::to_string(model) + ") = " + std::to_string(processes),
      std::to_string(shape.data),
      "--replicas " + std::to_string(processes) +
          (model > 1 && processes % model == 0
               ? " (whole replicas per process) or --replicas " + std::to_string(processes / model) +
                     " (the model across processes)"
               : std::string()));
}

Coord Mesh::coord(int rank) const {
  ASPEN_CHECK(rank >= 0 && rank < size()) << "rank " << rank << " outside mesh of " << size();
  Coord c;
  c.tensor = rank % shape_.tensor;
  c.pipe = (rank / shape_.tensor) % shape_.pipe;
  c.data = rank / (shape_.tensor * shape_.pipe);
  return c;
}

int Mesh::rank(const Coord& c) const {
  for (Axis a : kAxes)
    ASPEN_CHECK(c[a] >= 0 && c[a] < shape_[a]) << "coordinate " << axis_name(a) << "=" << c[a] << " outside mesh "
                                                << shape_.to_string();
  return (c.data * shape_.pipe + c.pipe) * shape_.tensor + c.tensor;
}

std::vector<int> Mesh::group(Axis axis, int rank_in) const {
  Coord c = coord(rank_in);
  std::vector<int> out;
  out.reserve(static_cast<size_t>(shape_[axis]));
  for (int i = 0; i < shape_[axis]; ++i) {
    Coord g = c;
    (axis == Axis::data ? g.data : axis == Axis::pipe ? g.pipe : g.tensor) = i;
    out.push_back(rank(g));
  }
  return out;
}

std::vector<std::vector<int>> Mesh::groups(Axis axis) const {
  std::vector<std::vector<int>> out;
  for (int r = 0; r < size(); ++r)
    if (coord(r)[axis] == 0) out.push_back(group(axis, r));
  return out;
}

}  // namespace aspen::parallel
