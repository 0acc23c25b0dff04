// models/onnx_conformance_test.cc: ONNX's own backend node tests (Debian's libonnx-testdata: a model,
// its inputs and its expected outputs per case) through the importer, the compiler and a session.
//
// A case is claimed when its model is at an opset the importer reads (1 to 21), its inputs are tensors,
// and every op of it is one the importer converts at that opset (onnx_supported_ops, onnx_op_since). A case runs with its inputs fed at
// run time; where the importer needs an input known at import (a shape, axes, a Slice's bounds: what
// exporters write as constants), it runs again with the integer inputs bound as constants
// (OnnxImportOptions::constants), and then with all of them (the whole case folded at import). Every
// claimed case must pass (outputs within ONNX's backend tolerance: |got - want| <= 1e-3 |want| + 1e-7,
// shapes and dtypes equal), or be listed with its reason in testdata/onnx_conformance_failures.txt; a
// listed case that passes fails the test too, so the list stays true. The test prints a table of op ->
// cases passed / claimed, and the totals.
#include <dirent.h>
#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <fstream>
#include <map>
#include <set>
#include <sstream>

#include "compiler/executable.h"
#include "graph/interpreter.h"
#include "io/onnx.h"
#include "models/onnx_import.h"
#include "runtime/session.h"

namespace aspen::models {
namespace {

const std::string kNodeTests = "/usr/share/libonnx-testdata/data/node";

std::vector<std::string> list_dir(const std::string& dir, const std::string& prefix) {
  std::vector<std::string> out;
  if (DIR* d = opendir(dir.c_str())) {
    while (dirent* e = readdir(d)) {
      const std::string n = e->d_name;
      if (n.rfind(prefix, 0) == 0) out.push_back(n);
    }
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

std::map<std::string, std::string> expected_failures() {
  std::map<std::string, std::string> out;
  std::ifstream in(std::string(ASPEN_MODELS_TESTDATA) + "/onnx_conformance_failures.txt");
  EXPECT_TRUE(in) << "testdata/onnx_conformance_failures.txt";
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty() || line[0] == '#') continue;
    const size_t tab = line.find('\t');
    EXPECT_NE(tab, std::string::npos) << "expected case<TAB>reason, found '" << line << "'";
    if (tab != std::string::npos) out[line.substr(0, tab)] = line.substr(tab + 1);
  }
  return out;
}

// Runs one case; an error Status says why it fails. `bind`: which inputs are bound as constants at import
// (0: none; 1: the integer ones, as exporters write shapes and axes; 2: all).
Status run_case(const std::string& dir, int bind) {
  ASPEN_ASSIGN_OR_RETURN(io::OnnxModel m, io::read_onnx_model(dir + "/model.onnx"));
  const std::vector<std::string> sets = list_dir(dir, "test_data_set_");
  if (sets.empty()) return Status::invalid_argument(dir, "a test_data_set_0", "none");
  const std::string set = dir + "/" + sets[0];
  std::map<std::string, Tensor> inputs;
  OnnxImportOptions opts;
  for (size_t k = 0; k < m.graph.inputs.size(); ++k) {
    ASPEN_ASSIGN_OR_RETURN(io::OnnxTensor t, io::read_onnx_tensor(set + "/input_" + std::to_string(k) + ".pb"));
    ASPEN_ASSIGN_OR_RETURN(Tensor x, tensor_from_onnx(t, "input " + std::to_string(k)));
    const std::string& name = m.graph.inputs[k].name;
    opts.input_shapes[name] = t.dims;
    inputs.emplace(name, std::move(x));
    const DType dt = inputs.at(name).dtype();
    if (bind == 2 || (bind == 1 && (dt == DType::i64 || dt == DType::i32))) {
      opts.constants[name] = &inputs.at(name);
      opts.input_shapes.erase(name);
    }
  }
  ASPEN_ASSIGN_OR_RETURN(OnnxImport imp, import_onnx(m, opts));
  ASPEN_ASSIGN_OR_RETURN(auto exe, compiler::compile(imp.graph, {}));
  ASPEN_ASSIGN_OR_RETURN(auto session, runtime::Session::create(std::move(exe), {}));
  for (const auto& [name, t] : imp.weights) ASPEN_RETURN_IF_ERROR(session->set_parameter(name, t));
  std::map<std::string, const Tensor*> feed;
  for (const auto& [name, t] : inputs)
    if (!opts.constants.count(name)) feed[name] = &t;
  ASPEN_ASSIGN_OR_RETURN(auto outs, session->run(feed));
  for (size_t k = 0; k < m.graph.outputs.size(); ++k) {
    const std::string& name = m.graph.outputs[k].name;
    ASPEN_ASSIGN_OR_RETURN(io::OnnxTensor w, io::read_onnx_tensor(set + "/output_" + std::to_string(k) + ".pb"));
    ASPEN_ASSIGN_OR_RETURN(Tensor want, tensor_from_onnx(w, "output " + name));
    auto it = outs.find(name);
    if (it == outs.end()) return Status::invalid_argument("output " + name, "an output", "none");
    const Tensor& got = it->second;
    if (got.dtype() != want.dtype() || got.shape() != want.shape())
      return Status::invalid_argument("output " + name,
                                      std::string(dtype_name(want.dtype())) + want.shape().to_string(),
                                      std::string(dtype_name(got.dtype())) + got.shape().to_string());
    const auto g = graph::HostArray::from_tensor(got), e = graph::HostArray::from_tensor(want);
    for (size_t i = 0; i < e.data.size(); ++i) {
      const double a = g.data[i], b = e.data[i];
      if (std::isnan(a) && std::isnan(b)) continue;
      if (a == b) continue;
      if (!(std::fabs(a - b) <= 1e-3 * std::fabs(b) + 1e-7))
        return Status::invalid_argument("output " + name + " element " + std::to_string(i), std::to_string(b),
                                        std::to_string(a));
    }
  }
  return Status();
}

TEST(OnnxConformance, BackendNodeTests) {
  ASSERT_EQ(access(kNodeTests.c_str(), R_OK), 0)
      << kNodeTests << ": install libonnx-testdata (scripts/install-deps.sh)";
  const std::vector<std::string> ops = onnx_supported_ops();
  const std::set<std::string> supported(ops.begin(), ops.end());
  const std::map<std::string, std::string> failures = expected_failures();
  std::map<std::string, std::pair<int, int>> table;  // op -> passed, claimed
  int claimed = 0, passed = 0, listed = 0, all = 0, bound = 0;
  for (const std::string& name : list_dir(kNodeTests, "test_")) {
    const std::string dir = kNodeTests + "/" + name;
    auto m = io::read_onnx_model(dir + "/model.onnx");
    ++all;
    if (!m.is_ok()) continue;  // (a case the reader refuses is no claim: its ops are not asked for)
    std::set<std::string> case_ops;
    bool ours = !m->graph.nodes.empty() && m->opset() >= 1 && m->opset() <= 21;
    for (const io::OnnxValueInfo& v : m->graph.inputs) ours = ours && v.type != 0;
    for (const io::OnnxNode& n : m->graph.nodes) {
      ours = ours && n.domain.empty() && supported.count(n.op_type) && onnx_op_since(n.op_type) <= m->opset();
      case_ops.insert(n.op_type);
    }
    if (!ours) continue;
    ++claimed;
    Status s = run_case(dir, 0);
    for (int bind = 1;
         bind <= 2 && !s.is_ok() && s.message().find("known when the model is imported") != std::string::npos; ++bind) {
      s = run_case(dir, bind);
      bound += s.is_ok();
    }
    auto f = failures.find(name);
    if (s.is_ok()) {
      ++passed;
      EXPECT_TRUE(f == failures.end()) << name << " passes but is listed as failing (" << f->second << ")";
    } else if (f == failures.end()) {
      ADD_FAILURE() << name << ": " << s.to_string();
    } else {
      ++listed;
    }
    for (const std::string& op : case_ops) {
      table[op].second++;
      table[op].first += s.is_ok();
    }
  }
  for (const auto& [name, reason] : failures)
    if (access((kNodeTests + "/" + name).c_str(), R_OK) != 0) ADD_FAILURE() << name << " is listed but not a case";
  std::ostringstream report;
  report << "ONNX backend node tests: " << passed << " of " << claimed << " claimed cases pass (" << listed
         << " listed failures; " << bound << " with inputs bound at import), " << all << " cases in all\n";
  for (const auto& [op, pc] : table) report << "  " << op << ": " << pc.first << "/" << pc.second << "\n";
  std::printf("%s", report.str().c_str());
  EXPECT_GT(claimed, 100);
}

}  // namespace
}  // namespace aspen::models
