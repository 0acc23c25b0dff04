#include "train/plan.h"

#include <algorithm>
#include <map>
#include <numeric>
#include <sstream>
#include <tuple>

namespace aspen::train {

namespace {

using parallel::Axis;
using parallel::Coord;
using parallel::Mesh;

std::string num(int64_t v) { return std::to_string(v); }
std::string count(int64_t n, const std::string& one, const std::string& many) {
  return num(n) + " " + (n == 1 ? one : many);
}

// The parameters as ranges: "p0-5,8,10-11".
std::string ranges(const std::vector<int>& ps) {
  if (ps.empty()) return "none";
  std::string out = "p";
  for (size_t i = 0; i < ps.size();) {
    size_t j = i;
    while (j + 1 < ps.size() && ps[j + 1] == ps[j] + 1) ++j;
    if (i > 0) out += ",";
    out += num(ps[i]) + (j > i ? "-" + num(ps[j]) : "");
    i = j + 1;
  }
  return out;
}

std::string ranks(const std::vector<int>& g) {
  std::string out = "[";
  for (size_t i = 0; i < g.size(); ++i) out += (i ? "," : "") + num(g[i]);
  return out + "]";
}

const char* payload_name(Payload p) {
  switch (p) {
    case Payload::activation: return "activation";
    case Payload::gradient: return "gradient";
    case Payload::tied_gradient: return "tied_gradient";
    case Payload::tied_weight: return "tied_weight";
  }
  return "?";
}

// Instructions by kind (Instr has many fields; each kind sets its own).
Instr pass(InstrKind k, int micro = -1, bool next = false) {
  Instr i;
  i.kind = k;
  i.micro = micro;
  i.next = next;
  return i;
}
Instr transfer(InstrKind k, Payload p, int edge, int micro, int peer) {
  Instr i;
  i.kind = k;
  i.payload = p;
  i.edge = edge;
  i.micro = micro;
  i.peer = peer;
  return i;
}
Instr collective(InstrKind k, Axis axis, std::vector<int> group, std::vector<int> params = {}) {
  Instr i;
  i.kind = k;
  i.axis = axis;
  i.group = std::move(group);
  i.params = std::move(params);
  return i;
}
Instr on_shard(InstrKind k, int shard, std::vector<int> params) {
  Instr i;
  i.kind = k;
  i.shard = shard;
  i.params = std::move(params);
  return i;
}

Status bad_spec(const std::string& field, const std::string& expected, const std::string& found) {
  return Status::invalid_argument("plan spec: " + field, expected, found);
}

Status validate(const PlanSpec& s, int stages) {
  if (s.micro_batches < 1) return bad_spec("micro_batches", ">= 1", num(s.micro_batches));
  if (s.bucket_bytes < 1) return bad_spec("bucket_bytes", ">= 1", num(s.bucket_bytes));
  const int n = int(s.params.size());
  for (size_t i = 0; i < s.params.size(); ++i) {
    const PlanParam& p = s.params[i];
    const std::string what = "params[" + num(int64_t(i)) + "] (" + p.name + ")";
    if (p.elements < 0) return bad_spec(what + ".elements", ">= 0", num(p.elements));
    if (p.owner < 0 || p.owner >= stages)
      return bad_spec(what + ".owner", "a stage in [0, " + num(stages) + ")", num(p.owner));
    if (std::find(p.stages.begin(), p.stages.end(), p.owner) == p.stages.end() ||
        !std::is_sorted(p.stages.begin(), p.stages.end()) || p.stages.front() < 0 || p.stages.back() >= stages)
      return bad_spec(what + ".stages", "increasing stages in range that include the owner", ranks(p.stages));
  }
  if (stages == 1 && !s.fused) {
    int at = 0;
    for (size_t k = 0; k < s.shards.size(); ++k) {
      if (s.shards[k].begin != at || s.shards[k].end < at)
        return bad_spec("shards[" + num(int64_t(k)) + "]", "parameters from " + num(at),
                        "[" + num(s.shards[k].begin) + ", " + num(s.shards[k].end) + ")");
      at = s.shards[k].end;
    }
    if (at != n) return bad_spec("shards", "shards covering the " + num(n) + " parameters", "up to " + num(at));
  }
  if (stages > 1) {
    for (size_t e = 0; e < s.edges.size(); ++e)
      if (s.edges[e].from < 0 || s.edges[e].to >= stages || s.edges[e].from >= s.edges[e].to)
        return bad_spec("edges[" + num(int64_t(e)) + "]", "from an earlier stage to a later one in [0, " +
                                                               num(stages) + ")",
                        num(s.edges[e].from) + " -> " + num(s.edges[e].to));
    if (int(s.accumulators.size()) != stages)
      return bad_spec("accumulators", "one list per stage (" + num(stages) + ")", num(int64_t(s.accumulators.size())));
    for (const auto& list : s.accumulators)
      for (int p : list)
        if (p < 0 || p >= n) return bad_spec("accumulators", "parameters in [0, " + num(n) + ")", num(p));
  }
  if (s.fused && (s.mesh.data * s.mesh.pipe * s.mesh.tensor != 1 || s.micro_batches != 1))
    return bad_spec("fused", "one device and one micro-batch", s.mesh.to_string() + ", " + num(s.micro_batches) +
                                                                   " micro-batches");
  if (s.shard_optimizer_state && (stages > 1 || s.mesh.tensor > 1))
    return Status::error(Code::kUnimplemented, "plan spec: shard_optimizer_state with " + s.mesh.to_string(),
                         "a layout of replicas only", "pipeline stages or tensor shards");
  return Status();
}

// Builds the instruction lists.
class Planner {
 public:
  Planner(const PlanSpec& spec, const Mesh& mesh, const parallel::Placement& place, Plan& plan)
      : s_(spec), mesh_(mesh), place_(place), plan_(plan) {}

  void build() {
    const int N = mesh_.size();
    plan_.devices.resize(size_t(N));
    for (int r = 0; r < N; ++r) {
      DevicePlan& d = plan_.devices[size_t(r)];
      d.rank = r;
      d.coord = mesh_.coord(r);
      d.process = process_of(r);
    }
    all_.resize(size_t(N));
    std::iota(all_.begin(), all_.end(), 0);
    if (s_.fused) {
      emit(0, pass(InstrKind::fused));
      emit(0, decide());
    } else if (s_.mesh.pipe > 1) {
      pipeline();
    } else {
      split();
    }
  }

 private:
  int process_of(int rank) const {
    return place_.across ? rank : mesh_.coord(rank).data / place_.local_replicas();
  }
  int local_of(int rank) const { return place_.across ? 0 : mesh_.coord(rank).data % place_.local_replicas(); }
  int processes_in(const std::vector<int>& group) const {
    std::vector<int> ps;
    for (int r : group) ps.push_back(process_of(r));
    std::sort(ps.begin(), ps.end());
    return int(std::unique(ps.begin(), ps.end()) - ps.begin());
  }
  // The exchange overlaps the last backward with replicas to reduce over, but not with top-k compression
  // (its error feedback is kept per bucket of a step's whole exchange, which the overlap cuts differently).
  bool overlap_allowed() const {
    return s_.overlap && s_.compression != parallel::Compression::topk && s_.mesh.data > 1;
  }
  void emit(int rank, Instr i) { plan_.devices[size_t(rank)].instrs.push_back(std::move(i)); }
  Instr decide() const { return collective(InstrKind::decide, Axis::data, all_); }

  // The cross-process buckets of `params` (indices into the spec's) reduced over `group`.
  std::vector<parallel::Bucket> buckets(const std::vector<int>& group, const std::vector<int>& params) const {
    if (processes_in(group) < 2) return {};
    std::vector<int64_t> counts;
    for (int p : params) counts.push_back(s_.params[size_t(p)].elements);
    return parallel::pack_buckets(counts, s_.bucket_bytes, s_.compression == parallel::Compression::none);
  }

  // Reduce to owners: the owners of `params`, and the buckets of the ones this device owns.
  Instr reduce_to_owners(int rank, const std::vector<int>& params, const std::vector<int>& owners,
                         bool overlapped) const {
    Instr i = collective(InstrKind::reduce, Axis::data, mesh_.group(Axis::data, rank), params);
    i.to_owners = true;
    i.overlapped = overlapped;
    i.owners = owners;
    std::vector<int> mine;
    for (size_t k = 0; k < params.size(); ++k)
      if (owners[k] == local_of(rank)) mine.push_back(params[k]);
    i.buckets = buckets(i.group, mine);
    if (!i.buckets.empty()) i.crossing = mine;
    return i;
  }
  Instr reduce_all(int rank, const std::vector<int>& params) const {
    Instr i = collective(InstrKind::reduce, Axis::data, mesh_.group(Axis::data, rank), params);
    i.buckets = buckets(i.group, params);
    if (!i.buckets.empty()) i.crossing = params;
    return i;
  }
  std::vector<int> whole(const std::vector<int>& params) const {
    std::vector<int> out;
    for (int p : params)
      if (s_.params[size_t(p)].whole_on_shards) out.push_back(p);
    return out;
  }
  std::vector<int> shard_params(int k) const {
    std::vector<int> out(size_t(s_.shards[size_t(k)].end - s_.shards[size_t(k)].begin));
    std::iota(out.begin(), out.end(), s_.shards[size_t(k)].begin);
    return out;
  }

  // Without stages: every device runs its micro-batches, then the exchange,
  // the norms of the shards it holds, the host's decision and its shard's step.
  void split() {
    const int T = s_.mesh.tensor, L = place_.local_replicas(), A = s_.micro_batches;
    const bool zero = s_.shard_optimizer_state && s_.processes > 1 && s_.mesh.data > 1;
    const bool overlap = overlap_allowed() && T == 1;
    const int n = int(s_.params.size());
    std::vector<int> every(static_cast<size_t>(n)), owners(static_cast<size_t>(n), 0);
    std::iota(every.begin(), every.end(), 0);
    for (size_t k = 0; k < s_.shards.size(); ++k)  // ZeRO-1: shard p·L + l reduces to local replica l
      for (int i = s_.shards[k].begin; i < s_.shards[k].end; ++i) owners[size_t(i)] = int(k) % L;
    for (int r = 0; r < mesh_.size(); ++r) {
      const int l = local_of(r), p = process_of(r);
      for (int a = 0; a < A; ++a) {
        emit(r, pass(InstrKind::backward, a, a > 0));
        if (overlap && a + 1 == A) emit(r, reduce_to_owners(r, every, owners, /*overlapped=*/true));
      }
      if (T > 1) {
        emit(r, collective(InstrKind::tensor_sum, Axis::tensor, mesh_.group(Axis::tensor, r), whole(every)));
        if (s_.mesh.data > 1) emit(r, reduce_all(r, every));
      } else if (s_.mesh.data > 1 && !overlap) {
        emit(r, reduce_to_owners(r, every, owners, /*overlapped=*/false));
      }
      std::vector<int> held;
      if (T > 1) {
        held = {0};
      } else if (!zero) {
        held = {l};
      } else {
        for (int q = 0; q < s_.processes; ++q) held.push_back(q * L + l);
      }
      if (s_.needs_norm)
        for (int k : held)
          if (k < int(s_.shards.size()) && s_.shards[size_t(k)].end > s_.shards[size_t(k)].begin)
            emit(r, on_shard(InstrKind::norm, k, shard_params(k)));
      emit(r, decide());
      const int stepped = T > 1 ? 0 : zero ? p * L + l : l;
      if (stepped < int(s_.shards.size()) && s_.shards[size_t(stepped)].end > s_.shards[size_t(stepped)].begin)
        emit(r, on_shard(InstrKind::step, stepped, shard_params(stepped)));
      if (zero) {
        std::vector<int> cross;  // local replica l of every process
        for (int q = 0; q < s_.processes; ++q) cross.push_back(mesh_.rank({.data = q * L + l, .pipe = 0, .tensor = 0}));
        for (int k : held) {
          Instr b = collective(InstrKind::broadcast, Axis::data, cross, shard_params(k));
          b.shard = k;
          b.peer = k / L;
          emit(r, std::move(b));
        }
      }
    }
  }

  // Pipeline stages: each device runs its stage's passes in the schedule's
  // order with the edges' transfers around them, then the stage's exchange;
  // tied parameters' gradients meet at their owner; the host decides; the
  // stepping devices step their stage's parameters and send tied weights on.
  void pipeline() {
    const int S = s_.mesh.pipe, T = s_.mesh.tensor, A = s_.micro_batches;
    const bool overlap = overlap_allowed() && T == 1;
    const std::vector<std::vector<PipeStep>> order = pipeline_order(s_.schedule, S, A);
    std::vector<std::vector<int>> owned(static_cast<size_t>(S));
    for (size_t i = 0; i < s_.params.size(); ++i) owned[size_t(s_.params[i].owner)].push_back(int(i));
    std::vector<int> tied;
    for (size_t i = 0; i < s_.params.size(); ++i)
      if (s_.params[i].stages.size() > 1) tied.push_back(int(i));
    auto at = [&](int r, int stage) {
      Coord c = mesh_.coord(r);
      c.pipe = stage;
      return mesh_.rank(c);
    };
    for (int r = 0; r < mesh_.size(); ++r) {
      const int st = mesh_.coord(r).pipe;
      const std::vector<PipeStep>& mine = order[size_t(st)];
      size_t last_backward = 0;
      for (size_t k = 0; k < mine.size(); ++k)
        if (!mine[k].forward) last_backward = k;
      bool first_backward = true;
      const std::vector<int>& acc = s_.accumulators[size_t(st)];
      for (size_t k = 0; k < mine.size(); ++k) {
        const int m = mine[k].micro;
        if (mine[k].forward) {
          for (size_t e = 0; e < s_.edges.size(); ++e)
            if (s_.edges[e].to == st)
              emit(r, transfer(InstrKind::recv, Payload::activation, int(e), m, at(r, s_.edges[e].from)));
          emit(r, pass(InstrKind::forward, m));
          for (size_t e = 0; e < s_.edges.size(); ++e)
            if (s_.edges[e].from == st)
              emit(r, transfer(InstrKind::send, Payload::activation, int(e), m, at(r, s_.edges[e].to)));
          continue;
        }
        for (size_t e = 0; e < s_.edges.size(); ++e)
          if (s_.edges[e].from == st && s_.edges[e].differentiable)
            emit(r, transfer(InstrKind::recv, Payload::gradient, int(e), m, at(r, s_.edges[e].to)));
        emit(r, pass(InstrKind::backward, m, !first_backward && A > 1));
        first_backward = false;
        if (overlap && k == last_backward)
          emit(r, reduce_to_owners(r, acc, std::vector<int>(acc.size(), 0), /*overlapped=*/true));
        for (size_t e = 0; e < s_.edges.size(); ++e)
          if (s_.edges[e].to == st && s_.edges[e].differentiable)
            emit(r, transfer(InstrKind::send, Payload::gradient, int(e), m, at(r, s_.edges[e].from)));
      }
      if (T > 1)
        emit(r, collective(InstrKind::tensor_sum, Axis::tensor, mesh_.group(Axis::tensor, r), whole(acc)));
      if (s_.mesh.data > 1 && !overlap)
        emit(r, T > 1 ? reduce_all(r, acc) : reduce_to_owners(r, acc, std::vector<int>(acc.size(), 0), false));
      // The devices whose copies step: replica 0 of each process's stage (its replicas share the weights),
      // or every device when each has its own (tensor shards; one device per process).
      const bool steps = T > 1 || place_.across || local_of(r) == 0;
      if (steps)
        for (int i : tied) {
          const PlanParam& p = s_.params[size_t(i)];
          for (int other : p.stages) {
            if (other == p.owner) continue;
            if (st == other)
              emit(r, transfer(InstrKind::send, Payload::tied_gradient, i, -1, at(r, p.owner)));
            if (st == p.owner)
              emit(r, transfer(InstrKind::recv, Payload::tied_gradient, i, -1, at(r, other)));
          }
        }
      if (place_.across) {  // the last stage's losses to the replica's other stages
        Instr loss = collective(InstrKind::loss, Axis::pipe, mesh_.group(Axis::pipe, r));
        loss.peer = at(r, S - 1);
        emit(r, std::move(loss));
      }
      if (s_.needs_norm && local_of(r) == 0 && !owned[size_t(st)].empty())
        emit(r, on_shard(InstrKind::norm, st, owned[size_t(st)]));
      emit(r, decide());
      if (steps && !owned[size_t(st)].empty())
        emit(r, on_shard(InstrKind::step, st, owned[size_t(st)]));
      if (place_.across) {
        for (int i : tied) {
          const PlanParam& p = s_.params[size_t(i)];
          for (int other : p.stages) {
            if (other == p.owner) continue;
            if (st == p.owner)
              emit(r, transfer(InstrKind::send, Payload::tied_weight, i, -1, at(r, other)));
            if (st == other)
              emit(r, transfer(InstrKind::recv, Payload::tied_weight, i, -1, at(r, p.owner)));
          }
        }
      } else if (T > 1) {
        std::vector<int> mine_tied;
        for (int i : tied)
          if (s_.params[size_t(i)].owner == st) mine_tied.push_back(i);
        if (!mine_tied.empty()) emit(r, on_shard(InstrKind::copy_tied, -1, mine_tied));
      }
    }
  }

  const PlanSpec& s_;
  const Mesh& mesh_;
  const parallel::Placement& place_;
  Plan& plan_;
  std::vector<int> all_;
};

bool is_pass(InstrKind k) { return k == InstrKind::fused || k == InstrKind::forward || k == InstrKind::backward; }
bool is_collective(InstrKind k) {
  return k == InstrKind::reduce || k == InstrKind::tensor_sum || k == InstrKind::loss || k == InstrKind::decide ||
         k == InstrKind::broadcast;
}

std::string where(const Plan& plan, int rank, size_t at) {
  return "plan: device " + num(rank) + ", instruction " + num(int64_t(at)) + " (" +
         instr_text(plan.devices[size_t(rank)].instrs[at]) + ")";
}

}  // namespace

const char* instr_kind_name(InstrKind k) {
  switch (k) {
    case InstrKind::fused: return "fused";
    case InstrKind::forward: return "forward";
    case InstrKind::backward: return "backward";
    case InstrKind::send: return "send";
    case InstrKind::recv: return "recv";
    case InstrKind::reduce: return "reduce";
    case InstrKind::tensor_sum: return "tensor_sum";
    case InstrKind::loss: return "loss";
    case InstrKind::norm: return "norm";
    case InstrKind::decide: return "decide";
    case InstrKind::step: return "step";
    case InstrKind::broadcast: return "broadcast";
    case InstrKind::copy_tied: return "copy_tied";
  }
  return "?";
}

Result<Plan> make_plan(const PlanSpec& spec) {
  ASPEN_ASSIGN_OR_RETURN(const Mesh mesh, Mesh::create(spec.mesh));
  ASPEN_ASSIGN_OR_RETURN(const parallel::Placement place, parallel::place(spec.mesh, spec.processes, "plan spec: mesh"));
  ASPEN_RETURN_IF_ERROR(validate(spec, spec.mesh.pipe));
  Plan plan;
  plan.spec = spec;
  plan.placement = place;
  Planner(spec, mesh, place, plan).build();
  return plan;
}

std::span<const Instr> after_decision(const DevicePlan& device) {
  const auto decided = std::find_if(device.instrs.begin(), device.instrs.end(),
                                    [](const Instr& i) { return i.kind == InstrKind::decide; });
  if (decided == device.instrs.end()) return {};
  return {decided + 1, device.instrs.end()};
}

std::string transfer_key(const Instr& i, int self) {
  const bool send = i.kind == InstrKind::send;
  return std::string(payload_name(i.payload)) + " e" + num(i.edge) + (i.micro >= 0 ? " m" + num(i.micro) : "") + " " +
         num(send ? self : i.peer) + "->" + num(send ? i.peer : self);
}

std::string instr_text(const Instr& i) {
  std::string out = instr_kind_name(i.kind);
  switch (i.kind) {
    case InstrKind::fused:
    case InstrKind::decide:
      break;
    case InstrKind::forward:
    case InstrKind::backward:
      out += " m" + num(i.micro) + (i.next ? " (accumulating)" : "");
      break;
    case InstrKind::send:
    case InstrKind::recv: {
      const bool tied = i.payload == Payload::tied_gradient || i.payload == Payload::tied_weight;
      out += std::string(" ") + payload_name(i.payload) + (tied ? " p" : " e") + num(i.edge) +
             (i.micro >= 0 ? " m" + num(i.micro) : "") + (i.kind == InstrKind::send ? " -> " : " <- ") + num(i.peer);
      break;
    }
    case InstrKind::reduce:
    case InstrKind::tensor_sum: {
      out += std::string(" ") + std::string(parallel::axis_name(i.axis)) + ranks(i.group) + " " + ranges(i.params);
      if (i.kind == InstrKind::reduce) out += i.to_owners ? " to owners" : " to all";
      if (i.to_owners) {  // runs of the same owner: "0-5:0 6-11:1"
        std::map<int, std::vector<int>> by_owner;
        for (size_t k = 0; k < i.params.size(); ++k) by_owner[i.owners[k]].push_back(i.params[k]);
        if (by_owner.size() > 1)
          for (const auto& [owner, ps] : by_owner) out += " " + ranges(ps) + ":" + num(owner);
      }
      if (i.overlapped) out += " overlapped";
      if (!i.buckets.empty()) {
        out += " buckets";
        for (const parallel::Bucket& b : i.buckets)  // "p1-2,4:320" (elements), "!" when reduced in place
          out += " " + ranges(std::vector<int>(i.crossing.begin() + std::ptrdiff_t(b.first),
                                               i.crossing.begin() + std::ptrdiff_t(b.end))) +
                 ":" + num(b.elements) + (b.in_place ? "!" : "");
      }
      break;
    }
    case InstrKind::loss:
      out += std::string(" ") + std::string(parallel::axis_name(i.axis)) + ranks(i.group) + " from " + num(i.peer);
      break;
    case InstrKind::norm:
    case InstrKind::step:
      out += " shard " + num(i.shard) + " " + ranges(i.params);
      break;
    case InstrKind::broadcast:
      out += " shard " + num(i.shard) + " " + ranges(i.params) + " from process " + num(i.peer) + " over " +
             ranks(i.group);
      break;
    case InstrKind::copy_tied:
      out += " " + ranges(i.params);
      break;
  }
  return out;
}

std::string plan_text(const Plan& plan) {
  const PlanSpec& s = plan.spec;
  std::ostringstream o;
  int64_t elements = 0;
  for (const PlanParam& p : s.params) elements += p.elements;
  o << "plan: " << s.mesh.to_string() << " on " << s.processes << " process" << (s.processes > 1 ? "es" : "")
    << (plan.placement.across ? " (the model across them)" : "") << "\n";
  o << "step: " << (s.fused ? "fused" : count(s.micro_batches, "micro-batch", "micro-batches"));
  if (s.mesh.pipe > 1)
    o << ", schedule " << pipeline_schedule_name(s.schedule) << ", " << count(int64_t(s.edges.size()), "edge", "edges");
  o << "; " << count(int64_t(s.params.size()), "parameter", "parameters") << " (" << elements << " elements)";
  if (!s.shards.empty() && s.mesh.pipe == 1)
    o << " in " << count(int64_t(s.shards.size()), "optimizer shard", "optimizer shards");
  o << "\nexchange: overlap " << (s.overlap ? "on" : "off") << ", compression "
    << parallel::compression_name(s.compression) << ", buckets of " << s.bucket_bytes << " bytes, ZeRO-1 "
    << (s.shard_optimizer_state ? "on" : "off") << ", norm " << (s.needs_norm ? "measured" : "not needed") << "\n";
  for (const DevicePlan& d : plan.devices) {
    o << "device " << d.rank << " (data " << d.coord.data << ", pipe " << d.coord.pipe << ", tensor " << d.coord.tensor
      << ") on process " << d.process << ":\n";
    for (const Instr& i : d.instrs) o << "  " << instr_text(i) << "\n";
  }
  return o.str();
}

double SimResult::bubble() const {
  if (busy.empty() || makespan <= 0.0) return 0.0;
  double sum = 0.0;
  for (double b : busy) sum += b;
  return 1.0 - sum / double(busy.size()) / makespan;
}

Result<SimResult> simulate_plan(const Plan& plan, const PlanCosts& costs) {
  const size_t N = plan.devices.size();
  // Every device an instruction names is one of the plan's (a collective's group includes its own device).
  for (size_t d = 0; d < N; ++d)
    for (const Instr& i : plan.devices[d].instrs) {
      const bool p2p = i.kind == InstrKind::send || i.kind == InstrKind::recv;
      bool ok = !p2p || (i.peer >= 0 && size_t(i.peer) < N && size_t(i.peer) != d);
      if (is_collective(i.kind)) {
        ok = std::find(i.group.begin(), i.group.end(), int(d)) != i.group.end();
        for (int m : i.group) ok = ok && m >= 0 && size_t(m) < N;
      }
      if (!ok)
        return Status::invalid_argument("plan: device " + num(int64_t(d)) + ", " + instr_text(i),
                                        p2p ? "a peer among the plan's " + num(int64_t(N)) + " devices, not itself"
                                            : "a group of the plan's devices that includes this one",
                                        p2p ? "peer " + num(int64_t(i.peer)) : "another group");
    }
  std::vector<size_t> pc(N, 0);
  std::vector<double> clock(N, 0.0);
  SimResult out;
  out.busy.assign(N, 0.0);
  // Posted messages: (payload, edge, micro, from, to) -> the time it was sent.
  std::map<std::tuple<int, int, int, int, int>, std::vector<double>> posted;
  auto key = [](const Instr& i, int from, int to) {
    return std::make_tuple(int(i.payload), i.edge, i.micro, from, to);
  };
  size_t done = 0;
  for (size_t d = 0; d < N; ++d)
    if (plan.devices[d].instrs.empty()) ++done;
  while (done < N) {
    bool progressed = false;
    for (size_t d = 0; d < N; ++d) {
      const std::vector<Instr>& list = plan.devices[d].instrs;
      while (pc[d] < list.size()) {
        const Instr& i = list[pc[d]];
        if (is_pass(i.kind)) {
          const double c = i.kind == InstrKind::forward    ? costs.forward
                           : i.kind == InstrKind::backward ? (plan.spec.mesh.pipe > 1 ? costs.backward
                                                                                     : costs.forward + costs.backward)
                                                           : costs.forward + costs.backward;
          clock[d] += c;
          out.busy[d] += c;
          out.makespan = std::max(out.makespan, clock[d]);
        } else if (i.kind == InstrKind::send) {
          posted[key(i, int(d), i.peer)].push_back(clock[d]);
        } else if (i.kind == InstrKind::recv) {
          auto it = posted.find(key(i, i.peer, int(d)));
          if (it == posted.end() || it->second.empty()) break;  // waits for the send
          clock[d] = std::max(clock[d], it->second.front());
          it->second.erase(it->second.begin());
        } else if (is_collective(i.kind)) {
          // Every member at this collective (the same instruction, group and parameters) goes on together.
          bool ready = true;
          for (int m : i.group) {
            const std::vector<Instr>& ml = plan.devices[size_t(m)].instrs;
            const bool here = pc[size_t(m)] < ml.size() && ml[pc[size_t(m)]].kind == i.kind &&
                              ml[pc[size_t(m)]].group == i.group;
            if (!here) ready = false;
          }
          if (!ready) break;
          double t = 0.0;
          for (int m : i.group) t = std::max(t, clock[size_t(m)]);
          for (int m : i.group) {
            clock[size_t(m)] = t;
            if (size_t(m) != d && ++pc[size_t(m)] == plan.devices[size_t(m)].instrs.size()) ++done;
          }
        }
        progressed = true;
        if (++pc[d] == list.size()) ++done;
      }
    }
    if (!progressed && done < N) {
      std::string waits;
      for (size_t d = 0; d < N; ++d)
        if (pc[d] < plan.devices[d].instrs.size())
          waits += (waits.empty() ? "" : "; ") + std::string("device ") + num(int64_t(d)) + " at " +
                   instr_text(plan.devices[d].instrs[pc[d]]);
      return Status::error(Code::kFailedPrecondition, "plan: a run of it", "every device to finish",
                           "a deadlock: " + waits);
    }
  }
  return out;
}

Status check_plan(const Plan& plan) {
  const size_t N = plan.devices.size();
  // Sends and recvs pair up.
  std::map<std::tuple<int, int, int, int, int>, int> balance;  // (payload, edge, micro, from, to) -> sends - recvs
  for (size_t d = 0; d < N; ++d)
    for (const Instr& i : plan.devices[d].instrs) {
      if (i.kind != InstrKind::send && i.kind != InstrKind::recv) continue;
      if (i.peer < 0 || size_t(i.peer) >= N || size_t(i.peer) == d)
        return Status::error(Code::kFailedPrecondition, "plan: device " + num(int64_t(d)) + " (" + instr_text(i) + ")",
                             "a peer among the other devices", num(i.peer));
      const bool send = i.kind == InstrKind::send;
      balance[{int(i.payload), i.edge, i.micro, send ? int(d) : i.peer, send ? i.peer : int(d)}] += send ? 1 : -1;
    }
  for (const auto& [k, n] : balance)
    if (n != 0) {
      const auto& [payload, edge, micro, from, to] = k;
      return Status::error(Code::kFailedPrecondition,
                           "plan: " + std::string(payload_name(Payload(payload))) + " " + num(edge) + " of micro-batch " +
                               num(micro) + " from device " + num(from) + " to " + num(to),
                           "as many sends as recvs", n > 0 ? "a send nobody receives" : "a recv nobody sends");
    }
  // Every member of a group issues the group's collectives in the same order, with the same arguments.
  std::map<std::pair<int, std::vector<int>>, std::vector<std::pair<int, std::vector<const Instr*>>>> seq;
  for (size_t d = 0; d < N; ++d) {
    std::map<std::pair<int, std::vector<int>>, std::vector<const Instr*>> mine;
    for (const Instr& i : plan.devices[d].instrs) {
      if (!is_collective(i.kind)) continue;
      if (std::find(i.group.begin(), i.group.end(), int(d)) == i.group.end())
        return Status::error(Code::kFailedPrecondition, "plan: device " + num(int64_t(d)) + " (" + instr_text(i) + ")",
                             "a group that includes the device", ranks(i.group));
      mine[{int(i.axis), i.group}].push_back(&i);
    }
    for (auto& [g, list] : mine) seq[g].push_back({int(d), std::move(list)});
  }
  for (const auto& [g, members] : seq) {
    if (members.size() != g.second.size())
      return Status::error(Code::kFailedPrecondition, "plan: the group " + ranks(g.second),
                           "collectives on each of its " + num(int64_t(g.second.size())) + " devices",
                           "on " + num(int64_t(members.size())));
    const auto& [first, want] = members.front();
    for (const auto& [d, got] : members) {
      for (size_t k = 0; k < std::max(want.size(), got.size()); ++k) {
        const bool same = k < want.size() && k < got.size() && want[k]->kind == got[k]->kind &&
                          want[k]->params == got[k]->params && want[k]->to_owners == got[k]->to_owners &&
                          want[k]->owners == got[k]->owners && want[k]->shard == got[k]->shard &&
                          want[k]->peer == got[k]->peer && want[k]->overlapped == got[k]->overlapped;
        if (!same)
          return Status::error(Code::kFailedPrecondition,
                               "plan: collective " + num(int64_t(k)) + " of the group " + ranks(g.second) +
                                   " on device " + num(d),
                               k < want.size() ? instr_text(*want[k]) + " (as device " + num(first) + ")" : "none",
                               k < got.size() ? instr_text(*got[k]) : "none");
      }
    }
  }
  // Each pass once, a micro-batch's forward before its backward.
  const int A = plan.spec.micro_batches;
  for (size_t d = 0; d < N; ++d) {
    std::vector<int> fwd(size_t(A), 0), bwd(size_t(A), 0);
    int fused = 0;
    for (size_t k = 0; k < plan.devices[d].instrs.size(); ++k) {
      const Instr& i = plan.devices[d].instrs[k];
      if (i.kind == InstrKind::fused) ++fused;
      if (i.kind != InstrKind::forward && i.kind != InstrKind::backward) continue;
      if (i.micro < 0 || i.micro >= A)
        return Status::error(Code::kFailedPrecondition, where(plan, int(d), k), "a micro-batch in [0, " + num(A) + ")",
                             num(i.micro));
      if (i.kind == InstrKind::forward) ++fwd[size_t(i.micro)];
      if (i.kind == InstrKind::backward) {
        if (plan.spec.mesh.pipe > 1 && fwd[size_t(i.micro)] == 0)
          return Status::error(Code::kFailedPrecondition, where(plan, int(d), k), "its forward first", "none before");
        ++bwd[size_t(i.micro)];
      }
    }
    if (plan.spec.fused) {
      if (fused != 1)
        return Status::error(Code::kFailedPrecondition, "plan: device " + num(int64_t(d)), "one fused pass",
                             num(fused));
      continue;
    }
    for (int m = 0; m < A; ++m)
      if (bwd[size_t(m)] != 1 || fwd[size_t(m)] != (plan.spec.mesh.pipe > 1 ? 1 : 0))
        return Status::error(Code::kFailedPrecondition, "plan: device " + num(int64_t(d)) + ", micro-batch " + num(m),
                             plan.spec.mesh.pipe > 1 ? "one forward and one backward" : "one backward",
                             num(fwd[size_t(m)]) + " forward, " + num(bwd[size_t(m)]) + " backward");
  }
  return simulate_plan(plan).status();
}

}  // namespace aspen::train
