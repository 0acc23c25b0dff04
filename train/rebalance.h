// train/rebalance.h: pipeline stages rebalanced while training
// (TrainingOptions::Balance::dynamic; docs/parallel.md, "Stages rebalanced
// while training").
//
// The cut made before step 1 balances estimated (or measured) costs; while
// training a stage can still fall behind: a slower or shared core, a longer
// sequence, an estimate that misjudged an op. A StageBalancer reads each
// step's busy seconds per stage and, when the stages drift apart, proposes a
// new cut at a step boundary, which api::TrainingModel applies (the state
// moves through the host, the stages are compiled again).
//
// The model: stage s's device takes speed_s seconds per unit of cost, so a
// stage's time is speed_s · Σ cost over its nodes. The speeds are read from
// the median of the last `window` steps (speed_s = busy_s / cost_s at the
// current cut) and the cut that minimises the step's predicted time (with m
// micro-batches Σ t_s + (m - 1) · max t_s: the slowest stage sets the pace,
// and the others' time is the pipeline's fill and drain) is train/pipeline.h's
// (PipelineCut::stage_speed, micro_batches). Moving is worth it only when
// that prediction beats the step's time as measured by `min_gain`;
// after a move nothing more moves for `cooldown` steps. Every cut tried is
// remembered with its stages' measured times: the model's proposal is never
// a cut already tried (its measurement stands), and when a tried cut
// measured faster than the current one by `min_gain` (the last prediction
// was wrong) the run goes back to it. So when no cut the pieces allow
// balances the stages, the run may try the other side once, but it does not
// swing between them. The memory holds while the
// conditions do: when the current cut's own time drifts by more than
// 2 · min_gain from what it first measured there, for a whole window (a core
// slowed or freed, longer sequences), everything remembered is forgotten. A
// wrong prediction is corrected by what the next window measures.
//
// The costs are estimates or pieces timed alone, so the model's best cut can
// be a piece or two from the measured best. After a move the model made (or a
// return to a cut that measured faster), within the three decisions after it,
// when the model proposes nothing more worth a move while the dearest stage
// is still more than `probe_apart` above the stages' mean, one untried cut
// beside it is tried as a probe: the model's own best if it is predicted
// faster at all, else the first cut that takes a piece off the dearest stage
// (unless that is predicted slower by more than min_gain). Kept if it
// measures faster than the cut it left (by any margin: two measurements, no
// prediction), left again otherwise. One probe per such move, so noise cannot
// walk the cut; none on stages that never moved (NOTE [probe] in
// rebalance.cc).
//
// Every cut keeps the first cut's grouping (PipelineCut::keep_grouping), so
// a rebalanced run computes the same bits as one that never moved (NOTE
// [moving stages] in pipeline.cc).
//
// Thread-safety: one call at a time.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "core/status.h"
#include "graph/graph.h"
#include "train/training_options.h"  // RebalanceOptions

namespace aspen::train {

// One move: where and why, and what it gained.
struct StageMove {
  int64_t step = 0;                        // decided after this optimizer step; made before the next
  std::vector<int> nodes_before, nodes_after;  // compute nodes on each stage
  std::vector<double> before_s;            // each stage's median busy seconds per step at the old cut
  std::vector<double> predicted_s;         // ... at the new cut, predicted
  std::vector<double> measured_s;          // ... at the new cut, measured (empty until a window has run)
  // The step's seconds as measured (the window's median wall, or, where no wall is given, step_s of the busy
  // medians) at the old cut and at the new one (0 until measured).
  double before_step_s = 0, measured_step_s = 0;
  double seconds = 0;                      // what making the move took (compiling, moving the state)
  int micro_batches = 0;                   // the balancer's (what the step's time is made of)
  // A probe (NOTE [probe] in rebalance.cc): the model predicted no gain worth a move, the stages stayed apart;
  // a cut beside the current one, to be measured and left again if it measures slower than the cut it left.
  bool probe = false;
  // The step's time: Σ t + (m - 1) · max t over the stages' times t, by m (0: max t alone).
  double step_s(const std::vector<double>& stage_s) const;
  double predicted_gain() const;           // 1 - step(predicted) / step(before)
  double measured_gain() const;            // 1 - measured_step_s / before_step_s; NaN until measured
};

class StageBalancer {
 public:
  // `stage_of`: the cut the run starts with (by forward node, -1 for sources); `node_costs`: by forward node
  // (empty: train/pipeline.h's estimate). Errors: options out of range, a cut of another length.
  // `micro_batches`: the step's, whose time the cut shortens (PipelineCut::micro_batches; 0: the dearest
  // stage alone).
  static Result<StageBalancer> create(graph::Graph forward, std::string loss, std::vector<int> stage_of,
                                      std::vector<double> node_costs, int micro_batches,
                                      const RebalanceOptions& options);

  // One optimizer step's busy seconds by stage, and its wall seconds (0: not measured; the step's time is then
  // modelled from the busy times). Returns the cut to move to (stage by forward node) when the stages have
  // drifted apart; the caller makes it and calls moved(). Predictions come from the busy times; measured cuts
  // are compared by their measured step (the wall: the model's fill and drain are an approximation).
  Result<std::optional<std::vector<int>>> observe(int64_t step, std::span<const double> stage_busy_s,
                                                  double wall_s = 0.0);
  // The proposed cut was made, taking `seconds`.
  void moved(double seconds);
  // The proposed cut could not be made (the run stays at the current one, made again): it is not proposed again
  // while the conditions hold.
  void abandoned();

  const std::vector<StageMove>& moves() const { return moves_; }
  const std::vector<int>& stage_of() const { return stage_of_; }
  int stages() const { return stages_; }
  // A move's gain became known at the last observe() (its measured_s filled in): its index, or -1.
  int just_measured() const { return just_measured_; }
  const graph::Graph& forward() const { return forward_; }

 private:
  StageBalancer() = default;
  std::vector<double> stage_costs(const std::vector<int>& stage_of) const;
  std::vector<int> stage_nodes(const std::vector<int>& stage_of) const;
  graph::Graph forward_;
  std::string loss_;
  int stages_ = 0, micro_batches_ = 0;
  std::vector<int> first_, stage_of_;
  std::vector<double> costs_;
  std::vector<StageMove> moves_;
  RebalanceOptions options_;
  struct Seen {
    std::vector<double> busy_s;  // by stage
    double step_s = 0;           // measured: the wall (or the busy times' modelled step)
  };
  std::deque<Seen> window_;  // the last steps at the current cut
  int64_t since_move_ = 0;   // steps observed at the current cut
  std::optional<StageMove> proposed_;  // observe()'s, until moved()
  std::vector<int> proposed_cut_;
  int just_measured_ = -1;
  // By cut tried (under the present conditions): each stage's median, as last measured there.
  std::map<std::vector<int>, Seen> tried_;  // medians
  std::vector<int> probe_from_;  // the cut the last move probed from, until the probe is measured
  bool may_probe_ = false;       // the last move was the model's or a return to a faster cut: one probe may follow
  double baseline_s_ = 0;  // the current cut's step time at its first full window (or the last change)
  int drifted_ = 0;        // consecutive steps whose window's step time drifted from baseline_s_
};

}  // namespace aspen::train
