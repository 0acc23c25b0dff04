// io/onnx_test.cc: the ONNX reader on models built here with the protobuf classes (every field the reader
// converts, and each way a model can be malformed, with its message), on external data (inside the model's
// directory only), and on a case of ONNX's own backend tests (Debian's libonnx-testdata).
#include "io/onnx.h"

#include <gtest/gtest.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <fstream>

#include "onnx/onnx_pb.h"  // defines ONNX_API, then includes onnx-ml.pb.h (ONNX_ML)

namespace aspen::io {
namespace {

std::string serialize(const ::onnx::ModelProto& m) {
  std::string s;
  EXPECT_TRUE(m.SerializeToString(&s));
  return s;
}

Result<OnnxModel> parse(const ::onnx::ModelProto& m, const std::string& base_dir = "") {
  const std::string s = serialize(m);
  return read_onnx_model_from_bytes(std::as_bytes(std::span(s.data(), s.size())), "m.onnx", base_dir);
}

// y = MatMul(x, w) + b, then Relu; x [batch, 3] with a symbolic batch; w a raw_data initializer, b a typed one.
::onnx::ModelProto small_model() {
  ::onnx::ModelProto m;
  m.set_ir_version(8);
  m.set_producer_name("test");
  auto* op = m.add_opset_import();
  op->set_domain("");
  op->set_version(17);
  ::onnx::GraphProto* g = m.mutable_graph();
  g->set_name("g");
  auto* x = g->add_input();
  x->set_name("x");
  auto* tt = x->mutable_type()->mutable_tensor_type();
  tt->set_elem_type(::onnx::TensorProto_DataType_FLOAT);
  tt->mutable_shape()->add_dim()->set_dim_param("batch");
  tt->mutable_shape()->add_dim()->set_dim_value(3);
  auto* w = g->add_initializer();
  w->set_name("w");
  w->set_data_type(::onnx::TensorProto_DataType_FLOAT);
  w->add_dims(3);
  w->add_dims(2);
  const float wv[6] = {1, 2, 3, 4, 5, 6};
  w->set_raw_data(std::string(reinterpret_cast<const char*>(wv), sizeof(wv)));
  auto* b = g->add_initializer();
  b->set_name("b");
  b->set_data_type(::onnx::TensorProto_DataType_FLOAT);
  b->add_dims(2);
  b->add_float_data(0.5f);
  b->add_float_data(-0.5f);
  auto* mm = g->add_node();
  mm->set_op_type("MatMul");
  mm->set_name("mm");
  mm->add_input("x");
  mm->add_input("w");
  mm->add_output("xw");
  auto* add = g->add_node();
  add->set_op_type("Add");
  add->add_input("xw");
  add->add_input("b");
  add->add_output("h");
  auto* relu = g->add_node();
  relu->set_op_type("LeakyRelu");
  relu->add_input("h");
  relu->add_output("y");
  auto* alpha = relu->add_attribute();
  alpha->set_name("alpha");
  alpha->set_type(::onnx::AttributeProto_AttributeType_FLOAT);
  alpha->set_f(0.25f);
  g->add_output()->set_name("y");
  return m;
}

TEST(Onnx, ReadsASmallModel) {
  auto m = parse(small_model());
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  EXPECT_EQ(m->ir_version, 8);
  EXPECT_EQ(m->opset(), 17);
  EXPECT_EQ(m->opset("com.microsoft"), 0);
  ASSERT_EQ(m->graph.inputs.size(), 1u);
  const OnnxValueInfo& x = m->graph.inputs[0];
  EXPECT_EQ(x.type, int32_t(OnnxType::f32));
  ASSERT_TRUE(x.has_shape);
  ASSERT_EQ(x.dims.size(), 2u);
  EXPECT_EQ(x.dims[0].value, -1);
  EXPECT_EQ(x.dims[0].param, "batch");
  EXPECT_EQ(x.dims[1].value, 3);
  ASSERT_EQ(m->graph.initializers.size(), 2u);
  const OnnxTensor* w = m->graph.find_initializer("w");
  ASSERT_NE(w, nullptr);
  EXPECT_EQ(w->dims, (std::vector<int64_t>{3, 2}));
  ASSERT_EQ(w->bytes.size(), 24u);
  float wv[6];
  std::memcpy(wv, w->bytes.data(), 24);
  EXPECT_EQ(wv[5], 6.0f);
  const OnnxTensor* b = m->graph.find_initializer("b");
  ASSERT_NE(b, nullptr);
  float bv[2];
  ASSERT_EQ(b->bytes.size(), 8u);
  std::memcpy(bv, b->bytes.data(), 8);
  EXPECT_EQ(bv[1], -0.5f);
  ASSERT_EQ(m->graph.nodes.size(), 3u);
  EXPECT_EQ(m->graph.nodes[2].op_type, "LeakyRelu");
  const OnnxAttribute* a = m->graph.nodes[2].find("alpha");
  ASSERT_NE(a, nullptr);
  EXPECT_EQ(a->type, OnnxAttrType::f);
  EXPECT_EQ(a->f, 0.25f);
  EXPECT_EQ(m->graph.nodes[0].label(0), "node 0 'mm' (MatMul)");
  EXPECT_EQ(m->graph.nodes[1].label(1), "node 1 (output 'h') (Add)");
}

// The typed fields of every numeric type become the same little-endian bytes raw_data would hold.
// torch.onnx's node metadata (NodeProto field 9, unknown to the schema this reader is built with) is read,
// and a node's label names the user's layer, its class, the torch op and the user's source line (NOTE
// [node origins]): the innermost frame outside torch's files.
TEST(Onnx, NodeMetadataNamesTheUsersLayer) {
  ::onnx::ModelProto m = small_model();
  ::onnx::NodeProto* node = m.mutable_graph()->mutable_node(0);
  std::string bytes = node->SerializeAsString();
  auto field9 = [&](const std::string& key, const std::string& value) {
    ::onnx::StringStringEntryProto e;
    e.set_key(key);
    e.set_value(value);
    const std::string entry = e.SerializeAsString();
    ASSERT_LT(entry.size(), 128u);  // a one-byte length
    bytes += char(9 << 3 | 2);
    bytes += char(entry.size());
    bytes += entry;
  };
  field9("pkg.torch.onnx.name_scopes", "['', 'encoder', 'encoder.fc', 'linear']");
  field9("pkg.torch.onnx.class_hierarchy", "['app.Net', 'torch.nn.modules.linear.Linear', 'aten.linear.default']");
  field9("pkg.torch.onnx.stack_trace",
         "File \"/home/u/app.py\", line 31, in forward\n  File \"/x/torch/nn/modules/linear.py\", line 125");
  ASSERT_TRUE(node->ParseFromString(bytes));
  auto r = parse(m);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  const OnnxNode& n = r->graph.nodes[0];
  ASSERT_EQ(n.metadata.size(), 3u);
  EXPECT_EQ(n.origin(), "from torch: layer 'encoder.fc' (Linear), aten.linear.default, app.py line 31");
  EXPECT_NE(n.label(0).find("; from torch: layer 'encoder.fc' (Linear)"), std::string::npos) << n.label(0);
  EXPECT_EQ(r->graph.nodes[1].origin(), "");  // no metadata: the label as before
}

TEST(Onnx, TypedFieldsBecomeLittleEndianBytes) {
  struct Case {
    ::onnx::TensorProto_DataType type;
    size_t size;
  };
  for (const Case c : {Case{::onnx::TensorProto_DataType_INT64, 8}, Case{::onnx::TensorProto_DataType_INT32, 4},
                       Case{::onnx::TensorProto_DataType_INT8, 1}, Case{::onnx::TensorProto_DataType_UINT16, 2},
                       Case{::onnx::TensorProto_DataType_BOOL, 1}, Case{::onnx::TensorProto_DataType_FLOAT16, 2},
                       Case{::onnx::TensorProto_DataType_BFLOAT16, 2}, Case{::onnx::TensorProto_DataType_DOUBLE, 8},
                       Case{::onnx::TensorProto_DataType_UINT64, 8}, Case{::onnx::TensorProto_DataType_UINT32, 4}}) {
    SCOPED_TRACE(onnx_type_name(c.type));
    ::onnx::ModelProto m = small_model();
    auto* t = m.mutable_graph()->add_initializer();
    t->set_name("t");
    t->set_data_type(c.type);
    t->add_dims(2);
    const int64_t values[2] = {1, 0x3f80};  // 0x3f80: bf16 1.0, and a value every type holds
    for (int64_t v : values) {
      if (c.type == ::onnx::TensorProto_DataType_INT64)
        t->add_int64_data(v);
      else if (c.type == ::onnx::TensorProto_DataType_DOUBLE)
        t->add_double_data(double(v));
      else if (c.type == ::onnx::TensorProto_DataType_UINT64 || c.type == ::onnx::TensorProto_DataType_UINT32)
        t->add_uint64_data(uint64_t(v));
      else
        t->add_int32_data(int32_t(
            c.type == ::onnx::TensorProto_DataType_INT8 || c.type == ::onnx::TensorProto_DataType_BOOL ? v & 1 : v));
    }
    auto r = parse(m);
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    const OnnxTensor* x = r->graph.find_initializer("t");
    ASSERT_NE(x, nullptr);
    ASSERT_EQ(x->bytes.size(), 2 * c.size);
    EXPECT_EQ(onnx_type_size(x->type), c.size);
    if (c.type == ::onnx::TensorProto_DataType_DOUBLE) {
      double d;
      std::memcpy(&d, x->bytes.data() + 8, 8);
      EXPECT_EQ(d, double(0x3f80));
    } else {
      uint64_t v = 0;
      std::memcpy(&v, x->bytes.data() + c.size, c.size);
      EXPECT_EQ(v, c.size == 1 ? 0u : uint64_t(0x3f80));
    }
  }
}

// Each malformed model, and the words its error must contain.
TEST(Onnx, MalformedModelsAreNamedErrors) {
  struct Case {
    const char* what;
    void (*mutate)(::onnx::ModelProto&);
    const char* message;
  };
  const Case cases[] = {
      {"no default opset", [](::onnx::ModelProto& m) { m.mutable_opset_import(0)->set_domain("com.x"); },
       "opset_import: expected the default domain (ai.onnx) imported"},
      {"old ir", [](::onnx::ModelProto& m) { m.set_ir_version(2); }, "ir_version: expected 3 or later"},
      {"input read before defined",
       [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_node(0)->set_input(0, "nope"); },
       "node 0 'mm' (MatMul): input 'nope': expected a value defined before the node"},
      {"nodes out of order", [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_node()->SwapElements(0, 1); },
       "node 0 (output 'h') (Add): input 'xw'"},
      {"a value defined twice", [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_node(1)->set_output(0, "xw"); },
       "value 'xw': expected one definition, found a second one by node 1"},
      {"an output nobody makes", [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_output(0)->set_name("z"); },
       "graph output 'z': expected a value the graph defines"},
      {"raw_data short",
       [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_initializer(0)->mutable_raw_data()->resize(20); },
       "initializer 'w': expected 24 bytes of FLOAT data, found 20 bytes"},
      {"typed count wrong", [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_initializer(1)->add_float_data(1); },
       "initializer 'b': expected 2 values in float_data (FLOAT), found 3 values"},
      {"negative dim", [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_initializer(0)->set_dims(0, -3); },
       "initializer 'w': expected non-negative dims, found -3 at dimension 0"},
      {"dims overflow",
       [](::onnx::ModelProto& m) {
         auto* t = m.mutable_graph()->mutable_initializer(0);
         t->set_dims(0, int64_t(1) << 20);
         t->set_dims(1, int64_t(1) << 20);
       },
       "initializer 'w': expected at most 68719476736 bytes, found dims past that at dimension 1"},
      {"both raw and typed",
       [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_initializer(0)->add_float_data(1); },
       "expected its values in one place"},
      {"string tensor",
       [](::onnx::ModelProto& m) {
         auto* t = m.mutable_graph()->add_initializer();
         t->set_name("s");
         t->set_data_type(::onnx::TensorProto_DataType_STRING);
         t->add_string_data("hi");
       },
       "initializer 's': expected a numeric element type"},
      {"duplicate attribute",
       [](::onnx::ModelProto& m) {
         *m.mutable_graph()->mutable_node(2)->add_attribute() = m.graph().node(2).attribute(0);
       },
       "node 2 (output 'y') (LeakyRelu): expected each attribute once, found two named 'alpha'"},
      {"empty op_type", [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_node(1)->clear_op_type(); },
       "expected an op_type, found an empty one"},
      {"external data without a directory",
       [](::onnx::ModelProto& m) {
         auto* t = m.mutable_graph()->mutable_initializer(0);
         t->clear_raw_data();
         t->set_data_location(::onnx::TensorProto_DataLocation_EXTERNAL);
         auto* kv = t->add_external_data();
         kv->set_key("location");
         kv->set_value("w.bin");
       },
       "external data in 'w.bin', and no directory to read it from"},
      {"sparse initializer",
       [](::onnx::ModelProto& m) { m.mutable_graph()->add_sparse_initializer()->mutable_values()->set_name("sp"); },
       "sparse initializer 'sp'"},
      {"a control byte in a name",
       [](::onnx::ModelProto& m) { m.mutable_graph()->mutable_node(0)->set_input(0, "a\x1b[2J"); },
       "input 'a\\x1b[2J'"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.what);
    ::onnx::ModelProto m = small_model();
    c.mutate(m);
    auto r = parse(m);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("m.onnx"), std::string::npos) << r.status().message();
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().message();
  }
}

TEST(Onnx, BytesThatAreNoModel) {
  for (const std::string& s : {std::string(), std::string("\xff\xff\xff\xff garbage", 12), std::string(7, '\x0a')}) {
    auto r = read_onnx_model_from_bytes(std::as_bytes(std::span(s.data(), s.size())), "junk.onnx");
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find("junk.onnx"), std::string::npos) << r.status().message();
  }
  // A truncated model: every prefix of a real one is either a model or a named error, never a crash.
  const std::string full = serialize(small_model());
  for (size_t n = 0; n < full.size(); ++n) {
    auto r = read_onnx_model_from_bytes(std::as_bytes(std::span(full.data(), n)), "cut.onnx");
    if (!r.is_ok()) {
      EXPECT_NE(r.status().message().find("cut.onnx"), std::string::npos);
    }
  }
}

TEST(Onnx, SubgraphsSeeOuterValuesAndNestingIsBounded) {
  ::onnx::ModelProto m = small_model();
  auto* node = m.mutable_graph()->add_node();
  node->set_op_type("If");
  node->add_input("y");
  node->add_output("z");
  auto* a = node->add_attribute();
  a->set_name("then_branch");
  a->set_type(::onnx::AttributeProto_AttributeType_GRAPH);
  ::onnx::GraphProto* body = a->mutable_g();
  auto* id = body->add_node();
  id->set_op_type("Identity");
  id->add_input("h");  // an outer value
  id->add_output("hz");
  body->add_output()->set_name("hz");
  auto r = parse(m);
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  ASSERT_EQ(r->graph.nodes.back().attributes.size(), 1u);
  EXPECT_EQ(r->graph.nodes.back().attributes[0].graphs.at(0)->nodes.at(0).inputs.at(0), "h");
  // Nested past the limit.
  ::onnx::ModelProto deep = small_model();
  ::onnx::GraphProto* g = deep.mutable_graph();
  for (int d = 0; d < 10; ++d) {
    auto* n = g->add_node();
    n->set_op_type("If");
    n->add_output("o" + std::to_string(d));
    auto* at = n->add_attribute();
    at->set_name("then_branch");
    at->set_type(::onnx::AttributeProto_AttributeType_GRAPH);
    g = at->mutable_g();
  }
  auto rd = parse(deep);
  ASSERT_FALSE(rd.is_ok());
  EXPECT_NE(rd.status().message().find("subgraphs nested at most 8 deep"), std::string::npos) << rd.status().message();
}

class OnnxExternal : public ::testing::Test {
 protected:
  void SetUp() override {
    char tmpl[] = "/tmp/aspen_onnx_XXXXXX";
    ASSERT_NE(mkdtemp(tmpl), nullptr);
    dir_ = tmpl;
  }
  void TearDown() override { std::system(("rm -rf '" + dir_ + "'").c_str()); }
  void write(const std::string& name, const std::string& bytes) {
    std::ofstream(dir_ + "/" + name, std::ios::binary) << bytes;
  }
  // The model with w's 24 bytes in `location` at `offset`.
  ::onnx::ModelProto external(const std::string& location, const std::string& offset, const std::string& length = "") {
    ::onnx::ModelProto m = small_model();
    auto* t = m.mutable_graph()->mutable_initializer(0);
    t->clear_raw_data();
    t->set_data_location(::onnx::TensorProto_DataLocation_EXTERNAL);
    auto add = [&](const char* k, const std::string& v) {
      auto* kv = t->add_external_data();
      kv->set_key(k);
      kv->set_value(v);
    };
    add("location", location);
    if (!offset.empty()) add("offset", offset);
    if (!length.empty()) add("length", length);
    return m;
  }
  std::string dir_;
};

TEST_F(OnnxExternal, ReadsWeightsBesideTheModel) {
  const float wv[6] = {6, 5, 4, 3, 2, 1};
  write("w.bin", std::string(8, 'x') + std::string(reinterpret_cast<const char*>(wv), 24));
  std::ofstream(dir_ + "/m.onnx", std::ios::binary) << serialize(external("w.bin", "8", "24"));
  auto r = read_onnx_model(dir_ + "/m.onnx");
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  float got[6];
  ASSERT_EQ(r->graph.find_initializer("w")->bytes.size(), 24u);
  std::memcpy(got, r->graph.find_initializer("w")->bytes.data(), 24);
  EXPECT_EQ(got[0], 6.0f);
  EXPECT_EQ(got[5], 1.0f);
}

TEST_F(OnnxExternal, RefusesWhatLiesOutsideTheDirectoryOrTheFile) {
  write("w.bin", std::string(30, 'x'));
  ASSERT_EQ(mkdir((dir_ + "/sub").c_str(), 0755), 0);
  ASSERT_EQ(symlink("/etc/passwd", (dir_ + "/link.bin").c_str()), 0);
  struct Case {
    std::string location, offset, length, message;
  };
  const Case cases[] = {
      {"/etc/passwd", "", "", "expected a file inside the model's directory, found '/etc/passwd'"},
      {"../w.bin", "", "", "expected a file inside the model's directory"},
      {"sub/../../w.bin", "", "", "expected a file inside the model's directory"},
      {"link.bin", "", "", "which resolves to '/etc/passwd'"},
      {"w.bin", "8", "", "expected bytes [8, 32) inside the file, found a file of 30 bytes"},
      {"w.bin", "0", "20", "external data length: expected 24 bytes (its dims and type), found 20"},
      {"w.bin", "-1", "", "offset: expected a decimal number, found '-1'"},
      {"missing.bin", "", "", "no such file"},
  };
  for (const Case& c : cases) {
    SCOPED_TRACE(c.location + " " + c.offset);
    auto r = parse(external(c.location, c.offset, c.length), dir_);
    ASSERT_FALSE(r.is_ok());
    EXPECT_NE(r.status().message().find(c.message), std::string::npos) << r.status().message();
  }
}

// One case of ONNX's own backend tests (Debian's libonnx-testdata), read whole: model, input and output.
TEST(Onnx, ReadsABackendTestCase) {
  const std::string dir = "/usr/share/libonnx-testdata/data/node/test_matmul_2d";
  ASSERT_EQ(access((dir + "/model.onnx").c_str(), R_OK), 0)
      << dir << ": install libonnx-testdata (scripts/install-deps.sh)";
  auto m = read_onnx_model(dir + "/model.onnx");
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_EQ(m->graph.nodes.size(), 1u);
  EXPECT_EQ(m->graph.nodes[0].op_type, "MatMul");
  ASSERT_EQ(m->graph.inputs.size(), 2u);
  auto a = read_onnx_tensor(dir + "/test_data_set_0/input_0.pb");
  ASSERT_TRUE(a.is_ok()) << a.status().to_string();
  EXPECT_EQ(a->type, int32_t(OnnxType::f32));
  EXPECT_EQ(int64_t(a->bytes.size()), a->numel() * 4);
}

}  // namespace
}  // namespace aspen::io
