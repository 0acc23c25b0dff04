// models/onnx_import_test.cc: models as PyTorch's exporters write them (testdata/onnx/, made by
// scripts/golden/make_onnx_golden.py: model, inputs and onnxruntime's outputs) imported, compiled and run,
// against onnxruntime within 1e-5 of each output's scale; and the importer's refusals, worded.
#include "models/onnx_import.h"

#include <dirent.h>
#include <gtest/gtest.h>

#include <functional>

#include <cmath>
#include <fstream>
#include <iterator>
#include <set>
#include <span>
#include <sstream>

#include "compiler/executable.h"
#include "graph/interpreter.h"
#include "io/onnx.h"
#include "runtime/session.h"

namespace aspen::models {
namespace {

const std::string kDir = std::string(ASPEN_MODELS_TESTDATA) + "/onnx";

struct Case {
  io::OnnxModel model;
  OnnxImportOptions options;
  std::map<std::string, Tensor> inputs;
  std::vector<Tensor> want;
};

Result<Case> load_case(const std::string& name) {
  const std::string dir = kDir + "/" + name;
  Case c;
  ASPEN_ASSIGN_OR_RETURN(c.model, io::read_onnx_model(dir + "/model.onnx"));
  std::ifstream dims(dir + "/dims.txt");
  std::string sym;
  int64_t extent;
  while (dims >> sym >> extent) c.options.dims[sym] = extent;
  for (size_t k = 0; k < c.model.graph.inputs.size(); ++k) {
    ASPEN_ASSIGN_OR_RETURN(io::OnnxTensor t, io::read_onnx_tensor(dir + "/input_" + std::to_string(k) + ".pb"));
    ASPEN_ASSIGN_OR_RETURN(Tensor x, tensor_from_onnx(t, "input " + t.name));
    c.inputs.emplace(c.model.graph.inputs[k].name, std::move(x));
  }
  for (size_t k = 0; k < c.model.graph.outputs.size(); ++k) {
    ASPEN_ASSIGN_OR_RETURN(io::OnnxTensor t, io::read_onnx_tensor(dir + "/output_" + std::to_string(k) + ".pb"));
    ASPEN_ASSIGN_OR_RETURN(Tensor y, tensor_from_onnx(t, "output " + t.name));
    c.want.push_back(std::move(y));
  }
  return c;
}

std::vector<std::string> cases() {
  std::vector<std::string> out;
  if (DIR* d = opendir(kDir.c_str())) {
    while (dirent* e = readdir(d))
      if (e->d_name[0] != '.') out.push_back(e->d_name);
    closedir(d);
  }
  std::sort(out.begin(), out.end());
  return out;
}

class OnnxExported : public ::testing::TestWithParam<std::string> {};

TEST_P(OnnxExported, MatchesOnnxRuntime) {
  auto c = load_case(GetParam());
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto imp = import_onnx(c->model, c->options);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  auto exe = compiler::compile(imp->graph, {});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  auto session = runtime::Session::create(std::move(*exe), {});
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  for (const auto& [name, t] : imp->weights) ASSERT_TRUE((*session)->set_parameter(name, t).is_ok()) << name;
  std::map<std::string, const Tensor*> feed;
  for (const auto& [name, t] : c->inputs) feed[name] = &t;
  auto out = (*session)->run(feed);
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(imp->outputs.size(), c->want.size());
  for (size_t k = 0; k < c->want.size(); ++k) {
    const std::string& name = imp->outputs[k];
    SCOPED_TRACE("output " + name);
    const Tensor& got = out->at(name);
    ASSERT_EQ(got.dtype(), c->want[k].dtype());
    ASSERT_EQ(got.shape(), c->want[k].shape());
    const auto g = graph::HostArray::from_tensor(got), w = graph::HostArray::from_tensor(c->want[k]);
    double scale = 0, err = 0;
    for (size_t i = 0; i < w.data.size(); ++i) {
      scale = std::max(scale, std::fabs(w.data[i]));
      err = std::max(err, std::fabs(g.data[i] - w.data[i]));
    }
    EXPECT_LE(err, 1e-5 * std::max(scale, 1e-30)) << "max |aspen - onnxruntime| " << err << ", scale " << scale;
  }
}

INSTANTIATE_TEST_SUITE_P(Exports, OnnxExported, ::testing::ValuesIn(cases()),
                         [](const ::testing::TestParamInfo<std::string>& p) { return p.param; });

TEST(OnnxImport, EveryExportIsHere) { EXPECT_GE(cases().size(), 8u) << kDir; }

TEST(OnnxImport, UnknownOpsAreListedAllAtOnce) {
  auto c = load_case("mlp_ts");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  c->model.graph.nodes[1].op_type = "FancyOp";
  c->model.graph.nodes[3].domain = "com.microsoft";
  c->model.graph.nodes[3].op_type = "QAttention";
  auto r = import_onnx(c->model, c->options);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().code(), Code::kUnimplemented);
  const std::string msg = r.status().message();
  EXPECT_NE(msg.find("2 node(s): expected ops the importer converts"), std::string::npos) << msg;
  EXPECT_NE(msg.find("node 1 '" + c->model.graph.nodes[1].name + "' (FancyOp) at opset 17"), std::string::npos) << msg;
  EXPECT_NE(msg.find("(com.microsoft.QAttention) (domain not imported)"), std::string::npos) << msg;
}

TEST(OnnxImport, SymbolicDimensionsMustBeBound) {
  auto c = load_case("mlp_ts");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto r = import_onnx(c->model, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("symbolic dimensions: expected an extent for each (dims, or input_shapes), found "
                                      "none for 'batch'"),
            std::string::npos)
      << r.status().message();
  // Bound another way: the input's whole shape; one that contradicts a fixed extent is refused.
  OnnxImportOptions o;
  o.input_shapes["x"] = {5, 12};
  auto ok = import_onnx(c->model, o);
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
  EXPECT_EQ(ok->graph.type(*ok->graph.find_output(ok->outputs[0])).shape, (Shape{5, 5}));
  o.input_shapes["x"] = {5, 13};
  auto bad = import_onnx(c->model, o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().message().find("shape: expected one that fits the declared [batch, 12], found [5, 13]"),
            std::string::npos)
      << bad.status().message();
}

TEST(OnnxImport, OpsetsOutsideTheRangeAreRefused) {
  auto c = load_case("mlp_ts");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  c->model.opsets[""] = 22;
  auto r = import_onnx(c->model, c->options);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("opset of the default domain: expected 1 to 21"), std::string::npos)
      << r.status().message();
  c->model.opsets[""] = 11;  // below 13: op by op (LayerNormalization exists from 17)
  r = import_onnx(c->model, c->options);
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().message().find("(LayerNormalization) at opset 11, converted from opset 17 on"),
            std::string::npos)
      << r.status().message();
}

// Float initializers are parameters: every weight of the model is there, by its file name, and trains.
TEST(OnnxImport, FloatInitializersAreParameters) {
  auto c = load_case("mlp_dynamo");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto imp = import_onnx(c->model, c->options);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  size_t floats = 0;
  for (const io::OnnxTensor& t : c->model.graph.initializers)
    floats += t.type == int32_t(io::OnnxType::f32) && t.numel() > 1;  // one element: an exporter's scalar
  EXPECT_EQ(imp->weights.size(), floats);
  EXPECT_EQ(imp->graph.parameter_nodes().size(), floats);
  EXPECT_TRUE(imp->weights.count("fc1.weight")) << "the exporter's names are kept";
}

// keras_mlp's Dense has GELU's tanh form, which tf2onnx writes as eight elementwise nodes: the import
// holds one gelu {tanh=1} that the loss's gradient then runs through, and no tanh (dead pieces aside).
TEST(OnnxImport, GeluInPiecesBecomesOneOp) {
  auto c = load_case("keras_mlp");
  ASSERT_TRUE(c.is_ok()) << c.status().to_string();
  auto imp = import_onnx(c->model, c->options);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  int gelus = 0;
  for (const graph::Node& n : imp->graph.nodes())
    if (n.op == graph::OpKind::gelu) {
      ++gelus;
      EXPECT_EQ(n.attrs.i("tanh"), 1);
    }
  EXPECT_EQ(gelus, 1);
  bool tanh_reachable = false;
  for (graph::ValueId root : imp->graph.roots()) {
    std::vector<graph::ValueId> stack = {root};
    std::set<int32_t> seen;
    while (!stack.empty()) {
      const graph::ValueId v = stack.back();
      stack.pop_back();
      const int32_t p = imp->graph.value(v).producer;
      if (p < 0 || !seen.insert(p).second) continue;
      const graph::Node& n = imp->graph.node(p);
      tanh_reachable = tanh_reachable || n.op == graph::OpKind::tanh;
      for (graph::ValueId in : n.inputs) stack.push_back(in);
    }
  }
  EXPECT_FALSE(tanh_reachable) << "the outputs still read the pieces";
}

}  // namespace
}  // namespace aspen::models

namespace aspen::models {
namespace {

// Hostile models: every exported model with bytes flipped at random places, many times over. Each
// either fails to read or to import with a Status, or imports into a graph the verifier accepts;
// nothing crashes (the reader's fuzz target covers the bytes; this covers what the converters make of a
// well-formed but wrong model: bad attributes, mismatched shapes, odd types).
TEST(OnnxImport, CorruptedExportsFailCleanly) {
  uint64_t state = 12345;
  auto next = [&state] {
    state = state * 6364136223846793005ull + 1442695040888963407ull;
    return state >> 33;
  };
  int imported = 0, refused = 0;
  for (const std::string& name : cases()) {
    std::ifstream f(kDir + "/" + name + "/model.onnx", std::ios::binary);
    const std::string good((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
    ASSERT_FALSE(good.empty()) << name;
    std::ifstream dims(kDir + "/" + name + "/dims.txt");
    OnnxImportOptions o;
    std::string sym;
    int64_t extent;
    while (dims >> sym >> extent) o.dims[sym] = extent;
    for (int trial = 0; trial < 150; ++trial) {
      std::string bad = good;
      const int flips = 1 + int(next() % 4);
      for (int k = 0; k < flips; ++k) bad[next() % bad.size()] = char(next() & 0xff);
      auto m = io::read_onnx_model_from_bytes(std::as_bytes(std::span(bad.data(), bad.size())), name);
      if (!m.is_ok()) {
        ++refused;
        continue;
      }
      auto imp = import_onnx(*m, o);
      if (imp.is_ok()) {
        ++imported;
      } else {
        ++refused;
        EXPECT_FALSE(imp.status().message().empty());
      }
    }
  }
  EXPECT_GT(imported + refused, 1000);
}

}  // namespace
}  // namespace aspen::models

namespace aspen::models {
namespace {

// Models made by hand for the tests below: inputs, integer initializers, nodes and outputs by name.
struct HandModel {
  io::OnnxModel m;
  explicit HandModel(const std::string& path) {
    m.path = path;
    m.ir_version = 8;
    m.opsets[""] = 17;
  }
  HandModel& input(const std::string& name, const std::vector<int64_t>& dims) {  // f32
    io::OnnxValueInfo v;
    v.name = name;
    v.type = int32_t(io::OnnxType::f32);
    v.has_shape = true;
    v.dims.resize(dims.size());
    for (size_t i = 0; i < dims.size(); ++i) v.dims[i].value = dims[i];
    m.graph.inputs.push_back(v);
    return *this;
  }
  HandModel& ints(const std::string& name, const std::vector<int64_t>& values, bool i32 = false) {
    io::OnnxTensor t;
    t.name = name;
    t.type = int32_t(i32 ? io::OnnxType::i32 : io::OnnxType::i64);
    t.dims = {int64_t(values.size())};
    for (int64_t value : values) {
      const int32_t narrow = int32_t(value);
      t.bytes.append(i32 ? reinterpret_cast<const char*>(&narrow) : reinterpret_cast<const char*>(&value), i32 ? 4 : 8);
    }
    m.graph.initializers.push_back(t);
    return *this;
  }
  HandModel& zeros(const std::string& name, const std::vector<int64_t>& dims) {  // an f32 initializer
    io::OnnxTensor t;
    t.name = name;
    t.type = int32_t(io::OnnxType::f32);
    t.dims = dims;
    t.bytes.assign(size_t(t.numel()) * 4, '\0');
    m.graph.initializers.push_back(t);
    return *this;
  }
  HandModel& node(const std::string& name, const std::string& op, const std::vector<std::string>& in,
                  const std::string& out, const std::vector<io::OnnxAttribute>& attributes = {}) {
    io::OnnxNode n;
    n.name = name;
    n.op_type = op;
    n.inputs = in;
    n.outputs = {out};
    n.attributes = attributes;
    m.graph.nodes.push_back(n);
    return *this;
  }
  HandModel& output(const std::string& name) {
    io::OnnxValueInfo v;
    v.name = name;
    m.graph.outputs.push_back(v);
    return *this;
  }
};

// A model written by hand as the reader's description: Concat of pieces empty on another axis keeps
// every piece's extent on its own axis ([0, 3] and [0, 5] on axis 1 make [0, 8]).
TEST(OnnxImport, ConcatOfEmptyPieces) {
  io::OnnxAttribute axis;
  axis.name = "axis";
  axis.type = io::OnnxAttrType::i;
  axis.i = 1;
  const HandModel h =
      HandModel("hand.onnx").input("a", {0, 3}).input("b", {0, 5}).node("cat", "Concat", {"a", "b"}, "y", {axis}).output("y");
  auto imp = import_onnx(h.m);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  EXPECT_EQ(imp->graph.type(*imp->graph.find_output("y")).shape, (Shape{0, 8}));
}

// Pipeline stage tags: by node-name prefixes (OnnxImportOptions::stage_begins), or by each node's
// "aspen.stage" metadata; every IR node an ONNX node becomes carries its stage, and bad tags are named.
TEST(OnnxImport, StagesFromNamePrefixesOrMetadata) {
  HandModel h = HandModel("staged.onnx").input("x", {2, 3});
  h.node("enc/relu", "Relu", {"x"}, "a").node("enc/neg", "Neg", {"a"}, "b").node("dec/exp", "Exp", {"b"}, "c");
  h.node("dec/sig", "Sigmoid", {"c"}, "d").output("d");
  auto stage_of = [](const OnnxImport& imp, graph::OpKind op) {
    for (const graph::Node& n : imp.graph.nodes())
      if (n.op == op) return n.stage;
    return -2;
  };
  OnnxImportOptions prefixes;
  prefixes.stage_begins = {"enc/neg", "dec/"};
  auto by_prefix = import_onnx(h.m, prefixes);
  ASSERT_TRUE(by_prefix.is_ok()) << by_prefix.status().to_string();
  EXPECT_EQ(stage_of(*by_prefix, graph::OpKind::relu), 0);
  EXPECT_EQ(stage_of(*by_prefix, graph::OpKind::neg), 1);
  EXPECT_EQ(stage_of(*by_prefix, graph::OpKind::exp), 2);
  EXPECT_EQ(stage_of(*by_prefix, graph::OpKind::sigmoid), 2);
  prefixes.stage_begins = {"dec/", "enc/"};  // enc/ is before dec/: no later node
  auto missing = import_onnx(h.m, prefixes);
  ASSERT_FALSE(missing.is_ok());
  EXPECT_EQ(missing.status().subject(), "staged.onnx: stage 2's beginning 'enc/'") << missing.status().to_string();

  HandModel empty = HandModel("empty.onnx").input("x", {1});
  empty.output("x");
  {
    OnnxImportOptions o;
    o.stage_begins = {"a"};
    auto none = import_onnx(empty.m, o);  // no node to begin a stage at
    ASSERT_FALSE(none.is_ok());
    EXPECT_EQ(none.status().subject(), "empty.onnx: stage 1's beginning 'a'") << none.status().to_string();
  }

  h.m.graph.nodes[0].metadata = {{"aspen.stage", "0"}};
  h.m.graph.nodes[2].metadata = {{"pkg.torch.onnx.name_scopes", "['', 'dec']"}, {"aspen.stage", "1"}};
  auto by_metadata = import_onnx(h.m);
  ASSERT_TRUE(by_metadata.is_ok()) << by_metadata.status().to_string();
  EXPECT_EQ(stage_of(*by_metadata, graph::OpKind::relu), 0);
  EXPECT_EQ(stage_of(*by_metadata, graph::OpKind::neg), -1);  // untagged: the pipeline takes its inputs' stage
  EXPECT_EQ(stage_of(*by_metadata, graph::OpKind::exp), 1);
  h.m.graph.nodes[3].metadata = {{"aspen.stage", "two"}};
  auto bad = import_onnx(h.m);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("metadata aspen.stage"), std::string::npos) << bad.status().to_string();
  EXPECT_NE(bad.status().to_string().find("'two'"), std::string::npos) << bad.status().to_string();
}

// NOTE [name scopes]: an imported node's scope is the module path its exporter wrote into its name
// (torch.onnx "/transformer/h.0/attn/MatMul", tf2onnx "model/dense/MatMul"); a bare name gives none.
TEST(OnnxImport, ScopesFromTheExportersNodeNames) {
  HandModel h = HandModel("scoped.onnx").input("x", {2, 3});
  h.node("/transformer/h.0/attn/Relu", "Relu", {"x"}, "a").node("model/dense/Neg", "Neg", {"a"}, "b");
  h.node("Exp_7", "Exp", {"b"}, "c").node("//odd//Sigmoid", "Sigmoid", {"c"}, "d").output("d");
  auto imp = import_onnx(h.m);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  auto scope_of = [&](graph::OpKind op) {
    for (const graph::Node& n : imp->graph.nodes())
      if (n.op == op) return n.scope;
    return std::string("(none)");
  };
  EXPECT_EQ(scope_of(graph::OpKind::relu), "transformer.h.0.attn");
  EXPECT_EQ(scope_of(graph::OpKind::neg), "model.dense");
  EXPECT_EQ(scope_of(graph::OpKind::exp), "");
  EXPECT_EQ(scope_of(graph::OpKind::sigmoid), "odd");
}

// Slice's bounds as exporters write them, against ONNX's definition of Slice: every
// start and end of the families below crossed with steps of both signs, as int64 and int32, given as
// initializers and computed at import (an Add of zero, folded through the reference interpreter: where
// torch's training export held the open end 2^63 - 1 as the double 2^63 and read it back as INT64_MIN).
TEST(OnnxImport, SliceBoundsClampAsOnnxSays) {
  constexpr int64_t d = 7;
  const std::vector<int64_t> bounds = {INT64_MIN, INT64_MIN + 1, -100, -d - 1, -d, -3, -1, 0, 1, 3, d - 1, d,
                                       d + 1, 100, INT64_MAX - 1, INT64_MAX};
  const std::vector<int64_t> steps = {-3, -2, -1, 1, 2, 3};
  // ONNX's definition (opset 13), on one axis of length d: a negative bound counts from the end; for a
  // positive step both are clamped to [0, d], for a negative one the start to [0, d - 1] and the end to
  // [-1, d - 1]. (numpy and Python differ only for a start below -d with a negative step: onnxruntime and the
  // spec take element 0 there.)
  const auto onnx_slice = [&](int64_t b, int64_t e, int64_t step) {
    b = b < 0 ? b + d : b;
    e = e < 0 ? e + d : e;
    b = step < 0 ? std::clamp<int64_t>(b, 0, d - 1) : std::clamp<int64_t>(b, 0, d);
    e = step < 0 ? std::clamp<int64_t>(e, -1, d - 1) : std::clamp<int64_t>(e, 0, d);
    std::vector<double> out;
    for (int64_t i = b; step > 0 ? i < e : i > e; i += step) out.push_back(double(i));
    return out;
  };
  graph::HostArray x(graph::TensorType{DType::f32, Shape{d}});
  for (int64_t i = 0; i < d; ++i) x.data[size_t(i)] = double(i);
  int checked = 0;
  for (const bool i32 : {false, true})
    for (const bool folded : {false, true})
      for (int64_t b : bounds)
        for (int64_t e : bounds)
          for (int64_t step : steps) {
            const auto narrow = [&](int64_t v) { return i32 ? std::clamp<int64_t>(v, INT32_MIN, INT32_MAX) : v; };
            const int64_t nb = narrow(b), ne = narrow(e);
            HandModel h("slice.onnx");
            h.input("x", {d}).ints("starts", {nb}, i32).ints("ends0", {ne}, i32).ints("axes", {0}, i32);
            h.ints("steps", {step}, i32).ints("zero", {0}, i32);
            if (folded) h.node("add_zero", "Add", {"ends0", "zero"}, "ends");
            h.node("slice", "Slice", {"x", "starts", folded ? "ends" : "ends0", "axes", "steps"}, "y").output("y");
            SCOPED_TRACE("x[" + std::to_string(nb) + ":" + std::to_string(ne) + ":" + std::to_string(step) + "]" +
                         (i32 ? " int32" : " int64") + (folded ? ", end folded" : ""));
            auto imp = import_onnx(h.m);
            ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
            auto out = graph::interpret(imp->graph, {{"x", x}});
            ASSERT_TRUE(out.is_ok()) << out.status().to_string();
            EXPECT_EQ(out->at("y").data, onnx_slice(nb, ne, step));
            ++checked;
          }
  EXPECT_EQ(checked, 2 * 2 * 16 * 16 * 6);
}

// A bad step is named with the node.
TEST(OnnxImport, SliceStepZeroIsRefusedByName) {
  const HandModel h = HandModel("slice.onnx")
                          .input("x", {4})
                          .ints("starts", {0})
                          .ints("ends", {3})
                          .ints("axes", {0})
                          .ints("steps", {0})
                          .node("my_slice", "Slice", {"x", "starts", "ends", "axes", "steps"}, "y")
                          .output("y");
  auto imp = import_onnx(h.m);
  ASSERT_FALSE(imp.is_ok());
  EXPECT_NE(imp.status().message().find("'my_slice' (Slice)"), std::string::npos) << imp.status().message();
  EXPECT_NE(imp.status().message().find("input 'steps': expected nonzero steps, found 0 on axis 0"),
            std::string::npos)
      << imp.status().message();
}

// Errors raised while building an imported graph name the user's ONNX node and file, not aspen's own
// nodes: a reshape to the wrong element count (worded by the converter), and a layer norm whose scale
// does not broadcast to the normalized axes (worded by the graph builder, put under the ONNX node).
TEST(OnnxImport, BuildErrorsNameTheOnnxNode) {
  const auto one_node = [](HandModel h, const std::string& op) {  // x [2, 3] and the initializer w
    return h.input("x", {2, 3}).node("/encoder/layer.0/" + op, op, {"x", "w"}, "y").output("y").m;
  };
  auto r = import_onnx(one_node(HandModel("user.onnx").ints("w", {4, 2}), "Reshape"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "node 0 '/encoder/layer.0/Reshape' (Reshape) at opset 17: input 'shape': expected extents whose product "
            "is 6 (the elements of input 'data', f32[2, 3]), found [4, 2] (8 elements)");
  r = import_onnx(one_node(HandModel("user.onnx").zeros("w", {5}), "LayerNormalization"));
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message().rfind(
                "user.onnx: node 0 '/encoder/layer.0/LayerNormalization' (LayerNormalization) at opset 17: ", 0),
            0u)
      << r.status().message();
}

// The activations the importer decomposes, against their ONNX definitions in double over values from
// -40 to 40 (a large positive x must not overflow the negative part's exp), with default attributes.
TEST(OnnxImport, ActivationsMatchTheirDefinitions) {
  const std::vector<std::pair<std::string, std::function<double(double)>>> ops = {
      {"LeakyRelu", [](double x) { return x < 0 ? 0.01 * x : x; }},
      {"Elu", [](double x) { return x < 0 ? std::exp(x) - 1 : x; }},
      {"Selu", [](double x) { return 1.0507009873554804934193349852946 *
                                     (x <= 0 ? 1.6732632423543772848170429916717 * (std::exp(x) - 1) : x); }},
      {"Celu", [](double x) { return std::max(0.0, x) + std::min(0.0, std::exp(x) - 1); }},
      {"ThresholdedRelu", [](double x) { return x > 1 ? x : 0; }},
      {"HardSigmoid", [](double x) { return std::max(0.0, std::min(1.0, 0.2 * x + 0.5)); }},
      {"HardSwish", [](double x) { return x * std::max(0.0, std::min(1.0, x / 6 + 0.5)); }},
      {"Softplus", [](double x) { return std::log1p(std::exp(x)); }},
      {"Softsign", [](double x) { return x / (1 + std::fabs(x)); }},
      {"Mish", [](double x) { return x * std::tanh(std::log1p(std::exp(x))); }},
      {"Sin", [](double x) { return std::sin(x); }},
      {"Cos", [](double x) { return std::cos(x); }},
      {"Round", [](double x) { return std::nearbyint(x); }},
  };
  std::vector<double> xs;
  for (int i = 0; i <= 160; ++i) xs.push_back(-40.0 + 0.5 * i + (i % 3 == 0 ? 0.0 : 0.13));
  HandModel h("act.onnx");
  h.m.opsets[""] = 18;
  h.input("x", {int64_t(xs.size())});
  for (const auto& [op, f] : ops) h.node(op, op, {"x"}, op).output(op);
  auto imp = import_onnx(h.m);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  auto out = graph::interpret(imp->graph, {{"x", graph::HostArray(graph::TensorType{DType::f32, Shape{int64_t(xs.size())}}, xs)}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (const auto& [op, f] : ops)
    for (size_t i = 0; i < xs.size(); ++i) {
      const double want = f(double(float(xs[i]))), got = out->at(op).data[i];
      EXPECT_NEAR(got, want, 1e-5 * std::max(1.0, std::fabs(want))) << op << " at " << xs[i];
    }
}

// LpPool (p = 3, a 2x2 window, stride 1, pads 1: the pads count as zeros) and GlobalLpPool (p = 2) against
// their definition, (sum |x|^p)^(1/p), on values of both signs.
TEST(OnnxImport, LpPoolsMatchTheirDefinition) {
  auto attr_i = [](const char* name, int64_t v) {
    io::OnnxAttribute a;
    a.name = name, a.type = io::OnnxAttrType::i, a.i = v;
    return a;
  };
  auto attr_ints = [](const char* name, std::vector<int64_t> v) {
    io::OnnxAttribute a;
    a.name = name, a.type = io::OnnxAttrType::ints, a.ints = std::move(v);
    return a;
  };
  HandModel h("lp.onnx");
  h.input("x", {1, 2, 3, 3})
      .node("lp", "LpPool", {"x"}, "lp",
            {attr_i("p", 3), attr_ints("kernel_shape", {2, 2}), attr_ints("pads", {1, 1, 1, 1})})
      .output("lp")
      .node("glp", "GlobalLpPool", {"x"}, "glp", {attr_i("p", 2)})
      .output("glp");
  auto imp = import_onnx(h.m);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  std::vector<double> x(18);
  for (size_t i = 0; i < x.size(); ++i) x[i] = double(i % 5) - 1.5 + 0.25 * double(i / 9);
  auto out = graph::interpret(imp->graph, {{"x", graph::HostArray(graph::TensorType{DType::f32, Shape{1, 2, 3, 3}}, x)}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  ASSERT_EQ(out->at("lp").data.size(), 2u * 4 * 4);
  for (int c = 0; c < 2; ++c) {
    double sq = 0;
    for (int i = 0; i < 9; ++i) sq += x[size_t(c * 9 + i)] * x[size_t(c * 9 + i)];
    EXPECT_NEAR(out->at("glp").data[size_t(c)], std::sqrt(sq), 1e-5);
    for (int oh = 0; oh < 4; ++oh)
      for (int ow = 0; ow < 4; ++ow) {
        double s = 0;
        for (int kh = 0; kh < 2; ++kh)
          for (int kw = 0; kw < 2; ++kw) {
            const int ih = oh - 1 + kh, iw = ow - 1 + kw;
            if (ih >= 0 && ih < 3 && iw >= 0 && iw < 3) s += std::pow(std::fabs(x[size_t(c * 9 + ih * 3 + iw)]), 3);
          }
        EXPECT_NEAR(out->at("lp").data[size_t(c * 16 + oh * 4 + ow)], std::cbrt(s), 1e-5) << c << " " << oh << " " << ow;
      }
  }
}

// Einsum with an ellipsis, numpy's rule: "...ij,...jk->...ik" over batch axes that broadcast ([2, 1] with
// [3]), and the implicit output "...ij,jk" (the ellipsis first), against the products by hand.
TEST(OnnxImport, EinsumEllipsisBroadcastsAsNumpy) {
  auto equation = [](const char* e) {
    io::OnnxAttribute a;
    a.name = "equation", a.type = io::OnnxAttrType::s, a.s = e;
    return a;
  };
  HandModel h("einsum.onnx");
  h.input("a", {2, 1, 2, 3}).input("b", {3, 3, 4}).input("w", {3, 4})
      .node("bmm", "Einsum", {"a", "b"}, "y", {equation("...ij,...jk->...ik")})
      .output("y")
      .node("implicit", "Einsum", {"a", "w"}, "z", {equation("...ij,jk")})
      .output("z");
  auto imp = import_onnx(h.m);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  std::vector<double> a(12), b(36), w(12);
  for (size_t i = 0; i < a.size(); ++i) a[i] = std::sin(double(i) + 0.5);
  for (size_t i = 0; i < b.size(); ++i) b[i] = std::cos(0.7 * double(i));
  for (size_t i = 0; i < w.size(); ++i) w[i] = 0.1 * double(i) - 0.4;
  using graph::HostArray;
  using graph::TensorType;
  auto out = graph::interpret(imp->graph, {{"a", HostArray(TensorType{DType::f32, Shape{2, 1, 2, 3}}, a)},
                                           {"b", HostArray(TensorType{DType::f32, Shape{3, 3, 4}}, b)},
                                           {"w", HostArray(TensorType{DType::f32, Shape{3, 4}}, w)}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  EXPECT_EQ(imp->graph.type(*imp->graph.find_output("y")).shape, (Shape{2, 3, 2, 4}));
  EXPECT_EQ(imp->graph.type(*imp->graph.find_output("z")).shape, (Shape{2, 1, 2, 4}));
  auto fa = [&](size_t p, size_t i, size_t j) { return double(float(a[(p * 2 + i) * 3 + j])); };
  for (size_t p = 0; p < 2; ++p)
    for (size_t q = 0; q < 3; ++q)
      for (size_t i = 0; i < 2; ++i)
        for (size_t k = 0; k < 4; ++k) {
          double y = 0, z = 0;
          for (size_t j = 0; j < 3; ++j) {
            y += fa(p, i, j) * double(float(b[(q * 3 + j) * 4 + k]));
            z += fa(p, i, j) * double(float(w[j * 4 + k]));
          }
          EXPECT_NEAR(out->at("y").data[((p * 3 + q) * 2 + i) * 4 + k], y, 1e-5);
          if (q == 0) {
            EXPECT_NEAR(out->at("z").data[(p * 2 + i) * 4 + k], z, 1e-5);
          }
        }
}

// A model older than the opset an op's conversion starts at is refused naming the op, the opset and the
// version (HardSwish exists from 14); Softmax at opset 11 coerces to 2-D at axis 1, as ONNX then defined it.
TEST(OnnxImport, OlderOpsetsOpByOp) {
  HandModel old("old.onnx");
  old.m.opsets[""] = 13;
  auto r = import_onnx(old.input("x", {2, 3}).node("hs", "HardSwish", {"x"}, "y").output("y").m);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().message(),
            "old.onnx: 1 node(s): expected ops the importer converts at the model's opset (aspen onnx inspect lists "
            "them), found node 0 'hs' (HardSwish) at opset 13, converted from opset 14 on (its meaning changed "
            "there) (hint: onnx.version_converter.convert_version(model, 17) rewrites an older model's ops)");
  HandModel sm("softmax11.onnx");
  sm.m.opsets[""] = 11;
  auto s = import_onnx(sm.input("x", {2, 2, 2}).node("sm", "Softmax", {"x"}, "y").output("y").m);
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  const std::vector<double> x = {0, 1, 2, 3, 4, 5, 6, 7};
  auto out = graph::interpret(s->graph, {{"x", graph::HostArray(graph::TensorType{DType::f32, Shape{2, 2, 2}}, x)}});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  for (int row = 0; row < 2; ++row) {  // one softmax over the 4 values of each row of the [2, 4] coercion
    double z = 0;
    for (int k = 0; k < 4; ++k) z += std::exp(x[size_t(row * 4 + k)]);
    for (int k = 0; k < 4; ++k)
      EXPECT_NEAR(out->at("y").data[size_t(row * 4 + k)], std::exp(x[size_t(row * 4 + k)]) / z, 1e-6);
  }
}

// A ConstantOfShape of 2^42 elements (16 TiB of f32) once aborted the importer (a failed allocation): it is
// now built into the graph, and the session says the device has no room for it.
TEST(OnnxImport, HugeKnownShapesAreNoAbort) {
  const HandModel h = HandModel("huge.onnx")
                          .ints("shape", {int64_t(1) << 20, int64_t(1) << 20, 4})
                          .node("fill", "ConstantOfShape", {"shape"}, "y")
                          .output("y");
  auto imp = import_onnx(h.m);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  EXPECT_EQ(imp->graph.type(*imp->graph.find_output("y")).shape, (Shape{int64_t(1) << 20, int64_t(1) << 20, 4}));
  auto exe = compiler::compile(imp->graph, {});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  auto session = runtime::Session::create(std::move(*exe), {});
  ASSERT_FALSE(session.is_ok());
  EXPECT_NE(session.status().message().find("the allocation refused"), std::string::npos) << session.status().message();
}

}  // namespace
}  // namespace aspen::models
