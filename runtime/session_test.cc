#include "runtime/session.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <cmath>
#include <sstream>

#include "core/philox.h"
#include "core/weight_copies.h"
#include "graph/autodiff.h"
#include "graph/builder.h"
#include "graph/grad_check.h"
#include "graph/interpreter.h"
#include "kernels/matmul_choice.h"
#include "parallel/threads/threads_communicator.h"

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

// Sampling inside the program: the compiled sample op (fast kernel) draws the ids the interpreter (f64
// reference) draws, and one executable serves every setting: temperature, top-k, top-p, penalty, seed and
// step are inputs, so changing them reruns the same session.
TEST(Session, SampleMatchesInterpreterWithoutRecompiling) {
  constexpr int64_t B = 3, V = 257, L = 4;
  Graph g;
  Builder b(g);
  ValueId h = b.input("h", DType::f32, {B, 16});
  // NOTE: every input is declared before the first computing node: the session copies all inputs in
  // before the program runs, and the memory plan lets a later-declared input reuse a dead value's slot.
  std::vector<ValueId> settings{b.input("temperature", DType::f32, {B}), b.input("top_k", DType::i32, {B}),
                                b.input("top_p", DType::f32, {B}),       b.input("repetition_penalty", DType::f32, {B}),
                                b.input("seed", DType::i64, {}),         b.input("step", DType::i64, {}),
                                b.input("history", DType::i32, {B, L})};
  ValueId logits =
      b.op1(graph::OpKind::matmul, {h, b.parameter("wte", DType::f32, {V, 16})}, {{"trans_b", int64_t(1)}});
  settings.insert(settings.begin(), logits);
  b.output("ids", b.op1(graph::OpKind::sample, settings));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto exe = compiler::compile(g, {.opt_level = compiler::OptLevel::O2, .verify_each_pass = true});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  auto session = Session::create(std::move(exe).value(), {.threads = 1});
  ASSERT_TRUE(session.is_ok()) << session.status().to_string();
  Tensor wte = random_tensor({V, 16}, 3);
  for (float& w : wte.span<float>()) w *= 4.0f;  // logits with clear gaps
  ASSERT_TRUE((*session)->set_parameter("wte", wte).is_ok());
  Tensor hin = random_tensor({B, 16}, 4), history(DType::i32, {B, L});
  for (int64_t i = 0; i < B * L; ++i) history.span<int32_t>()[size_t(i)] = i % 4 == 3 ? -1 : int32_t((i * 37) % V);
  struct Setting {
    float t;
    int32_t k;
    float p, pen;
  };
  for (const Setting& st : {Setting{0.0f, 0, 1.0f, 1.0f}, Setting{0.9f, 0, 1.0f, 1.0f}, Setting{1.0f, 20, 1.0f, 1.2f},
                            Setting{0.8f, 0, 0.9f, 1.0f}, Setting{1.1f, 40, 0.8f, 1.5f}})
    for (int64_t step = 0; step < 3; ++step) {
      SCOPED_TRACE("t=" + std::to_string(st.t) + " k=" + std::to_string(st.k) + " p=" + std::to_string(st.p) +
                   " step=" + std::to_string(step));
      Tensor t(DType::f32, {B}), k(DType::i32, {B}), p(DType::f32, {B}), pen(DType::f32, {B});
      for (int64_t r = 0; r < B; ++r) {
        t.span<float>()[size_t(r)] = st.t;
        k.span<int32_t>()[size_t(r)] = st.k;
        p.span<float>()[size_t(r)] = st.p;
        pen.span<float>()[size_t(r)] = st.pen;
      }
      Tensor seed(DType::i64, {}), stp(DType::i64, {});
      seed.span<int64_t>()[0] = 1234;
      stp.span<int64_t>()[0] = step;
      const std::map<std::string, const Tensor*> in{{"h", &hin},        {"temperature", &t}, {"top_k", &k},
                                                    {"top_p", &p},      {"repetition_penalty", &pen},
                                                    {"seed", &seed},    {"step", &stp},      {"history", &history}};
      std::map<std::string, graph::HostArray> feeds{{"wte", graph::HostArray::from_tensor(wte)}};
      for (auto& [name, tensor] : in) feeds[name] = graph::HostArray::from_tensor(*tensor);
      auto want = graph::interpret(g, feeds, {.round_to_dtype = true});
      ASSERT_TRUE(want.is_ok()) << want.status().to_string();
      auto got = (*session)->run(in);
      ASSERT_TRUE(got.is_ok()) << got.status().to_string();
      EXPECT_EQ(graph::HostArray::from_tensor(got->at("ids")).data, want->at("ids").data);
    }
}

}  // namespace
}  // namespace aspen::runtime

namespace aspen::runtime {
namespace {

// Mixed precision runs on fast kernels and equals the meaning of the graph
// the precision pass made (f16 and bf16 compute, f32 and narrow partials).
TEST(Session, MixedPrecisionMatchesItsGraph) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {5, 7});
  ValueId w = b.parameter("w", DType::f32, {6, 7});
  b.output("y", b.gelu(b.op1(graph::OpKind::matmul, {x, w}, {{"trans_b", int64_t(1)}})));
  ASSERT_TRUE(b.status().is_ok());
  const Tensor xv = random_tensor({5, 7}, 21), wv = random_tensor({6, 7}, 22);
  const std::pair<DType, DType> cases[] = {
      {DType::f16, DType::f32}, {DType::f16, DType::f16}, {DType::bf16, DType::f32}, {DType::bf16, DType::bf16}};
  for (const auto& [compute, partials] : cases) {
    SCOPED_TRACE(std::string(dtype_name(compute)) + "/" + std::string(dtype_name(partials)));
    auto exe = compiler::compile(g, {.compute = compute, .partials = partials});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    for (const auto& ins : (*exe)->program.code) EXPECT_FALSE(ins.reference) << (*exe)->listing();
    auto meaning = graph::interpret((*exe)->graph, {{"x", graph::HostArray::from_tensor(xv)},
                                                    {"w", graph::HostArray::from_tensor(wv)}},
                                     {.round_to_dtype = true});
    ASSERT_TRUE(meaning.is_ok()) << meaning.status().to_string();
    auto s = Session::create(std::move(exe).value(), {.threads = 2});
    ASSERT_TRUE(s.is_ok());
    ASSERT_TRUE((*s)->set_parameter("w", wv).is_ok());
    auto out = (*s)->run({{"x", &xv}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const double tol = partials == DType::f32 ? 1e-5 : (partials == DType::f16 ? 2e-3 : 1.6e-2);
    for (int i = 0; i < 30; ++i) {
      const double want = meaning->at("y").data[size_t(i)];
      EXPECT_NEAR(out->at("y").data<float>()[i], want, tol * (1 + std::abs(want))) << i;
    }
  }
}

// Collectives are their own instructions: a group of one is the identity; a
// larger group needs a communicator for its group and says so when run
// without one (CollectivesRunOnTheReplicasCommunicators runs them).
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
      EXPECT_NE(out.status().message().find("collective all_reduce over group 'data' on replica 0: expected a "
                                            "communicator for the group (Session::set_communicator), found none"),
                std::string::npos)
          << out.status().message();
    }
  }
}

}  // namespace
}  // namespace aspen::runtime

namespace aspen::runtime {
namespace {

// Two programs share parameters by name: one writes state the other reads
// (the shape of generation's prefill and decode).
TEST(Session, ProgramsShareParameters) {
  Graph g1;
  Builder b1(g1);
  ValueId s1 = b1.parameter("state", DType::f32, {3});
  ValueId x = b1.input("x", DType::f32, {3});
  b1.update(s1, x);  // set
  b1.output("w_times_x", b1.mul(b1.parameter("w", DType::f32, {3}), x));
  Graph g2;
  Builder b2(g2);
  ValueId s2 = b2.parameter("state", DType::f32, {3});
  ValueId next = b2.scale(s2, 2.0);
  b2.update(s2, next);  // double
  b2.output("y", next);
  ASSERT_TRUE(b1.status().is_ok() && b2.status().is_ok());
  std::vector<std::unique_ptr<compiler::Executable>> programs;
  programs.push_back(std::move(compiler::compile(g1)).value());
  programs.push_back(std::move(compiler::compile(g2)).value());
  auto s = Session::create(std::move(programs), {.threads = 1});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  EXPECT_EQ((*s)->programs(), 2);
  ASSERT_EQ((*s)->parameters().size(), 2u);  // state, w
  Tensor w = random_tensor({3}, 1), xv = random_tensor({3}, 2);
  ASSERT_TRUE((*s)->set_parameter("w", w).is_ok());
  ASSERT_TRUE((*s)->run({{"x", &xv}}, {}, 0).is_ok());
  for (int k = 1; k <= 3; ++k) {
    auto y = (*s)->run({}, {}, 1);
    ASSERT_TRUE(y.is_ok()) << y.status().to_string();
    for (int i = 0; i < 3; ++i) EXPECT_EQ(y->at("y").data<float>()[i], xv.data<float>()[i] * float(1 << k));
  }
  EXPECT_EQ((*s)->run({}, {}, 2).status().message(), "run: program: expected an index below 2, found 2");

  // The same name with another type is refused at create().
  Graph g3;
  Builder b3(g3);
  b3.output("y", b3.parameter("state", DType::f32, {4}));
  std::vector<std::unique_ptr<compiler::Executable>> clash;
  clash.push_back(std::move(compiler::compile(g1)).value());
  clash.push_back(std::move(compiler::compile(g3)).value());
  EXPECT_EQ(Session::create(std::move(clash), {.threads = 1}).status().message(),
            "session: parameter 'state' of program 1: expected f32[3] (as an earlier program has it), found f32[4]");
}

// Past the weight-copy budget (core/weight_copies.h) a session plans without
// weight-only values and still computes the same, and gives back what it took.
TEST(Session, WeightOnlyValuesYieldToTheBudget) {
  Graph g;
  Builder b(g);
  ValueId w = b.parameter("w", DType::f32, {4, 3});
  ValueId x = b.input("x", DType::f32, {2, 4});
  b.output("y", b.op1(graph::OpKind::matmul, {x, b.transpose(b.scale(w, 0.5), {1, 0})}, {{"trans_b", int64_t(1)}}));
  ASSERT_TRUE(b.status().is_ok());
  Tensor wv = random_tensor({4, 3}, 1), xv = random_tensor({2, 4}, 2);
  auto run = [&](bool squeezed, int64_t* derived) -> Tensor {
    const int64_t room = weight_copy_budget() - weight_copy_bytes();
    if (squeezed) {
      EXPECT_TRUE(take_weight_copy_bytes(room));
    }
    auto exe = compiler::compile(g, {.hoist_weights = true});
    EXPECT_TRUE(exe.is_ok());
    auto s = Session::create(std::move(exe).value(), {.threads = 1});
    if (squeezed) give_weight_copy_bytes(room);
    EXPECT_TRUE(s.is_ok());
    *derived = (*s)->executable().plan.derived_bytes;
    EXPECT_TRUE((*s)->set_parameter("w", wv).is_ok());
    auto out = (*s)->run({{"x", &xv}});
    EXPECT_TRUE(out.is_ok());
    return out->at("y").clone();
  };
  const int64_t before = weight_copy_bytes();
  int64_t roomy = 0, tight = 0;
  const Tensor a = run(false, &roomy), c = run(true, &tight);
  EXPECT_GT(roomy, 0);
  EXPECT_EQ(tight, 0) << "no room: no weight-only values";
  for (int64_t i = 0; i < a.numel(); ++i) EXPECT_EQ(a.data<float>()[i], c.data<float>()[i]);
  EXPECT_EQ(weight_copy_bytes(), before) << "the sessions gave back what they took";
}

// Reshapes are views (compiler/memory_plan.h): no instruction, the input's
// bytes. The cases that could go wrong: a view read after its owner's last
// direct reader (the bytes must stay), an elementwise node in place over an
// owner whose view is read later, a view as an update's value (its copy must
// wait for the bytes), a reshape of a parameter the step updates (a copy:
// the output must be the old value), and a reshape of an update's value that
// lands in its parameter (a copy into another parameter).
TEST(Session, ReshapesAreViewsThatKeepTheirBytes) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4, 6});
  ValueId p = b.parameter("p", DType::f32, {24});
  ValueId q = b.parameter("q", DType::f32, {6, 4});
  ValueId e = b.exp(x);
  ValueId ev = b.reshape(e, {24});  // read at the end
  ValueId t = b.scale(e, 3.0);      // e's last direct reader: must not overwrite e
  b.output("t", b.reshape(t, {2, 12}));
  b.output("old_p", b.reshape(p, {4, 6}));  // p is updated: not a view
  ValueId p_new = b.add(p, ev);             // written into p's own storage
  b.update(p, p_new);
  b.update(b.parameter("r", DType::f32, {4, 6}), b.reshape(p_new, {4, 6}));  // an update's value: a copy
  b.update(q, b.reshape(b.neg(b.reshape(q, {24})), {6, 4}));  // views on both sides of a neg
  b.output("ev", b.add(ev, b.reshape(x, {24})));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto exe = compiler::compile(g, {.verify_each_pass = true});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  EXPECT_GE((*exe)->plan.views_made, 4) << (*exe)->listing();
  for (const auto& ins : (*exe)->program.code) {
    if (ins.node >= 0) {
      EXPECT_FALSE((*exe)->plan.views[size_t(ins.node)]) << (*exe)->listing();
    }
  }
  auto s = Session::create(std::move(exe).value(), {.threads = 1});
  ASSERT_TRUE(s.is_ok());
  Tensor xv = random_tensor({4, 6}, 1), pv = random_tensor({24}, 2), qv = random_tensor({6, 4}, 3);
  ASSERT_TRUE((*s)->set_parameter("p", pv).is_ok() && (*s)->set_parameter("q", qv).is_ok());
  auto got = (*s)->run({{"x", &xv}});
  ASSERT_TRUE(got.is_ok()) << got.status().to_string();
  for (int i = 0; i < 24; ++i) {
    const float ex = std::exp(xv.data<float>()[i]);
    EXPECT_FLOAT_EQ(got->at("t").data<float>()[i], 3 * ex) << i;
    EXPECT_EQ(got->at("old_p").data<float>()[i], pv.data<float>()[i]) << i;
    EXPECT_FLOAT_EQ(got->at("ev").data<float>()[i], ex + xv.data<float>()[i]) << i;
    EXPECT_FLOAT_EQ((*s)->get_parameter("p")->data<float>()[i], pv.data<float>()[i] + ex) << i;
    EXPECT_FLOAT_EQ((*s)->get_parameter("r")->data<float>()[i], pv.data<float>()[i] + ex) << i;
    EXPECT_EQ((*s)->get_parameter("q")->data<float>()[i], -qv.data<float>()[i]) << i;
  }
}

// NOTE [outputs written in place]: "y" is read again after it is made and still goes straight to the
// caller; "z" has a view read after it, "zv" is that view, "w1" and "w2" are one value: those go
// through the arena. Every output mode gets the same numbers (sums start from zero).
TEST(Session, OutputsAreWrittenInPlaceWhereSafe) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4, 6});
  ValueId y = b.exp(x);
  b.output("y", y);
  ValueId z = b.scale(y, 2.0);
  b.output("z", z);
  ValueId zv = b.reshape(z, {24});
  b.output("zv", zv);
  b.output("zsum", b.reduce_sum(zv, {0}));
  ValueId w = b.add(x, x);
  b.output("w1", w);
  b.output("w2", w);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto exe = compiler::compile(g, {.verify_each_pass = true});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  auto s = Session::create(std::move(exe).value(), {.threads = 1});
  ASSERT_TRUE(s.is_ok());
  const std::vector<std::string> direct = (*s)->direct_outputs();
  EXPECT_NE(std::find(direct.begin(), direct.end(), "y"), direct.end());
  EXPECT_NE(std::find(direct.begin(), direct.end(), "zsum"), direct.end());
  for (const char* name : {"z", "zv", "w1", "w2"})
    EXPECT_EQ(std::find(direct.begin(), direct.end(), name), direct.end()) << name;
  Tensor xv = random_tensor({3, 4, 6}, 4);
  for (OutputMode mode : {OutputMode::all, OutputMode::final, OutputMode::sum}) {
    auto got = (*s)->run({{"x", &xv}}, {.iterations = 3, .output_mode = mode});
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    for (int64_t step = 0; step < 3; ++step) {
      if (mode == OutputMode::final && step < 2) continue;
      const int64_t at = mode == OutputMode::all ? step * 24 : 0;
      double zsum = 0;
      for (int i = 0; i < 24; ++i) {
        const float xi = xv.data<float>()[step * 24 + i], e = std::exp(xi);
        zsum += 2.0 * e;
        if (mode == OutputMode::sum) continue;
        EXPECT_FLOAT_EQ(got->at("y").data<float>()[at + i], e);
        EXPECT_FLOAT_EQ(got->at("z").data<float>()[at + i], 2 * e);
        EXPECT_FLOAT_EQ(got->at("zv").data<float>()[at + i], 2 * e);
        EXPECT_FLOAT_EQ(got->at("w1").data<float>()[at + i], 2 * xi);
        EXPECT_FLOAT_EQ(got->at("w2").data<float>()[at + i], 2 * xi);
      }
      if (mode != OutputMode::sum) {
        EXPECT_NEAR(got->at("zsum").data<float>()[mode == OutputMode::all ? step : 0], zsum, 1e-4 * zsum);
      }
    }
    if (mode == OutputMode::sum) {  // the three steps added up, from zero
      double want = 0;
      for (int i = 0; i < 72; ++i) want += xv.data<float>()[i] * 2.0;
      double have = 0;
      for (int i = 0; i < 24; ++i) have += got->at("w1").data<float>()[i];
      EXPECT_NEAR(have, want, 1e-4 * (1 + std::fabs(want)));
    }
  }
}

// Weight-only values (CompileOptions::hoist_weights): the program casts and
// transposes "w" (and scales a constant) once, then reuses them until "w"
// changes through set_parameter, parameter_of or a program that updates it.
// Each run must equal the same program compiled without hoisting; the trace
// shows the derived instructions only on the runs that remade them.
TEST(Session, WeightOnlyValuesAreMadeOnceUntilAParameterChanges) {
  Graph g1;
  Builder b1(g1);
  ValueId w = b1.parameter("w", DType::f32, {4, 3});
  ValueId x = b1.input("x", DType::f32, {2, 4});
  ValueId wt = b1.transpose(b1.scale(w, 0.5), {1, 0});         // [3, 4]: weight-only
  ValueId k = b1.exp(b1.broadcast(b1.scalar(0.25f), {2, 3}));  // folded
  b1.output("y", b1.add(b1.op1(graph::OpKind::matmul, {x, wt}, {{"trans_b", int64_t(1)}}), k));
  Graph g2;  // a second program that updates "w"
  Builder b2(g2);
  ValueId w2 = b2.parameter("w", DType::f32, {4, 3});
  b2.update(w2, b2.scale(w2, 2.0));
  ASSERT_TRUE(b1.status().is_ok() && b2.status().is_ok()) << b1.status().to_string() << b2.status().to_string();

  profile::TraceRecorder trace;
  compiler::CompileOptions hoist{.compute = DType::bf16, .hoist_weights = true};
  std::vector<std::unique_ptr<compiler::Executable>> programs;
  programs.push_back(std::move(compiler::compile(g1, hoist)).value());
  programs.push_back(std::move(compiler::compile(g2, hoist)).value());
  const compiler::Executable& exe = *programs[0];
  int derived = 0;
  for (const auto& ins : exe.program.code) derived += ins.derived;
  EXPECT_GE(derived, 3) << exe.listing();  // scale, transpose, the cast to bf16
  EXPECT_GT(exe.plan.derived_bytes, 0);
  EXPECT_NE(exe.plan.report(exe.graph).find("weight-only values"), std::string::npos);
  for (const auto& ins : programs[1]->program.code) EXPECT_FALSE(ins.derived) << programs[1]->listing();
  int keeping = 0;
  for (const auto& ins : exe.program.code) keeping += ins.keeps_fixed;
  EXPECT_EQ(keeping, 1) << "the matmul, whose b is weight-only";
  // Every product chosen so far runs on aspen's kernels, which keep the packed weight (NOTE [fixed b]),
  // so that a missed fixed_inputs_changed() shows as a stale result below.
  {
    std::istringstream lines(kernels::matmul_choices_text());
    std::string line, forced;
    for (int n = 0; std::getline(lines, line); ++n) {
      if (n < 2 || line.empty()) {
        forced += line + "\n";
        continue;
      }
      forced += line.substr(0, line.rfind(' ')) + " aspen\n";  // the shape, without its backend
    }
    ASSERT_TRUE(kernels::adopt_matmul_choices(forced, "the test").is_ok());
  }
  auto s = Session::create(std::move(programs), {.threads = 1, .trace = &trace});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();

  auto plain = Session::create(std::move(compiler::compile(g1, {.compute = DType::bf16})).value(), {.threads = 1});
  ASSERT_TRUE(plain.is_ok());
  Tensor xv = random_tensor({2, 4}, 3);
  int remade_before = 0;
  auto expect_run = [&](const char* when, bool remade) {
    ASSERT_TRUE((*plain)->set_parameter("w", *(*s)->get_parameter("w")).is_ok());
    const size_t before = trace.size();
    auto got = (*s)->run({{"x", &xv}});
    ASSERT_TRUE(got.is_ok()) << got.status().to_string();
    auto want = (*plain)->run({{"x", &xv}});
    ASSERT_TRUE(want.is_ok());
    for (int64_t i = 0; i < 6; ++i) EXPECT_EQ(got->at("y").data<float>()[i], want->at("y").data<float>()[i]) << when;
    int remade_now = 0;
    for (const auto& e : trace.events())
      for (const auto& [key, value] : e.args) remade_now += key == "derived";
    EXPECT_EQ(remade_now - remade_before, remade ? derived : 0) << when;
    EXPECT_GT(trace.size(), before);
    remade_before = remade_now;
  };
  ASSERT_TRUE((*s)->set_parameter("w", random_tensor({4, 3}, 1)).is_ok());
  expect_run("the first run", true);
  expect_run("a second run", false);
  ASSERT_TRUE((*s)->set_parameter("w", random_tensor({4, 3}, 2)).is_ok());
  expect_run("after set_parameter", true);
  expect_run("again", false);
  ASSERT_TRUE((*s)->run({}, {}, 1).is_ok());  // doubles w
  expect_run("after a program updated w", true);
  (*s)->parameter_of(0, "w")->data<float>()[0] = 7.0f;
  expect_run("after a write through parameter_of", true);
  expect_run("and once more", false);
}

}  // namespace
}  // namespace aspen::runtime

namespace aspen::runtime {
namespace {

// Updates become final early (Executable::update_ready) and run_replica's
// on_ready says so while the program goes on: "early" is set from a value
// made at the start (a copy placed right after it, not at the end), "late"
// from the last product; "read" is updated from an early value but read by
// a later instruction, so its copy waits until after that read (which must
// see the old value). At each callback the parameter already holds its new
// value; every update is reported once; the results are those of the program
// without the hook.
TEST(Session, UpdatesAreReportedWhenFinal) {
  Graph g;
  Builder b(g);
  const ValueId x = b.input("x", DType::f32, {4, 4});
  const ValueId early = b.parameter("early", DType::f32, {4, 4});
  const ValueId late = b.parameter("late", DType::f32, {4, 4});
  const ValueId read = b.parameter("read", DType::f32, {4, 4});
  const ValueId w = b.parameter("w", DType::f32, {4, 4});
  const ValueId first = b.op1(graph::OpKind::matmul, {x, w});  // made at the start
  ValueId h = first;
  for (int k = 0; k < 4; ++k) h = b.tanh(b.op1(graph::OpKind::matmul, {h, w}));
  const ValueId uses_read = b.add(h, read);  // reads "read" late
  b.update(early, first);
  b.update(read, b.scale(first, 2.0));
  b.update(late, b.op1(graph::OpKind::matmul, {uses_read, w}));
  b.output("y", uses_read);
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto exe = compiler::compile(g, {.opt_level = compiler::OptLevel::O0});
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  const compiler::Executable& e = **exe;
  ASSERT_EQ(e.updates.size(), 3u);
  ASSERT_EQ(e.update_ready.size(), 3u);
  std::map<std::string, int32_t> ready;
  for (size_t u = 0; u < 3; ++u) ready[e.updates[u].name] = e.update_ready[u];
  const int32_t end = int32_t(e.program.code.size());
  EXPECT_LT(ready["early"], ready["late"]) << e.listing();
  EXPECT_LT(ready["early"], end / 2) << e.listing();
  EXPECT_GT(ready["read"], ready["early"]) << e.listing();
  auto s = Session::create(std::move(exe).value(), {.threads = 1});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Tensor xv = random_tensor({4, 4}, 3), wv = random_tensor({4, 4}, 4), rv = random_tensor({4, 4}, 5);
  ASSERT_TRUE((*s)->set_parameter("w", wv).is_ok());
  ASSERT_TRUE((*s)->set_parameter("read", rv).is_ok());
  auto plain = (*s)->run_replica(0, {{"x", &xv}}, 0);
  ASSERT_TRUE(plain.is_ok()) << plain.status().to_string();
  std::map<std::string, Tensor> want;
  for (const char* p : {"early", "late", "read"}) want.emplace(p, (*s)->get_parameter(p).value());
  // y = tanh(...) + the old "read": check that the late read saw it.
  ASSERT_TRUE((*s)->set_parameter("read", rv).is_ok());
  std::vector<std::string> order;
  bool all_final = true;
  auto hooked = (*s)->run_replica(0, {{"x", &xv}}, 0, [&](int u) {
    const std::string& name = (*s)->executable().updates[size_t(u)].name;
    order.push_back(name);
    const Tensor* now = (*s)->parameter_of(0, name);
    all_final = all_final && std::memcmp(now->raw(), want.at(name).raw(), now->nbytes()) == 0;
  });
  ASSERT_TRUE(hooked.is_ok()) << hooked.status().to_string();
  EXPECT_TRUE(all_final);
  EXPECT_EQ(order, (std::vector<std::string>{"early", "read", "late"}));
  EXPECT_EQ(std::memcmp(hooked->at("y").raw(), plain->at("y").raw(), plain->at("y").nbytes()), 0);
}

// Data-parallel training's shape: each replica accumulates into its own copy
// of "acc.*" (replica-local) from its own input, then one replica at a time
// updates the shared weight; run() refuses a program that updates a shared
// parameter on several replicas at once.
TEST(Session, ReplicaLocalParametersAndPerReplicaRuns) {
  Graph g1;  // acc += x * w
  Builder b1(g1);
  ValueId acc = b1.parameter("acc.w", DType::f32, {3});
  ValueId w = b1.parameter("w", DType::f32, {3});
  b1.update(acc, b1.add(acc, b1.mul(b1.input("x", DType::f32, {3}), w)));
  Graph g2;  // w -= acc
  Builder b2(g2);
  ValueId w2 = b2.parameter("w", DType::f32, {3});
  b2.update(w2, b2.sub(w2, b2.parameter("acc.w", DType::f32, {3})));
  ASSERT_TRUE(b1.status().is_ok() && b2.status().is_ok());
  std::vector<std::unique_ptr<compiler::Executable>> programs;
  programs.push_back(std::move(compiler::compile(g1)).value());
  programs.push_back(std::move(compiler::compile(g2)).value());
  auto made = Session::create(std::move(programs), {.threads = 1, .replicas = 2, .replica_local = {"acc."}});
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  Session& s = **made;
  Tensor wv = random_tensor({3}, 3), x0 = random_tensor({3}, 4), x1 = random_tensor({3}, 5);
  ASSERT_TRUE(s.set_parameter("w", wv).is_ok());
  ASSERT_TRUE(s.set_parameter("acc.w", Tensor(DType::f32, {3})).is_ok());  // zeros on every replica
  const Tensor* xs[2] = {&x0, &x1};
  ASSERT_TRUE(s.for_each_replica([&](int r) { return s.run_replica(r, {{"x", xs[r]}}, 0).status(); }).is_ok());
  for (int r = 0; r < 2; ++r)
    for (int i = 0; i < 3; ++i)
      EXPECT_EQ(s.parameter_of(r, "acc.w")->data<float>()[i], xs[r]->data<float>()[i] * wv.data<float>()[i]);
  EXPECT_EQ(s.parameter_of(0, "w"), s.parameter_of(1, "w"));  // shared
  EXPECT_NE(s.parameter_of(0, "acc.w"), s.parameter_of(1, "acc.w"));
  EXPECT_EQ(s.parameter_of(0, "nope"), nullptr);
  // Replica 1's update, from outside for_each_replica (it runs on its team).
  ASSERT_TRUE(s.run_replica(1, {}, 1).is_ok());
  for (int i = 0; i < 3; ++i)
    EXPECT_EQ(s.get_parameter("w")->data<float>()[i],
              wv.data<float>()[i] - x1.data<float>()[i] * wv.data<float>()[i]);
  // The whole-session run of the shared update is refused; the local one is fine.
  EXPECT_EQ(s.run({}, {}, 1).status().code(), Code::kFailedPrecondition);
  Tensor both(DType::f32, {2, 3});
  EXPECT_TRUE(s.run({{"x", &both}}, {}, 0).is_ok());
  // The first real failure wins over the peers' aborts.
  const Status st = s.for_each_replica([](int r) {
    return r == 1 ? Status::invalid_argument("replica 1", "x", "y")
                  : Status::error(Code::kAborted, "replica 0", "a working group", "aborted");
  });
  EXPECT_EQ(st.code(), Code::kInvalidArgument);
}

// replica_uses: a replica holds only the local parameters it uses; a program
// that needs one it lacks is refused there, naming it.
TEST(Session, ReplicasHoldOnlyTheLocalParametersTheyUse) {
  Graph g;
  Builder b(g);
  ValueId acc = b.parameter("acc.w", DType::f32, {3});
  b.update(acc, b.add(acc, b.input("x", DType::f32, {3})));
  ASSERT_TRUE(b.status().is_ok());
  auto made = Session::create(compiler::compile(g).value(),
                              {.threads = 1,
                               .replicas = 2,
                               .replica_local = {"acc."},
                               .replica_uses = [](int r, const std::string&) { return r == 0; }});
  ASSERT_TRUE(made.is_ok()) << made.status().to_string();
  Session& s = **made;
  EXPECT_NE(s.parameter_of(0, "acc.w"), nullptr);
  EXPECT_EQ(s.parameter_of(1, "acc.w"), nullptr);
  Tensor x = random_tensor({3}, 8);
  EXPECT_TRUE(s.run_replica(0, {{"x", &x}}, 0).is_ok());
  const Status refused = s.run_replica(1, {{"x", &x}}, 0).status();
  EXPECT_EQ(refused.code(), Code::kFailedPrecondition);
  EXPECT_NE(refused.message().find("'acc.w'"), std::string::npos) << refused.message();
  auto got = s.get_parameter("acc.w");  // replica 0's copy
  ASSERT_TRUE(got.is_ok());
  for (int i = 0; i < 3; ++i) EXPECT_EQ(got->data<float>()[i], x.data<float>()[i]);
}

}  // namespace
}  // namespace aspen::runtime

namespace aspen::runtime {
namespace {

// Two replicas whose collective instructions run on a threads group:
// all_reduce, all_gather and reduce_scatter, against the same arithmetic
// done here.
TEST(Session, CollectivesRunOnTheReplicasCommunicators) {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {4});
  const graph::Attrs tensor = {{"group", std::string("tensor")}, {"group_size", int64_t(2)}};
  graph::Attrs sum = tensor;
  sum.set("reduce", std::string("sum"));
  b.output("sum", b.op1(graph::OpKind::all_reduce, {x}, sum));
  b.output("gathered", b.op1(graph::OpKind::all_gather, {x}, tensor));
  b.output("scattered", b.op1(graph::OpKind::reduce_scatter, {x}, tensor));
  ASSERT_TRUE(b.status().is_ok()) << b.status().to_string();
  auto exe = compiler::compile(g);
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  {
    auto made = Session::create(std::move(exe).value(), {.threads = 1, .replicas = 2});
    ASSERT_TRUE(made.is_ok()) << made.status().to_string();
    Session& s = **made;
    auto comms = parallel::make_threads_group(2).value();
    for (int r = 0; r < 2; ++r) ASSERT_TRUE(s.set_communicator(r, "tensor", comms[size_t(r)].get()).is_ok());
    Tensor in = random_tensor({2, 4}, 17);  // replica r's x is row r
    auto out = s.run({{"x", &in}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    const float* x0 = in.data<float>();
    const float* x1 = x0 + 4;
    for (int r = 0; r < 2; ++r) {
      for (int i = 0; i < 4; ++i) {
        EXPECT_EQ(out->at("sum").data<float>()[r * 4 + i], x0[i] + x1[i]);
        EXPECT_EQ(out->at("gathered").data<float>()[r * 8 + i], x0[i]);
        EXPECT_EQ(out->at("gathered").data<float>()[r * 8 + 4 + i], x1[i]);
      }
      for (int i = 0; i < 2; ++i) EXPECT_EQ(out->at("scattered").data<float>()[r * 2 + i], x0[2 * r + i] + x1[2 * r + i]);
    }
  }  // the session's cores go back to the budget
}

}  // namespace
}  // namespace aspen::runtime
