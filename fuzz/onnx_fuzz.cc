// fuzz/onnx_fuzz.cc: libFuzzer target for the ONNX reader (io/onnx.h).
//
// The input is a whole .onnx file. read_onnx_model_from_bytes (no directory, so external data is
// refused) must give a Status; when it is ok, the description must hold what the reader promises: every
// tensor's bytes match its type and dims, and every value a node reads is defined before it.
#include <cstddef>
#include <cstdint>
#include <set>
#include <span>

#include "core/check.h"
#include "io/onnx.h"

namespace {

void check_tensor(const aspen::io::OnnxTensor& t) {
  ASPEN_CHECK(aspen::io::onnx_type_size(t.type) > 0) << t.name;
  ASPEN_CHECK(t.bytes.size() == size_t(t.numel()) * aspen::io::onnx_type_size(t.type)) << t.name;
}

void check_graph(const aspen::io::OnnxGraph& g, std::set<std::string> scope) {
  for (const auto& t : g.initializers) {
    check_tensor(t);
    scope.insert(t.name);
  }
  for (const auto& v : g.inputs) scope.insert(v.name);
  for (const auto& n : g.nodes) {
    for (const std::string& in : n.inputs) ASPEN_CHECK(in.empty() || scope.count(in)) << in;
    for (const auto& a : n.attributes) {
      for (const auto& t : a.tensors) check_tensor(t);
      for (const auto& sub : a.graphs) check_graph(*sub, scope);
    }
    for (const std::string& out : n.outputs) scope.insert(out);
  }
  for (const auto& v : g.outputs) ASPEN_CHECK(scope.count(v.name)) << v.name;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  auto m = aspen::io::read_onnx_model_from_bytes({reinterpret_cast<const std::byte*>(data), size}, "fuzz");
  if (!m.is_ok()) {
    ASPEN_CHECK(!m.status().message().empty());
    return 0;
  }
  ASPEN_CHECK(m->opset() >= 1);
  check_graph(m->graph, {});
  return 0;
}
