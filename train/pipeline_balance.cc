#include "train/pipeline_balance.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <map>
#include <memory>

#include "compiler/executable.h"
#include "runtime/session.h"
#include "train/pipeline.h"

namespace aspen::train {

namespace {

// An input of the right type: small varied floats (no denormals, nothing
// overflows), zeros for integers (valid token ids and targets).
Tensor filler(const graph::TensorType& t) {
  Tensor out(t.dtype, t.shape);
  if (t.dtype == DType::f32) {
    float* p = out.data<float>();
    for (int64_t i = 0; i < out.numel(); ++i) p[i] = std::sin(float(i) * 0.7f);
  } else if (out.nbytes()) {
    std::fill_n(static_cast<char*>(out.raw()), out.nbytes(), 0);
  }
  return out;
}

double median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

}  // namespace

Result<MeasuredCosts> measure_pipeline_costs(const graph::Graph& forward, const train::ProgramOptions& options,
                                             const compiler::CompileOptions& compile, int threads, int repeats) {
  if (repeats < 1) return Status::invalid_argument("pipeline balance: repeats", ">= 1", std::to_string(repeats));
  train::ProgramOptions po = options;
  po.gradient_accumulation = 1;  // backward_first is what a stage runs most (the rest only differ in = vs +=)
  ASPEN_ASSIGN_OR_RETURN(train::PipelinePrograms pp,
                         train::build_pipeline_programs(forward, 0, po, {.node_costs = {}, .every_narrow_point = true}));
  MeasuredCosts out;
  out.node_costs.assign(forward.nodes().size(), 0.0);
  const int pieces = int(pp.stages.size());
  std::vector<double> estimate(static_cast<size_t>(pieces), 0.0);
  for (int32_t i = 0; i < int32_t(forward.nodes().size()); ++i) {
    const int s = pp.split.stage_of[size_t(i)];
    if (s >= 0) estimate[size_t(s)] += train::estimated_node_cost(forward, forward.node(i));
  }
  for (int s = 0; s < pieces; ++s) {
    const train::PipelinePrograms::Stage& st = pp.stages[size_t(s)];
    std::vector<std::unique_ptr<compiler::Executable>> exes;
    for (int prog : {st.forward, st.backward_first}) {
      ASPEN_ASSIGN_OR_RETURN(auto exe, compiler::compile(pp.graphs[size_t(prog)], compile));
      exes.push_back(std::move(exe));
    }
    runtime::SessionOptions so;
    so.threads = threads;
    ASPEN_ASSIGN_OR_RETURN(auto session, runtime::Session::create(std::move(exes), so));
    // Weights of ordinary size (kernels may take other paths on zeros).
    for (const compiler::Binding& b : session->parameters())
      if (b.type.dtype == DType::f32 && !train::is_state_name(b.name)) {
        Tensor w = filler(b.type);
        for (float& v : w.span<float>()) v *= 0.05f;
        ASPEN_RETURN_IF_ERROR(session->set_parameter(b.name, w));
      }
    std::vector<std::map<std::string, Tensor>> feeds(2);
    for (int k = 0; k < 2; ++k)
      for (const compiler::Binding& b : session->executable(k).inputs)
        feeds[size_t(k)].emplace(b.name, b.name == train::kLossScaleName ? [] {
          Tensor one(DType::f32, Shape{});
          one.data<float>()[0] = 1.0f;
          return one;
        }() : filler(b.type));
    std::vector<double> times;
    for (int r = 0; r <= repeats; ++r) {  // run 0 warms up (first touches of the buffers)
      const auto t0 = std::chrono::steady_clock::now();
      for (int k = 0; k < 2; ++k) {
        std::map<std::string, const Tensor*> in;
        for (const auto& [name, t] : feeds[size_t(k)]) in.emplace(name, &t);
        runtime::RunOptions ro;
        ASPEN_RETURN_IF_ERROR(session->run(in, ro, k).status());
      }
      if (r > 0) times.push_back(std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
    }
    out.piece_s.push_back(median(times));
  }
  for (int32_t i = 0; i < int32_t(forward.nodes().size()); ++i) {
    const int s = pp.split.stage_of[size_t(i)];
    if (s < 0) continue;
    const double share = estimate[size_t(s)] > 0.0
                             ? train::estimated_node_cost(forward, forward.node(i)) / estimate[size_t(s)]
                             : 0.0;
    out.node_costs[size_t(i)] = out.piece_s[size_t(s)] * share;
  }
  return out;
}

}  // namespace aspen::train
