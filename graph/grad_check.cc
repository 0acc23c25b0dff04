#include "graph/grad_check.h"

#include "core/philox.h"
#include "graph/autodiff.h"
#include "graph/ops_util.h"

namespace aspen::graph::testing {

std::map<std::string, HostArray> random_feeds(const Graph& g, uint64_t seed, double lo, double hi, int64_t int_hi) {
  std::map<std::string, HostArray> feeds;
  uint64_t stream = 0;
  for (const Node& n : g.nodes()) {
    if (n.op != OpKind::input && n.op != OpKind::parameter) continue;
    HostArray a(g.type(n.outputs[0]));
    ++stream;
    for (size_t i = 0; i < a.data.size(); ++i) {
      const double u = bits_to_unit_float(philox_bits(seed, stream, i));
      a.data[i] = is_float(a.type.dtype) ? lo + (hi - lo) * u : double(int64_t(u * double(int_hi)));
    }
    feeds[n.name] = std::move(a);
  }
  return feeds;
}

ValueId weighted_loss(Builder& b, ValueId y, uint64_t seed) {
  const TensorType t = b.type(y);
  Tensor w(DType::f32, t.shape);
  philox_fill_uniform(w.span<float>(), seed, 99, 0, 0.5f, 1.5f);
  ValueId wc = b.constant(std::move(w));
  if (t.dtype != DType::f32) wc = b.cast(wc, t.dtype);
  std::vector<int64_t> axes;
  for (int i = 0; i < t.shape.rank(); ++i) axes.push_back(i);
  ValueId prod = b.mul(y, wc);
  return axes.empty() ? prod : b.reduce_sum(prod, axes);
}

::testing::AssertionResult check_gradients(const Graph& g, ValueId loss, const std::map<std::string, HostArray>& feeds,
                                           double max_nmse, double h) {
  Graph with_grads = g;
  std::vector<ValueId> wrt;
  std::vector<std::string> names;
  for (const Node& n : g.nodes())
    if ((n.op == OpKind::input || n.op == OpKind::parameter) && is_float(g.type(n.outputs[0]).dtype)) {
      wrt.push_back(n.outputs[0]);
      names.push_back(n.name);
    }
  auto grads = append_gradients(with_grads, loss, wrt);
  if (!grads.is_ok()) return ::testing::AssertionFailure() << "append_gradients: " << grads.status().to_string();
  for (size_t i = 0; i < wrt.size(); ++i) with_grads.add_output("grad:" + names[i], (*grads)[i]);
  auto analytic = interpret(with_grads, feeds);
  if (!analytic.is_ok()) return ::testing::AssertionFailure() << "interpret: " << analytic.status().to_string();

  Graph loss_only = g;
  loss_only.add_output("__loss", loss);
  std::map<std::string, HostArray> probe = feeds;
  for (size_t w = 0; w < wrt.size(); ++w) {
    const HostArray& got = analytic->at("grad:" + names[w]);
    std::vector<double>& x = probe[names[w]].data;
    double err = 0, ref = 0;
    for (size_t i = 0; i < x.size(); ++i) {
      const double saved = x[i];
      x[i] = saved + h;
      auto up = interpret(loss_only, probe);
      x[i] = saved - h;
      auto down = interpret(loss_only, probe);
      x[i] = saved;
      if (!up.is_ok() || !down.is_ok()) return ::testing::AssertionFailure() << "interpret while probing";
      const double numeric = (up->at("__loss").data[0] - down->at("__loss").data[0]) / (2 * h);
      err += (got.data[i] - numeric) * (got.data[i] - numeric);
      ref += numeric * numeric;
    }
    const double nmse = ref > 0 ? err / ref : err;
    if (!(nmse <= max_nmse))
      return ::testing::AssertionFailure() << "gradient of '" << names[w] << "': NMSE " << nmse << " > " << max_nmse;
  }
  return ::testing::AssertionSuccess();
}

}  // namespace aspen::graph::testing
