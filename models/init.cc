#include "models/init.h"

#include <cmath>

#include "core/philox.h"

namespace aspen::models {

namespace {

uint64_t fnv1a64(const std::string& s) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

}  // namespace

Result<std::map<std::string, Tensor>> init_weights(const graph::Graph& g, const InitOptions& o) {
  if (!(o.std > 0.0) || !std::isfinite(o.std))
    return Status::invalid_argument("init_weights: std", "a finite value > 0", std::to_string(o.std));
  if (o.n_layer < 1) return Status::invalid_argument("init_weights: n_layer", ">= 1", std::to_string(o.n_layer));
  std::map<std::string, Tensor> out;
  for (int32_t i : g.parameter_nodes()) {
    const graph::Node& n = g.node(i);
    if (n.name.rfind("state.", 0) == 0) continue;
    const graph::TensorType& t = g.type(n.outputs[0]);
    if (t.dtype != DType::f32)
      return Status::invalid_argument("init_weights: parameter '" + n.name + "'", "f32", t.to_string());
    Tensor w(DType::f32, t.shape);
    std::span<float> data = w.span<float>();
    const bool norm = n.name.find("ln_") != std::string::npos || n.name.find("layernorm") != std::string::npos ||
                      n.name.find("LayerNorm") != std::string::npos || ends_with(n.name, "norm.weight");
    if (ends_with(n.name, ".bias")) {
      std::fill(data.begin(), data.end(), 0.0f);
    } else if (norm) {
      std::fill(data.begin(), data.end(), 1.0f);
    } else {
      double sd = o.std;
      if (o.scaled_residual && ends_with(n.name, "c_proj.weight")) sd /= std::sqrt(2.0 * double(o.n_layer));
      philox_fill_normal(data, o.seed, fnv1a64(n.name), 0, 0.0f, float(sd));
    }
    out.emplace(n.name, std::move(w));
  }
  return out;
}

}  // namespace aspen::models
