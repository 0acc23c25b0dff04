#include "train/pipeline.h"

#include <cmath>
#include <algorithm>
#include <limits>
#include <map>

#include "compiler/pass.h"
#include "graph/autodiff.h"
#include "graph/builder.h"

namespace aspen::train {

using graph::Builder;
using graph::Graph;
using graph::OpKind;
using graph::ValueId;

const char* pipeline_schedule_name(PipelineSchedule s) {
  switch (s) {
    case PipelineSchedule::gpipe: return "gpipe";
    case PipelineSchedule::one_f_one_b: return "1f1b";
  }
  return "?";
}

Result<PipelineSchedule> parse_pipeline_schedule(std::string_view name) {
  if (name == "gpipe") return PipelineSchedule::gpipe;
  if (name == "1f1b") return PipelineSchedule::one_f_one_b;
  return Status::invalid_argument("pipeline schedule", "gpipe or 1f1b", "'" + std::string(name) + "'");
}

std::vector<std::vector<PipeStep>> pipeline_order(PipelineSchedule schedule, int stages, int micro) {
  std::vector<std::vector<PipeStep>> out(static_cast<size_t>(stages));
  for (int s = 0; s < stages; ++s) {
    std::vector<PipeStep>& o = out[size_t(s)];
    if (schedule == PipelineSchedule::gpipe) {
      for (int m = 0; m < micro; ++m) o.push_back({true, m});
      for (int m = 0; m < micro; ++m) o.push_back({false, m});
      continue;
    }
    const int warmup = std::min(micro, stages - s - 1);
    int f = 0, b = 0;
    for (; f < warmup; ++f) o.push_back({true, f});
    while (f < micro) {  // steady state: one forward, one backward
      o.push_back({true, f++});
      o.push_back({false, b++});
    }
    while (b < micro) o.push_back({false, b++});  // cool-down
  }
  return out;
}

double pipeline_bubble_theory(int stages, int micro) { return double(stages - 1) / double(micro + stages - 1); }

namespace {

bool is_source(OpKind op) { return graph::op_has(op, graph::kSource); }

}  // namespace

double estimated_node_cost(const Graph& g, const graph::Node& n) {
  if (n.outputs.empty()) return 0.0;
  const double out = double(g.type(n.outputs[0]).shape.numel());
  if (n.op == OpKind::matmul && !n.inputs.empty()) {
    const Shape& a = g.type(n.inputs[0]).shape;
    const int64_t k = n.attrs.i_or("trans_a", 0) ? a[-2] : a[-1];
    return 2.0 * out * double(k);
  }
  return out;
}

namespace {

std::string edge_name(size_t e) { return "pipe." + std::to_string(e); }

}  // namespace

Result<PipelineSplit> split_pipeline(const Graph& fwd, int stages, const std::string& loss, const PipelineCut& cut) {
  if (stages < 1 && !cut.every_narrow_point)
    return Status::invalid_argument("pipeline: stages", ">= 1", std::to_string(stages));
  if (!cut.node_costs.empty() && cut.node_costs.size() != fwd.nodes().size())
    return Status::invalid_argument("pipeline: node costs", std::to_string(fwd.nodes().size()) + " (one per node)",
                                    std::to_string(cut.node_costs.size()));
  if (!cut.stage_speed.empty() && int(cut.stage_speed.size()) != stages)
    return Status::invalid_argument("pipeline: stage speeds", std::to_string(stages) + " (one per stage)",
                                    std::to_string(cut.stage_speed.size()));
  for (double v : cut.stage_speed)
    if (!(v > 0.0) || !std::isfinite(v))
      return Status::invalid_argument("pipeline: a stage speed", "a finite number > 0", std::to_string(v));
  if (!cut.keep_grouping.empty() && cut.keep_grouping.size() != fwd.nodes().size())
    return Status::invalid_argument("pipeline: the cut to keep the grouping of",
                                    std::to_string(fwd.nodes().size()) + " entries (one stage per node)",
                                    std::to_string(cut.keep_grouping.size()));
  const std::optional<ValueId> loss_v = fwd.find_output(loss);
  if (!loss_v)
    return Status::invalid_argument("pipeline: output '" + loss + "'", "the scalar loss", "no output of that name");
  std::vector<int32_t> compute;  // node indices in order
  for (int32_t i = 0; i < int32_t(fwd.nodes().size()); ++i)
    if (!is_source(fwd.node(i).op)) compute.push_back(i);
  const int n = int(compute.size());
  if (n < stages && !cut.every_narrow_point)
    return Status::invalid_argument("pipeline: stages", "at most the forward graph's " + std::to_string(n) +
                                                            " compute nodes",
                                    std::to_string(stages));
  std::vector<int> pos(fwd.nodes().size(), -1);  // node -> position in `compute`
  for (int k = 0; k < n; ++k) pos[size_t(compute[size_t(k)])] = k;
  std::vector<int> stage_of(fwd.nodes().size(), -1);

  bool tagged = false;
  for (int32_t i : compute) tagged = tagged || fwd.node(i).stage >= 0;
  if (tagged && cut.every_narrow_point)
    return Status::invalid_argument("pipeline: a cut at every narrow point", "a graph without stage tags",
                                    "stage tags (they decide the cut)");
  if (tagged) {
    for (int32_t i : compute) {
      const graph::Node& node = fwd.node(i);
      int s = node.stage;
      if (s >= stages)
        return Status::invalid_argument("pipeline: node " + std::to_string(i) + " (" + graph::op_name(node.op) + ")",
                                        "a stage tag below the " + std::to_string(stages) + " stages",
                                        "stage " + std::to_string(s));
      int inherited = 0;  // untagged: the latest stage of its inputs
      for (ValueId v : node.inputs) inherited = std::max(inherited, stage_of[size_t(fwd.value(v).producer)]);
      if (s < 0) s = inherited;
      stage_of[size_t(i)] = s;
    }
  } else {
    // Cost before each cut, and how many values cross it.
    std::vector<double> prefix(size_t(n) + 1, 0.0);
    for (int k = 0; k < n; ++k) {
      const int32_t i = compute[size_t(k)];
      const double c = cut.node_costs.empty() ? estimated_node_cost(fwd, fwd.node(i)) : cut.node_costs[size_t(i)];
      if (!(c >= 0.0) || !std::isfinite(c))
        return Status::invalid_argument("pipeline: the cost of node " + std::to_string(i), "a finite number >= 0",
                                        std::to_string(c));
      prefix[size_t(k) + 1] = prefix[size_t(k)] + c;
    }
    std::vector<int> last_use(size_t(fwd.num_values()), -1);
    for (int k = 0; k < n; ++k)
      for (ValueId v : fwd.node(compute[size_t(k)]).inputs) last_use[size_t(v.index)] = k;
    std::vector<int> delta(size_t(n) + 1, 0);  // crossing(cut after k) = Σ delta[0..k]
    for (int k = 0; k < n; ++k)
      for (ValueId v : fwd.node(compute[size_t(k)]).outputs)
        if (last_use[size_t(v.index)] > k) {
          ++delta[size_t(k)];
          --delta[size_t(last_use[size_t(v.index)])];
        }
    std::vector<int> crossing(size_t(n), 0);
    int running = 0, fewest = std::numeric_limits<int>::max();
    for (int k = 0; k + 1 < n; ++k) {
      running += delta[size_t(k)];
      crossing[size_t(k)] = running;
      if (running > 0) fewest = std::min(fewest, running);
    }
    std::vector<int> cuts;  // stage k+1 starts after position cuts[k]
    if (cut.every_narrow_point) {
      for (int c = 0; c + 1 < n; ++c)
        if (crossing[size_t(c)] == fewest) cuts.push_back(c);
      stages = int(cuts.size()) + 1;
    }
    if (!cut.every_narrow_point && stages > 1) {
      // The cuts among the narrow points that minimise the dearest stage
      // (then the sum of squared stage costs, so the others balance too): a
      // linear partition by dynamic programming over the candidates.
      // NOTE [moving stages]: two cuts compute the same bits when every parameter several nodes use has its uses
      // grouped alike: a tied weight used on two stages has an accumulator on each, added once per step
      // (PipelinePrograms::shared), while uses on one stage add their gradients within each micro-batch. (Every
      // other value a pass reads crosses a narrow cut whole: its gradient is the same sum wherever the cut falls;
      // Pipeline.EveryCutComputesTheSameBits.) keep_grouping turns that into constraints on the cut positions:
      // between consecutive uses at positions a < b, a cut after some c in [a, b) is required (they were apart)
      // or forbidden (together).
      std::vector<char> forbidden(size_t(n), 0);
      std::vector<std::pair<int, int>> required;  // [a, b): a cut after one of these positions
      if (!cut.keep_grouping.empty()) {
        std::map<int32_t, std::vector<int>> uses;  // parameter node -> the positions of its consumers
        for (int k = 0; k < n; ++k)
          for (ValueId v : fwd.node(compute[size_t(k)]).inputs) {
            const int32_t p = fwd.value(v).producer;
            if (fwd.node(p).op != OpKind::parameter) continue;
            std::vector<int>& u = uses[p];
            if (u.empty() || u.back() != k) u.push_back(k);
          }
        for (const auto& [p, u] : uses)
          for (size_t j = 0; j + 1 < u.size(); ++j) {
            const int a = u[j], b = u[j + 1];
            if (cut.keep_grouping[size_t(compute[size_t(a)])] != cut.keep_grouping[size_t(compute[size_t(b)])]) {
              required.emplace_back(a, b);
            } else {
              for (int c = a; c < b; ++c) forbidden[size_t(c)] = 1;
            }
          }
      }
      // A stage of positions (lo, hi] (lo: the cut before it, -1 for the first; hi: its own, n - 1 for the last)
      // leaves a required interval without a cut when it holds the interval whole.
      auto valid = [&](int lo, int hi) {
        for (const auto& [a, b] : required)
          if (lo < a && b - 1 < hi) return false;
        return true;
      };
      auto speed = [&](int stage) { return cut.stage_speed.empty() ? 1.0 : cut.stage_speed[size_t(stage)]; };
      std::vector<int> cand;
      for (int c = 0; c + 1 < n; ++c)
        if (crossing[size_t(c)] == fewest && !forbidden[size_t(c)]) cand.push_back(c);
      const int P = int(cand.size()), K = stages - 1;
      if (P < K)
        return Status::invalid_argument("pipeline: stages",
                                        "at most as many as the graph has narrow cut points (" + std::to_string(P + 1) +
                                            (cut.keep_grouping.empty() ? "" : ", keeping the previous cut's grouping") +
                                            ")",
                                        std::to_string(stages), "tag the stages in the model (Builder::set_stage)");
      struct Best {
        double max = std::numeric_limits<double>::infinity(), sq = 0;
        int from = -1;
      };
      auto better = [](double m1, double q1, const Best& b) {
        if (!std::isfinite(b.max)) return true;  // nothing yet
        const double tol = 1e-12 * std::max(1.0, std::abs(b.max));
        return m1 < b.max - tol || (m1 <= b.max + tol && q1 < b.sq);
      };
      auto upto = [&](int j) { return prefix[size_t(cand[size_t(j)]) + 1]; };  // cost before the cut after cand j
      // f[k][j]: the first k + 1 stages, the (k+1)-th cut after candidate j.
      std::vector<std::vector<Best>> f(static_cast<size_t>(K), std::vector<Best>(static_cast<size_t>(P)));
      for (int j = 0; j < P; ++j)
        if (valid(-1, cand[size_t(j)])) {
          const double seg = upto(j) * speed(0);
          f[0][size_t(j)] = {seg, seg * seg, -1};
        }
      for (int k = 1; k < K; ++k)
        for (int j = k; j < P; ++j)
          for (int i = k - 1; i < j; ++i) {
            const Best& prev = f[size_t(k - 1)][size_t(i)];
            if (!std::isfinite(prev.max) || !valid(cand[size_t(i)], cand[size_t(j)])) continue;
            const double seg = (upto(j) - upto(i)) * speed(k);
            const double m1 = std::max(prev.max, seg), q1 = prev.sq + seg * seg;
            if (better(m1, q1, f[size_t(k)][size_t(j)])) f[size_t(k)][size_t(j)] = {m1, q1, i};
          }
      Best end;
      int last = -1;
      for (int j = K - 1; j < P; ++j) {
        const Best& prev = f[size_t(K - 1)][size_t(j)];
        if (!std::isfinite(prev.max) || !valid(cand[size_t(j)], n - 1)) continue;
        const double seg = (prefix[size_t(n)] - upto(j)) * speed(K);
        const double m1 = std::max(prev.max, seg), q1 = prev.sq + seg * seg;
        if (better(m1, q1, end)) end = {m1, q1, j}, last = j;
      }
      if (last < 0)
        return Status::invalid_argument("pipeline: a cut into " + std::to_string(stages) + " stages",
                                        "one that keeps each shared parameter's uses together or apart as the "
                                        "previous cut had them",
                                        "none among the narrow points");
      std::vector<int> at(static_cast<size_t>(K), 0);  // the cuts as candidate indices
      for (int k = K - 1, j = last; k >= 0; j = f[size_t(k)][size_t(j)].from, --k) at[size_t(k)] = j;
      if (cut.micro_batches > 0) {
        // The step's time rather than the dearest stage's: with m micro-batches through stages of times t_s
        // (per micro-batch), Σ t_s + (m - 1) · max t_s (the ideal bubble's formula when they are equal). With
        // unequal speeds Σ t_s depends on the cut: a cut that leaves the fast stage a little dearer than the
        // slow one can shorten the step. Exact: for each bound M on the stages (every stage time some cut
        // makes, from the min-max cut's up, while (m - 1) · M plus the least sum can still win), the least sum
        // of stage times with every stage <= M, by the same dynamic programming.
        const double m = double(cut.micro_batches);
        auto seg = [&](int k, int i, int j) {  // stage k from after candidate i (-1: the start) to candidate j (P: the end)
          return ((j == P ? prefix[size_t(n)] : upto(j)) - (i < 0 ? 0.0 : upto(i))) * speed(k);
        };
        auto ok = [&](int i, int j) { return valid(i < 0 ? -1 : cand[size_t(i)], j == P ? n - 1 : cand[size_t(j)]); };
        const double inf = std::numeric_limits<double>::infinity();
        auto min_sum = [&](double bound, std::vector<int>* out) {
          // g[k][j]: the least sum of stages 0..k with stage k ending at candidate j; from[k][j] its previous cut.
          std::vector<std::vector<double>> g(static_cast<size_t>(K), std::vector<double>(static_cast<size_t>(P), inf));
          std::vector<std::vector<int>> from(static_cast<size_t>(K), std::vector<int>(static_cast<size_t>(P), -1));
          for (int j = 0; j < P; ++j)
            if (ok(-1, j) && seg(0, -1, j) <= bound) g[0][size_t(j)] = seg(0, -1, j);
          for (int k = 1; k < K; ++k)
            for (int j = k; j < P; ++j)
              for (int i = k - 1; i < j; ++i) {
                const double v = g[size_t(k - 1)][size_t(i)] + seg(k, i, j);
                if (std::isfinite(v) && ok(i, j) && seg(k, i, j) <= bound && v < g[size_t(k)][size_t(j)])
                  g[size_t(k)][size_t(j)] = v, from[size_t(k)][size_t(j)] = i;
              }
          double best = inf;
          int end_at = -1;
          for (int j = K - 1; j < P; ++j) {
            const double v = g[size_t(K - 1)][size_t(j)] + seg(K, j, P);
            if (std::isfinite(v) && ok(j, P) && seg(K, j, P) <= bound && v < best) best = v, end_at = j;
          }
          if (out && end_at >= 0) {
            out->assign(size_t(K), 0);
            for (int k = K - 1, j = end_at; k >= 0; j = from[size_t(k)][size_t(j)], --k) (*out)[size_t(k)] = j;
          }
          return best;
        };
        auto step = [&](const std::vector<int>& c) {
          double sum = 0, mx = 0;
          for (int k = 0; k <= K; ++k) {
            const double t = seg(k, k == 0 ? -1 : c[size_t(k - 1)], k == K ? P : c[size_t(k)]);
            sum += t, mx = std::max(mx, t);
          }
          return sum + (m - 1) * mx;
        };
        double best = step(at);
        const double least = min_sum(inf, nullptr);
        std::vector<double> bounds;
        for (int k = 0; k <= K; ++k)
          for (int i = (k == 0 ? -1 : k - 1); i < (k == 0 ? 0 : P); ++i)
            for (int j = std::max(i + 1, k); j <= (k == K ? P : P - 1); ++j)
              if (j == P ? k == K : k < K)
                if (const double v = seg(k, i, j); v >= end.max * (1 - 1e-12)) bounds.push_back(v);
        std::sort(bounds.begin(), bounds.end());
        bounds.erase(std::unique(bounds.begin(), bounds.end()), bounds.end());
        for (double bound : bounds) {
          if ((m - 1) * bound + least >= best * (1 - 1e-12)) break;
          std::vector<int> c;
          const double sum = min_sum(bound, &c);
          if (std::isfinite(sum) && step(c) < best * (1 - 1e-12)) best = step(c), at = c;
        }
      }
      cuts.assign(size_t(K), 0);
      for (int k = 0; k < K; ++k) cuts[size_t(k)] = cand[size_t(at[size_t(k)])];
    }
    int s = 0;
    for (int k = 0; k < n; ++k) {
      stage_of[size_t(compute[size_t(k)])] = s;
      if (s < int(cuts.size()) && k == cuts[size_t(s)]) ++s;
    }
  }

  // Values only flow forward; every stage has work; the loss is on the last.
  std::vector<int> count(size_t(stages), 0);
  for (int32_t i : compute) {
    ++count[size_t(stage_of[size_t(i)])];
    for (ValueId v : fwd.node(i).inputs) {
      const int32_t p = fwd.value(v).producer;
      if (stage_of[size_t(p)] > stage_of[size_t(i)])
        return Status::invalid_argument("pipeline: node " + std::to_string(i) + " (" + graph::op_name(fwd.node(i).op) +
                                            ") on stage " + std::to_string(stage_of[size_t(i)]),
                                        "inputs from its own or earlier stages",
                                        "an input from node " + std::to_string(p) + " on stage " +
                                            std::to_string(stage_of[size_t(p)]));
    }
  }
  for (int s = 0; s < stages; ++s)
    if (count[size_t(s)] == 0)
      return Status::invalid_argument("pipeline: stage " + std::to_string(s), "at least one node", "none");
  const int loss_stage = stage_of[size_t(fwd.value(*loss_v).producer)];
  if (loss_stage != stages - 1)
    return Status::invalid_argument("pipeline: the loss", "on the last stage (" + std::to_string(stages - 1) + ")",
                                    "stage " + std::to_string(loss_stage));

  // The stage graphs, node by node in the forward graph's order.
  PipelineSplit split;
  split.stages.resize(size_t(stages));
  split.stage_of = stage_of;
  std::vector<std::map<int32_t, ValueId>> mapped(static_cast<size_t>(stages));  // value index -> the stage's value
  std::map<std::pair<int32_t, int>, int> edge_of;                   // (value, to-stage) -> edge
  for (int32_t i : compute) {
    const int s = stage_of[size_t(i)];
    PipelineStage& st = split.stages[size_t(s)];
    Graph& g = st.forward;
    graph::Node copy = fwd.node(i);
    for (ValueId& v : copy.inputs) {
      auto it = mapped[size_t(s)].find(v.index);
      if (it != mapped[size_t(s)].end()) {
        v = it->second;
        continue;
      }
      const graph::Node& p = fwd.producer(v);
      ValueId nv;
      if (is_source(p.op)) {  // copied into every stage that uses it
        graph::Node src = p;
        src.inputs.clear();
        src.outputs.clear();
        const int32_t k = g.add_node(std::move(src), {fwd.type(v)});
        nv = g.node(k).outputs[0];
        if (p.op == OpKind::input) st.inputs.push_back(p.name);
      } else {  // an edge from an earlier stage
        const int from = stage_of[size_t(fwd.value(v).producer)];
        const int e = int(split.edges.size());
        const DType dt = fwd.type(v).dtype;
        PipelineEdge edge{edge_name(size_t(e)), from, s, fwd.type(v), is_float(dt)};
        split.edges.push_back(edge);
        edge_of[{v.index, s}] = e;
        st.in_edges.push_back(e);
        Builder b(g);
        nv = b.input(edge.name, edge.type.dtype, edge.type.shape);
        ASPEN_RETURN_IF_ERROR(b.status());
      }
      mapped[size_t(s)][v.index] = nv;
      v = nv;
    }
    std::vector<graph::TensorType> types;
    for (ValueId v : fwd.node(i).outputs) types.push_back(fwd.type(v));
    const std::vector<ValueId> old_out = fwd.node(i).outputs;
    copy.outputs.clear();
    const int32_t k = g.add_node(std::move(copy), types);
    for (size_t o = 0; o < old_out.size(); ++o) mapped[size_t(s)][old_out[o].index] = g.node(k).outputs[o];
  }
  // The run-time seed (dropout's, and stochastic rounding's of each stage's parameter casts: NOTE [stochastic
  // cast]) reaches every stage: the same micro-batch's seed everywhere, so a stage's backward program, which
  // casts its parameters again (and, with ProgramOptions::recompute_stages, recomputes its forward), draws what
  // its forward drew.
  if (auto seed = fwd.find_input(compiler::kRandomSeedInput))
    for (PipelineStage& st : split.stages)
      if (std::find(st.inputs.begin(), st.inputs.end(), compiler::kRandomSeedInput) == st.inputs.end()) {
        Builder b(st.forward);
        b.input(compiler::kRandomSeedInput, fwd.type(*seed).dtype, fwd.type(*seed).shape);
        ASPEN_RETURN_IF_ERROR(b.status());
        st.inputs.push_back(compiler::kRandomSeedInput);
      }
  // Each edge is an output of its producing stage.
  for (size_t e = 0; e < split.edges.size(); ++e) {
    const PipelineEdge& edge = split.edges[e];
    PipelineStage& from = split.stages[size_t(edge.from)];
    from.out_edges.push_back(int(e));
  }
  for (const auto& [key, e] : edge_of) {
    const PipelineEdge& edge = split.edges[size_t(e)];
    split.stages[size_t(edge.from)].forward.add_output(edge.name, mapped[size_t(edge.from)].at(key.first));
  }
  split.stages.back().forward.add_output(loss, mapped.back().at(loss_v->index));
  // The forward graph's other outputs (TrainingOptions::outputs) come from the stage that computes them.
  for (const auto& [name, v] : fwd.outputs()) {
    if (name == loss) continue;
    const int32_t p = fwd.value(v).producer;
    const int s = stage_of[size_t(p)];
    if (s < 0)
      return Status::error(Code::kUnimplemented, "pipeline: output '" + name + "'",
                           "an output computed by a stage", "an input, parameter or constant of the graph");
    split.stages[size_t(s)].forward.add_output(name, mapped[size_t(s)].at(v.index));
    split.output_stage.emplace(name, s);
  }
  return split;
}

namespace {

bool trainable(const std::string& name, DType t) { return !is_state_name(name) && t == DType::f32; }

std::string stage_accumulator(const std::string& param, int stage, int owner) {
  return stage == owner ? grad_accumulator_name(param) : grad_accumulator_name(param) + "@" + std::to_string(stage);
}

// Stage s's backward program: recompute its forward, then the gradients of
// Σ out_e · grad_e (+ loss · scale on the last stage) into the accumulators
// and the input edges' gradient outputs.
Result<Graph> stage_backward(const PipelineSplit& split, int s, const std::vector<std::string>& params,
                             const std::map<std::string, int>& owner, const ProgramOptions& o, bool first) {
  const PipelineStage& st = split.stages[size_t(s)];
  Graph g = st.forward;
  const bool last = s + 1 == int(split.stages.size());
  Builder b(g);
  ValueId objective;
  auto add = [&](ValueId term) { objective = objective.valid() ? b.add(objective, term) : term; };
  if (last) {
    ValueId l = *g.find_output(o.loss);
    if (o.loss_scale_input) l = b.mul(l, b.input(kLossScaleName, DType::f32, Shape{}));
    add(l);
  }
  for (int e : st.out_edges) {
    const PipelineEdge& edge = split.edges[size_t(e)];
    if (!edge.differentiable) continue;
    const ValueId out = *g.find_output(edge.name);
    const ValueId grad = b.input(kPipeGradPrefix + std::to_string(e), edge.type.dtype, edge.type.shape);
    std::vector<int64_t> axes;
    for (int d = 0; d < edge.type.shape.rank(); ++d) axes.push_back(d);
    ValueId prod = b.mul(out, grad);
    add(axes.empty() ? prod : b.reduce_sum(prod, axes));
  }
  ASPEN_RETURN_IF_ERROR(b.status());
  if (!objective.valid())
    return Status::invalid_argument("pipeline: stage " + std::to_string(s), "a differentiable output or the loss",
                                    "none (its outputs are all integers)");
  std::vector<ValueId> wrt;
  std::vector<std::string> wrt_params;
  for (const std::string& p : params)
    if (auto v = g.find_parameter(p)) {
      wrt.push_back(*v);
      wrt_params.push_back(p);
    }
  std::vector<int> wrt_edges;
  for (int e : st.in_edges)
    if (split.edges[size_t(e)].differentiable) {
      wrt.push_back(*g.find_input(split.edges[size_t(e)].name));
      wrt_edges.push_back(e);
    }
  ASPEN_ASSIGN_OR_RETURN(std::vector<ValueId> grads, graph::append_gradients(g, objective, wrt));
  ASPEN_RETURN_IF_ERROR(round_gradients(g, std::span(grads).first(wrt_params.size()), o.optimizer.gradient_dtype));
  Tensor zero_index(DType::i32, Shape{});
  zero_index.data<int32_t>()[0] = 0;
  const ValueId zero = b.constant(std::move(zero_index));
  for (size_t i = 0; i < wrt_params.size(); ++i) {
    const graph::TensorType t = g.type(wrt[i]);
    const ValueId acc = b.parameter(stage_accumulator(wrt_params[i], s, owner.at(wrt_params[i])), t.dtype, t.shape);
    ValueId value;
    if (!first) {
      value = round_to(b, b.add(acc, grads[i]), o.optimizer.gradient_dtype);
    } else if (t.shape.rank() == 0) {
      value = grads[i];
    } else {
      value = b.op1(OpKind::write_slice, {acc, grads[i], zero}, {{"axis", int64_t(0)}});
    }
    b.update(acc, value);
  }
  // The edges go (the forward pass sent them); so do the loss and the training outputs unless recomputed (the
  // forward pass output them: NOTE [stashed activations]).
  for (const auto& [name, v] : st.forward.outputs())
    if (!o.recompute_stages || (!(last && name == o.loss) && !split.output_stage.count(name))) g.remove_output(name);
  for (size_t k = 0; k < wrt_edges.size(); ++k)
    b.output(kPipeGradPrefix + std::to_string(wrt_edges[k]), grads[wrt_params.size() + k]);
  ASPEN_RETURN_IF_ERROR(b.status());
  return g;
}

// NOTE [stashed activations] A stage's backward program is built from a copy of its forward graph with the
// gradient nodes appended after it (stage_backward). Unless ProgramOptions::recompute_stages, the forward part
// is not run again: the values of it that the live gradient nodes read (not the sources: inputs, parameters and
// constants, which the backward has anyway) become outputs "pipe.saved.<value>" of the stage's forward program,
// which the runner keeps with the micro-batch's in-edges until its backward, and inputs of the same names in
// the backward programs, whose forward part then has no use and is dropped at compile. The same numbers as
// recomputing (the same ops on the same values, random draws included: a dropout's mask is one of the saved
// values, or its seed is), one forward pass less per micro-batch, and each in-flight micro-batch's saved
// values held: at most `stages` per stage under 1F1B, every micro-batch under GPipe.

// The forward part's values (nodes below `forward_nodes`, not sources) that the live nodes after it read.
std::vector<int32_t> saved_values(const Graph& bwd, size_t forward_nodes) {
  const std::vector<char> live = bwd.live_nodes();
  std::vector<char> saved(size_t(bwd.num_values()), 0);
  for (size_t i = forward_nodes; i < bwd.nodes().size(); ++i)
    if (live[i])
      for (ValueId v : bwd.nodes()[i].inputs) {
        const int32_t p = bwd.value(v).producer;
        if (size_t(p) < forward_nodes && !is_source(bwd.node(p).op)) saved[size_t(v.index)] = 1;
      }
  std::vector<int32_t> out;
  for (int32_t v = 0; v < bwd.num_values(); ++v)
    if (saved[size_t(v)]) out.push_back(v);
  return out;
}

std::string saved_name(int32_t value) { return kPipeSavedPrefix + std::to_string(value); }

// `bwd` with the nodes after `forward_nodes` reading each saved value from an input of its name instead (the
// inputs first: the graph stays in topological order).
Result<Graph> read_saved(const Graph& bwd, size_t forward_nodes, const std::vector<int32_t>& saved) {
  Graph g;
  std::map<int32_t, ValueId> input_of;
  {
    Builder b(g);
    for (int32_t v : saved) {
      const graph::TensorType t = bwd.type(ValueId{v});
      input_of.emplace(v, b.input(saved_name(v), t.dtype, t.shape));
    }
    ASPEN_RETURN_IF_ERROR(b.status());
  }
  std::vector<ValueId> to(size_t(bwd.num_values()));
  for (size_t i = 0; i < bwd.nodes().size(); ++i) {
    graph::Node n = bwd.nodes()[i];
    for (ValueId& v : n.inputs) {
      auto it = input_of.find(v.index);
      v = i >= forward_nodes && it != input_of.end() ? it->second : to[size_t(v.index)];
    }
    std::vector<graph::TensorType> types;
    for (ValueId v : n.outputs) types.push_back(bwd.type(v));
    const std::vector<ValueId> old = n.outputs;
    n.outputs.clear();
    const int32_t k = g.add_node(std::move(n), types);
    for (size_t o = 0; o < old.size(); ++o) to[size_t(old[o].index)] = g.node(k).outputs[o];
  }
  for (const auto& [name, v] : bwd.outputs()) g.add_output(name, to[size_t(v.index)]);
  for (const auto& [name, v] : bwd.updates()) g.add_update(name, to[size_t(v.index)]);
  return g;
}

}  // namespace

Result<PipelinePrograms> build_pipeline_programs(const Graph& forward, int stages, const ProgramOptions& o,
                                                const PipelineCut& cut) {
  if (o.gradient_accumulation < 1)
    return Status::invalid_argument("training: gradient_accumulation", ">= 1", std::to_string(o.gradient_accumulation));
  if (!forward.updates().empty())  // a stage's graph would drop them (a batch norm's running statistics)
    return Status::error(Code::kUnimplemented, "pipeline stages: forward graph update of '" + forward.updates()[0].first + "'",
                         "a forward graph without state updates (a batch norm in training keeps its running "
                         "statistics so: train it in one stage)",
                         std::to_string(forward.updates().size()) + " update(s)");
  PipelinePrograms out;
  ASPEN_ASSIGN_OR_RETURN(const Graph fwd, loss_and(forward, o.loss, o.outputs));
  if (!cut.node_costs.empty() && cut.node_costs.size() != forward.nodes().size())
    return Status::invalid_argument("pipeline: node costs", std::to_string(forward.nodes().size()) + " (one per node)",
                                    std::to_string(cut.node_costs.size()));
  ASPEN_ASSIGN_OR_RETURN(out.split, split_pipeline(fwd, stages, o.loss, cut));
  stages = int(out.split.stages.size());
  for (int32_t i : forward.parameter_nodes()) {
    const graph::Node& n = forward.node(i);
    if (trainable(n.name, forward.type(n.outputs[0]).dtype)) out.params.push_back(n.name);
  }
  // Owners: the first stage that uses each parameter.
  std::map<std::string, int> owner;
  std::vector<std::vector<int>> users(out.params.size());
  for (int s = 0; s < stages; ++s)
    for (size_t i = 0; i < out.params.size(); ++i)
      if (out.split.stages[size_t(s)].forward.find_parameter(out.params[i])) {
        users[i].push_back(s);
        owner.emplace(out.params[i], s);
      }
  for (size_t i = 0; i < out.params.size(); ++i) {
    if (users[i].empty()) owner.emplace(out.params[i], 0);  // unused: stage 0 keeps (and steps) it
    if (users[i].size() > 1) {
      PipelinePrograms::Shared sh{i, {}};
      for (size_t u = 1; u < users[i].size(); ++u)
        sh.extra.push_back(stage_accumulator(out.params[i], users[i][u], users[i][0]));
      out.shared.push_back(std::move(sh));
    }
  }
  OptimizerOptions opt = o.optimizer;
  opt.grad_scale_input = true;
  opt.update_step = stages == 1;
  out.stages.resize(size_t(stages));
  for (int s = 0; s < stages; ++s) {
    PipelinePrograms::Stage& st = out.stages[size_t(s)];
    Graph forward_program = out.split.stages[size_t(s)].forward;
    const size_t forward_nodes = forward_program.nodes().size();
    ASPEN_ASSIGN_OR_RETURN(Graph first, stage_backward(out.split, s, out.params, owner, o, true));
    Graph next;
    if (o.gradient_accumulation > 1) {
      ASPEN_ASSIGN_OR_RETURN(next, stage_backward(out.split, s, out.params, owner, o, false));
    }
    if (!o.recompute_stages) {  // NOTE [stashed activations]
      const std::vector<int32_t> saved = saved_values(first, forward_nodes);
      if (o.gradient_accumulation > 1 && saved_values(next, forward_nodes) != saved)
        return Status::error(Code::kInternal, "pipeline: stage " + std::to_string(s) + "'s saved values",
                             "the same for both backward programs", "different ones");
      for (int32_t v : saved) forward_program.add_output(saved_name(v), ValueId{v});
      ASPEN_ASSIGN_OR_RETURN(first, read_saved(first, forward_nodes, saved));
      if (o.gradient_accumulation > 1) {
        ASPEN_ASSIGN_OR_RETURN(next, read_saved(next, forward_nodes, saved));
      }
    }
    st.forward = int(out.graphs.size());
    out.graphs.push_back(std::move(forward_program));
    st.backward_first = int(out.graphs.size());
    out.graphs.push_back(std::move(first));
    if (o.gradient_accumulation > 1) {
      st.backward_next = int(out.graphs.size());
      out.graphs.push_back(std::move(next));
    }
    for (size_t i = 0; i < out.params.size(); ++i)
      if (owner.at(out.params[i]) == s) st.owned.push_back(i);
    if (st.owned.empty()) continue;
    std::vector<graph::TensorType> types;
    for (size_t i : st.owned) types.push_back(forward.type(*forward.find_parameter(out.params[i])));
    {
      Graph g;
      Builder b(g);
      std::vector<ValueId> sums;
      for (size_t k = 0; k < st.owned.size(); ++k) {
        const ValueId acc = b.parameter(grad_accumulator_name(out.params[st.owned[k]]), types[k].dtype, types[k].shape);
        sums.push_back(b.reshape(b.op1(OpKind::sum_squares, {acc}), {1}));
      }
      b.output(kGradSqNormName, sums.size() == 1 ? sums[0] : b.concat(sums, 0));
      ASPEN_RETURN_IF_ERROR(b.status());
      st.norm = int(out.graphs.size());
      out.graphs.push_back(std::move(g));
    }
    {
      Graph g;
      Builder b(g);
      std::vector<ValueId> params, grads;
      for (size_t k = 0; k < st.owned.size(); ++k) {
        const std::string& p = out.params[st.owned[k]];
        params.push_back(b.parameter(p, types[k].dtype, types[k].shape));
        grads.push_back(b.parameter(grad_accumulator_name(p), types[k].dtype, types[k].shape));
      }
      ASPEN_RETURN_IF_ERROR(append_optimizer(b, params, grads, opt).status());
      st.step = int(out.graphs.size());
      out.graphs.push_back(std::move(g));
    }
  }
  return out;
}

}  // namespace aspen::train
