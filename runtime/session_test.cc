#include "runtime/session.h"

#include <gtest/gtest.h>

#include "core/philox.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"

namespace aspen::runtime {
namespace {

using graph::Builder;
using graph::Graph;
using graph::ValueId;

Tensor random_tensor(Shape s, uint64_t seed) {
  Tensor t(DType::f32, s);
  philox_fill_uniform(t.span<float>(), seed, 0, 0, -1, 1);
  return t;
}

// The compiled program must equal the reference interpreter (with rounding
// to each dtype) on the same feeds, at every optimization level.
void expect_matches_interpreter(const Graph& g, const std::map<std::string, Tensor>& inputs,
                                const std::map<std::string, Tensor>& params) {
  std::map<std::string, graph::HostArray> feeds;
  for (auto& [k, v] : inputs) feeds[k] = graph::HostArray::from_tensor(v);
  for (auto& [k, v] : params) feeds[k] = graph::HostArray::from_tensor(v);
  auto want = graph::interpret(g, feeds, {.round_to_dtype = true});
  ASSERT_TRUE(want.is_ok()) << want.status().to_string();
  for (auto level : {compiler::OptLevel::O0, compiler::OptLevel::O1, compiler::OptLevel::O2}) {
    auto exe = compiler::compile(g, {.opt_level = level, .verify_each_pass = true});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    auto session = Session::create(std::move(exe).value(), {.threads = 1});
    ASSERT_TRUE(session.is_ok()) << session.status().to_string();
    for (auto& [k, v] : params) ASSERT_TRUE((*session)->set_parameter(k, v).is_ok());
    std::map<std::string, const Tensor*> in;
    for (auto& [k, v] : inputs) in[k] = &v;
    auto got = (*session)->run(in);
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    for (auto& [name, w] : *want) {
      const Tensor& t = got->at(name);
      auto h = graph::HostArray::from_tensor(t);
      ASSERT_EQ(h.type, w.type) << name;
      for (size_t i = 0; i < h.data.size(); ++i)
        ASSERT_NEAR(h.data[i], w.data[i], 1e-5 * (1 + std::abs(w.data[i]))) << name << "[" << i << "]";
    }
  }
}

TEST(Session, CompiledEqualsInterpreter) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 5});
  ValueId w = b.parameter("w", DType::f32, {5});
  ValueId h = b.add(b.mul(x, b.broadcast(w, {3, 5})), b.exp(b.scale(x, 0.5)));
  b.output("y", b.gelu(h));
  b.output("s", b.reduce_sum(h, {1}));
  b.output("k", b.exp(b.scalar(2.0f)));  // folds at O1 and O2
  ASSERT_TRUE(b.status().is_ok());
  std::map<std::string, Tensor> inputs, params;
  inputs.emplace("x", random_tensor({3, 5}, 1));
  params.emplace("w", random_tensor({5}, 2));
  expect_matches_interpreter(g, inputs, params);
}

// Fused kernels (O2) against the unfused reference meaning.
TEST(Session, FusedProgramEqualsInterpreter) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {5, 6});
  ValueId r = b.input("r", DType::f32, {5, 6});
  ValueId h = b.add(x, r);
  ValueId y = b.op(graph::OpKind::layernorm,
                   {h, b.parameter("ln.weight", DType::f32, {6}), b.parameter("ln.bias", DType::f32, {6})},
                   {{"eps", 1e-5}})[0];
  ValueId mm = b.op1(graph::OpKind::matmul, {y, b.parameter("fc.weight", DType::f32, {8, 6})},
                     {{"trans_b", int64_t(1)}});
  ValueId fc = b.add(mm, b.broadcast(b.parameter("fc.bias", DType::f32, {8}), {5, 8}));
  b.output("act", b.gelu(b.add(b.exp(b.scale(fc, 0.1)), b.broadcast(b.parameter("act.bias", DType::f32, {8}), {5, 8}))));
  b.output("h2", b.add(h, y));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  std::map<std::string, Tensor> inputs, params;
  inputs.emplace("x", random_tensor({5, 6}, 1));
  inputs.emplace("r", random_tensor({5, 6}, 2));
  params.emplace("ln.weight", random_tensor({6}, 3));
  params.emplace("ln.bias", random_tensor({6}, 4));
  params.emplace("fc.weight", random_tensor({8, 6}, 5));
  params.emplace("fc.bias", random_tensor({8}, 6));
  params.emplace("act.bias", random_tensor({8}, 7));
  expect_matches_interpreter(g, inputs, params);
}

// compute = bf16 (compiler/precision.cc): an MLP and its gradients, compiled with bf16 matmuls, matches
// the interpreter on the transformed graph closely and the f32 program within bf16 tolerance.
TEST(Session, Bf16ComputeMatchesItsGraphAndF32) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {8, 24});
  ValueId w1 = b.parameter("fc1.weight", DType::f32, {32, 24});
  ValueId b1 = b.parameter("fc1.bias", DType::f32, {32});
  ValueId w2 = b.parameter("fc2.weight", DType::f32, {16, 32});
  ValueId h = b.add(b.op1(graph::OpKind::matmul, {x, w1}, {{"trans_b", int64_t(1)}}), b.broadcast(b1, {8, 32}));
  ValueId y = b.op1(graph::OpKind::matmul, {b.gelu(h), w2}, {{"trans_b", int64_t(1)}});
  ValueId loss = b.scale(b.reduce_sum(b.mul(y, y), {0, 1}), 1.0 / 128);
  b.output("loss", loss);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  const std::vector<ValueId> wrt{w1, b1, w2, x};
  auto grads = graph::append_gradients(g, loss, wrt);
  ASSERT_TRUE(grads.is_ok()) << grads.status().to_string();
  const std::vector<std::string> grad_names{"grad.fc1.weight", "grad.fc1.bias", "grad.fc2.weight", "grad.x"};
  for (size_t i = 0; i < wrt.size(); ++i) g.add_output(grad_names[i], (*grads)[i]);

  std::map<std::string, Tensor> inputs, params;
  inputs.emplace("x", random_tensor({8, 24}, 1));
  params.emplace("fc1.weight", random_tensor({32, 24}, 2));
  params.emplace("fc1.bias", random_tensor({32}, 3));
  params.emplace("fc2.weight", random_tensor({16, 32}, 4));
  std::map<std::string, const Tensor*> in;
  for (auto& [k, v] : inputs) in[k] = &v;
  auto run = [&](std::unique_ptr<compiler::Executable> exe) {
    auto session = Session::create(std::move(exe), {.threads = 1});
    EXPECT_TRUE(session.is_ok()) << session.status().to_string();
    for (auto& [k, v] : params) EXPECT_TRUE((*session)->set_parameter(k, v).is_ok());
    auto got = (*session)->run(in);
    EXPECT_TRUE(got.is_ok()) << got.status().to_string();
    std::map<std::string, graph::HostArray> out;
    for (auto& [k, v] : *got) out[k] = graph::HostArray::from_tensor(v);
    return out;
  };

  auto exe = compiler::compile(g, {.verify_each_pass = true, .compute = DType::bf16});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  int matmuls = 0;
  for (const auto& n : (*exe)->graph.nodes()) {
    if (n.op != graph::OpKind::matmul) continue;
    ++matmuls;
    EXPECT_EQ((*exe)->graph.type(n.inputs[0]).dtype, DType::bf16);
    EXPECT_EQ(n.attrs.i_or("out_dtype", -1), int64_t(DType::f32));
  }
  EXPECT_GE(matmuls, 5);
  std::map<std::string, graph::HostArray> feeds;
  for (auto& [k, v] : inputs) feeds[k] = graph::HostArray::from_tensor(v);
  for (auto& [k, v] : params) feeds[k] = graph::HostArray::from_tensor(v);
  auto meaning = graph::interpret((*exe)->graph, feeds, {.round_to_dtype = true});
  ASSERT_TRUE(meaning.is_ok()) << meaning.status().to_string();
  const auto bf = run(std::move(exe).value());
  auto exe32 = compiler::compile(g, {.verify_each_pass = true});
  ASSERT_TRUE(exe32.is_ok()) << exe32.status().to_string();
  const auto f32 = run(std::move(exe32).value());

  for (auto& [name, w] : *meaning) {
    const graph::HostArray& got = bf.at(name);
    ASSERT_EQ(got.type, w.type) << name;
    for (size_t i = 0; i < got.data.size(); ++i)
      ASSERT_NEAR(got.data[i], w.data[i], 1e-5 * (1 + std::abs(w.data[i]))) << name << "[" << i << "]";
  }
  const double l32 = f32.at("loss").data[0];
  EXPECT_LE(std::abs(bf.at("loss").data[0] - l32), 1e-2 * std::abs(l32));
  for (const std::string& name : grad_names) {
    const graph::HostArray &got = bf.at(name), &want = f32.at(name);
    double err = 0, ref = 0;
    for (size_t i = 0; i < want.data.size(); ++i) {
      err += (got.data[i] - want.data[i]) * (got.data[i] - want.data[i]);
      ref += want.data[i] * want.data[i];
    }
    EXPECT_LE(err / ref, 1e-3) << name;
  }
}

TEST(Session, BadInputsAreStatuses) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2, 2});
  b.parameter("p", DType::f32, {2});
  b.output("y", b.neg(x));
  auto exe = compiler::compile(g);
  ASSERT_TRUE(exe.is_ok());
  auto session = Session::create(std::move(exe).value(), {.threads = 1});
  ASSERT_TRUE(session.is_ok());
  Session& s = **session;
  Tensor wrong(DType::f32, Shape{4});
  EXPECT_EQ(s.run({{"x", &wrong}}).status().message(), "input 'x': expected f32[2, 2], found f32[4]");
  EXPECT_EQ(s.run({}).status().message(), "input 'x': expected a tensor f32[2, 2], found none given");
  Tensor ok(DType::f32, Shape{2, 2});
  EXPECT_EQ(s.run({{"x", &ok}, {"z", &ok}}).status().message(), "input 'z': expected an input of the program, found none");
  EXPECT_EQ(s.set_parameter("p", wrong).message(), "parameter 'p': expected f32[2], found f32[4]");
  EXPECT_EQ(s.set_parameter("q", wrong).code(), Code::kNotFound);
  Tensor p(DType::f32, Shape{2});
  p.data<float>()[1] = 3;
  ASSERT_TRUE(s.set_parameter("p", p).is_ok());
  EXPECT_EQ(s.get_parameter("p")->data<float>()[1], 3.0f);
}

std::unique_ptr<Session> doubling_session(profile::TraceRecorder* trace = nullptr) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {2});
  b.output("y", b.scale(b.exp(b.scale(x, 0.0)), 2.0));  // 2 whatever x is
  b.output("z", b.scale(x, 2.0));
  EXPECT_TRUE(b.status().is_ok());
  auto exe = compiler::compile(g, {.opt_level = compiler::OptLevel::O0});
  EXPECT_TRUE(exe.is_ok());
  auto s = Session::create(std::move(exe).value(), {.threads = 1, .trace = trace});
  EXPECT_TRUE(s.is_ok());
  return std::move(s).value();
}

TEST(Session, DeviceIterationsAndOutputModes) {
  auto s = doubling_session();
  Tensor x(DType::f32, Shape{4, 2});
  for (int i = 0; i < 8; ++i) x.data<float>()[i] = float(i + 1);
  auto values = [](const Tensor& t) { return std::vector<float>(t.data<float>(), t.data<float>() + t.numel()); };
  auto all = s->run({{"x", &x}}, {.iterations = 4, .output_mode = OutputMode::all});
  ASSERT_TRUE(all.is_ok()) << all.status().to_string();
  EXPECT_EQ(all->at("z").shape(), (Shape{4, 2}));
  EXPECT_EQ(values(all->at("z")), (std::vector<float>{2, 4, 6, 8, 10, 12, 14, 16}));
  auto last = s->run({{"x", &x}}, {.iterations = 4, .output_mode = OutputMode::final});
  ASSERT_TRUE(last.is_ok());
  EXPECT_EQ(values(last->at("z")), (std::vector<float>{14, 16}));
  auto sum = s->run({{"x", &x}}, {.iterations = 4, .output_mode = OutputMode::sum});
  ASSERT_TRUE(sum.is_ok());
  EXPECT_EQ(values(sum->at("z")), (std::vector<float>{32, 40}));
  EXPECT_EQ(values(sum->at("y")), (std::vector<float>{8, 8}));
  auto every = s->run({{"x", &x}}, {.iterations = 4, .output_mode = OutputMode::every_n, .every_n = 2});
  ASSERT_TRUE(every.is_ok());
  EXPECT_EQ(values(every->at("z")), (std::vector<float>{6, 8, 14, 16}));
  EXPECT_EQ(s->run({{"x", &x}}, {.iterations = 4, .output_mode = OutputMode::every_n, .every_n = 3}).status().message(),
            "run: every_n: expected a divisor of iterations 4, found 3");
  Tensor one(DType::f32, Shape{2});
  EXPECT_EQ(s->run({{"x", &one}}, {.iterations = 4}).status().message(),
            "input 'x': expected f32[4, 2] (4 iterations of f32[2]), found f32[2]");
}

// Two devices in this process, each with its own team, arena and kernels:
// every replica computes its own slice, and the [iterations, replicas]
// layout of inputs and outputs holds.
TEST(Session, ReplicasRunTheirSlicesSideBySide) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 4});
  ValueId w = b.parameter("w", DType::f32, {5, 4});
  b.output("y", b.op1(graph::OpKind::matmul, {x, w}, {{"trans_b", int64_t(1)}}));
  ASSERT_TRUE(b.status().is_ok());
  auto exe = compiler::compile(g);
  ASSERT_TRUE(exe.is_ok());
  auto s = Session::create(std::move(exe).value(), {.threads = 1, .replicas = 2});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ((*s)->replicas(), 2);
  EXPECT_EQ((*s)->device(1).name(), "cpu1");
  Tensor wt = random_tensor({5, 4}, 9);
  ASSERT_TRUE((*s)->set_parameter("w", wt).is_ok());
  Tensor xs = random_tensor({3, 2, 3, 4}, 10);  // 3 iterations × 2 replicas
  auto out = (*s)->run({{"x", &xs}}, {.iterations = 3, .output_mode = OutputMode::all});
  ASSERT_TRUE(out.is_ok()) << out.status().to_string();
  const Tensor& y = out->at("y");
  ASSERT_EQ(y.shape(), (Shape{3, 2, 3, 5}));
  for (int64_t slice = 0; slice < 6; ++slice)
    for (int64_t i = 0; i < 3; ++i)
      for (int64_t j = 0; j < 5; ++j) {
        double want = 0;
        for (int64_t k = 0; k < 4; ++k) want += double(xs.data<float>()[slice * 12 + i * 4 + k]) * wt.data<float>()[j * 4 + k];
        ASSERT_NEAR(y.data<float>()[slice * 15 + i * 5 + j], want, 1e-5) << "slice " << slice;
      }
  Tensor one = random_tensor({3, 4}, 11);
  EXPECT_EQ((*s)->run({{"x", &one}}).status().message(),
            "input 'x': expected f32[2, 3, 4] (2 replicas of f32[3, 4]), found f32[3, 4]");
}

TEST(Session, TracesEveryInstruction) {
  profile::TraceRecorder trace;
  auto s = doubling_session(&trace);
  Tensor x(DType::f32, Shape{2});
  ASSERT_TRUE(s->run({{"x", &x}}).is_ok());
  auto events = trace.events();
  ASSERT_EQ(events.size(), s->executable().program.code.size());
  // host_write "x", four kernels, host_read of "y" and "z": each moves f32[2]s
  // (a kernel: one in, one out).
  ASSERT_EQ(events.size(), 7u);
  const char* categories[] = {"host", "kernel", "kernel", "kernel", "kernel", "host", "host"};
  const int64_t bytes[] = {8, 16, 16, 16, 16, 8, 8};
  for (size_t i = 0; i < events.size(); ++i) {
    const auto& e = events[i];
    EXPECT_EQ(e.device, "cpu0");
    EXPECT_EQ(e.category, categories[i]) << i;
    EXPECT_GE(e.end_ns, e.start_ns);
    EXPECT_EQ(e.bytes, bytes[i]) << i;
  }
  EXPECT_EQ(events[0].name, "host_write x");
  EXPECT_EQ(events[5].name, "host_read y");
  EXPECT_EQ(events[6].name, "host_read z");
  EXPECT_NE(profile::summary(events).find("scale"), std::string::npos);
}

}  // namespace
}  // namespace aspen::runtime

namespace aspen::runtime {
namespace {

// Collectives are their own instructions: a group of one is the identity; a
// larger group needs W1.5's communicators and says so when run.
TEST(Session, CollectiveInstructions) {
  for (int64_t group : {1, 2}) {
    Graph g;
    Builder b(g);
    ValueId x = b.input("x", DType::f32, {3});
    ValueId r = b.op1(graph::OpKind::all_reduce, {x},
                      {{"group", std::string("data")}, {"group_size", group}, {"reduce", std::string("sum")}});
    b.output("y", b.scale(r, 2.0));
    ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
    auto exe = compiler::compile(g);
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    EXPECT_NE((*exe)->listing().find("collective all_reduce"), std::string::npos) << (*exe)->listing();
    auto s = Session::create(std::move(exe).value(), {.threads = 1});
    ASSERT_TRUE(s.is_ok());
    Tensor in = random_tensor({3}, 5);
    auto out = (*s)->run({{"x", &in}});
    if (group == 1) {
      ASSERT_TRUE(out.is_ok()) << out.status().to_string();
      for (int i = 0; i < 3; ++i) EXPECT_EQ(out->at("y").data<float>()[i], 2 * in.data<float>()[i]);
    } else {
      ASSERT_FALSE(out.is_ok());
      EXPECT_NE(out.status().message().find("collective all_reduce over a group of 2"), std::string::npos)
          << out.status().message();
    }
  }
}

}  // namespace
}  // namespace aspen::runtime
