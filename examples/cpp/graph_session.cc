// examples/cpp/graph_session.cc: a graph recorded op by op (graph/builder.h),
// compiled (compiler/executable.h) and run in a session on this machine
// (runtime/session.h), its output checked against a plain loop.
//
//   graph_session        exits 0 when aspen's y = gelu(x w^T) matches the loop
#include <cmath>
#include <cstdio>
#include <memory>

#include "compiler/executable.h"
#include "graph/builder.h"
#include "runtime/session.h"

namespace {

int fail(const aspen::Status& s) {
  std::fprintf(stderr, "error: %s\n", s.to_string().c_str());
  return 1;
}

double gelu_tanh(double x) { return 0.5 * x * (1.0 + std::tanh(0.7978845608028654 * (x + 0.044715 * x * x * x))); }

}  // namespace

int main() {
  using namespace aspen;
  // Record: y = gelu(x · wᵀ), x [4, 8], w [16, 8] (PyTorch's Linear layout).
  graph::Graph g;
  graph::Builder b(g);
  graph::ValueId x = b.input("x", DType::f32, Shape{4, 8});
  graph::ValueId w = b.parameter("fc.weight", DType::f32, Shape{16, 8});
  graph::ValueId y = b.gelu(b.matmul(x, w, /*trans_a=*/false, /*trans_b=*/true));
  b.output("y", y);
  if (!b.status().is_ok()) return fail(b.status());

  // Compile once; the session owns the parameters and runs the program.
  Result<std::unique_ptr<compiler::Executable>> exe = compiler::compile(g);
  if (!exe.is_ok()) return fail(exe.status());
  Result<std::unique_ptr<runtime::Session>> session = runtime::Session::create(std::move(*exe));
  if (!session.is_ok()) return fail(session.status());

  Tensor xs(DType::f32, Shape{4, 8}), ws(DType::f32, Shape{16, 8});
  for (int64_t i = 0; i < xs.numel(); ++i) xs.data<float>()[i] = float(i % 7) * 0.25f - 0.75f;
  for (int64_t i = 0; i < ws.numel(); ++i) ws.data<float>()[i] = float(i % 5) * 0.1f - 0.2f;
  if (Status s = (*session)->set_parameter("fc.weight", ws); !s.is_ok()) return fail(s);
  Result<std::map<std::string, Tensor>> out = (*session)->run({{"x", &xs}});
  if (!out.is_ok()) return fail(out.status());

  // The same numbers by hand.
  const Tensor& ys = out->at("y");
  double worst = 0.0;
  for (int i = 0; i < 4; ++i)
    for (int j = 0; j < 16; ++j) {
      double acc = 0.0;
      for (int k = 0; k < 8; ++k) acc += double(xs.data<float>()[i * 8 + k]) * double(ws.data<float>()[j * 8 + k]);
      worst = std::max(worst, std::abs(gelu_tanh(acc) - double(ys.data<float>()[i * 16 + j])));
    }
  std::printf("y %s, largest difference from the loop %.3g\n", ys.shape().to_string().c_str(), worst);
  return worst < 1e-5 ? 0 : 1;
}
