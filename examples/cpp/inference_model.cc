// examples/cpp/inference_model.cc: a graph compiled once into an
// InferenceModel (api/inference_model.h) with PopTorch-style options
// (api/options.h): 8 device iterations per call, every step's output
// returned, and a Chrome trace of the run.
//
//   inference_model [TRACE.json]   exits 0 when each step's output matches a plain loop
#include <cmath>
#include <cstdio>
#include <map>
#include <string>

#include "api/inference_model.h"
#include "graph/builder.h"

namespace {

int fail(const aspen::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 1;
}

}  // namespace

int main(int argc, char** argv) {
  using namespace aspen;
  // A two-layer net, y = tanh(x · w1) · w2, on x [2, 6] per step.
  graph::Graph g;
  graph::Builder b(g);
  graph::ValueId x = b.input("x", DType::f32, Shape{2, 6});
  graph::ValueId w1 = b.parameter("w1", DType::f32, Shape{6, 10});
  graph::ValueId w2 = b.parameter("w2", DType::f32, Shape{10, 3});
  b.output("y", b.matmul(b.tanh(b.matmul(x, w1)), w2));
  if (!b.status().is_ok()) return fail(b.status());

  const int64_t steps = 8;
  api::Options opts;
  opts.device_iterations(steps).output_mode(api::OutputMode::all);
  if (argc > 1) opts.profile(argv[1]);
  Result<std::unique_ptr<api::InferenceModel>> model = api::InferenceModel::create(g, opts);
  if (!model.is_ok()) return fail(model.status());

  Tensor w1s(DType::f32, Shape{6, 10}), w2s(DType::f32, Shape{10, 3});
  for (int64_t i = 0; i < w1s.numel(); ++i) w1s.data<float>()[i] = std::sin(float(i)) * 0.5f;
  for (int64_t i = 0; i < w2s.numel(); ++i) w2s.data<float>()[i] = std::cos(float(i)) * 0.5f;
  if (Status s = (*model)->copy_weights_to_device({{"w1", &w1s}, {"w2", &w2s}}); !s.is_ok()) return fail(s);

  // One call runs every step: the input carries a leading dimension of device_iterations.
  Tensor xs(DType::f32, Shape{steps, 2, 6});
  for (int64_t i = 0; i < xs.numel(); ++i) xs.data<float>()[i] = float(i % 11) * 0.1f - 0.5f;
  Result<std::map<std::string, Tensor>> out = (*model)->run({{"x", &xs}});
  if (!out.is_ok()) return fail(out.status());
  const Tensor& ys = out->at("y");  // [steps, 2, 3]

  double worst = 0.0;
  for (int64_t s = 0; s < steps; ++s)
    for (int i = 0; i < 2; ++i)
      for (int j = 0; j < 3; ++j) {
        double y = 0.0;
        for (int h = 0; h < 10; ++h) {
          double a = 0.0;
          for (int k = 0; k < 6; ++k) a += double(xs.data<float>()[(s * 2 + i) * 6 + k]) * double(w1s.data<float>()[k * 10 + h]);
          y += std::tanh(a) * double(w2s.data<float>()[h * 3 + j]);
        }
        worst = std::max(worst, std::abs(y - double(ys.data<float>()[(s * 2 + i) * 3 + j])));
      }
  std::printf("y %s over %lld steps in one call, largest difference from the loop %.3g\n",
              ys.shape().to_string().c_str(), static_cast<long long>(steps), worst);
  if (argc > 1) std::printf("%s", (*model)->profile_summary().c_str());
  return worst < 1e-5 ? 0 : 1;
}
