#include "train/optimizer.h"

#include <gtest/gtest.h>

#include <cmath>

#include "compiler/executable.h"
#include "core/philox.h"
#include "graph/autodiff.h"
#include "graph/interpreter.h"
#include "graph/verify.h"
#include "kernels/adamw.h"
#include "kernels/optimizers.h"
#include "runtime/session.h"

namespace aspen::train {
namespace {

using graph::Builder;
using graph::Graph;
using graph::HostArray;
using graph::ValueId;

Tensor random_tensor(Shape s, uint64_t seed, float lo = -1, float hi = 1) {
  Tensor t(DType::f32, s);
  philox_fill_uniform(t.span<float>(), seed, 0, 0, lo, hi);
  return t;
}

// A two-layer regression: loss = mean((gelu(x W1^T + b1) W2^T - y)^2), with
// weight decay off for biases. Returns the parameter names.
std::vector<std::string> build_regression(Graph& g, const OptimizerOptions& opt) {
  Builder b(g);
  const int64_t B = 5, I = 7, H = 6, O = 3;
  ValueId x = b.input("x", DType::f32, {B, I});
  ValueId y = b.input("y", DType::f32, {B, O});
  ValueId w1 = b.parameter("fc1.weight", DType::f32, {H, I});
  ValueId b1 = b.parameter("fc1.bias", DType::f32, {H});
  ValueId w2 = b.parameter("fc2.weight", DType::f32, {O, H});
  ValueId h = b.gelu(b.op1(graph::OpKind::matmul, {x, w1, b1}, {{"trans_b", int64_t(1)}}));
  ValueId d = b.sub(b.op1(graph::OpKind::matmul, {h, w2}, {{"trans_b", int64_t(1)}}), y);
  ValueId loss = b.scale(b.reduce_sum(b.mul(d, d), {0, 1}), 1.0 / double(B * O));
  b.output("loss", loss);
  std::vector<ValueId> params = {w1, b1, w2};
  auto grads = graph::append_gradients(g, loss, params);
  EXPECT_TRUE(grads.is_ok()) << grads.status().to_string();
  auto o = append_optimizer(b, params, *grads, opt);
  EXPECT_TRUE(o.is_ok()) << o.status().to_string();
  return {"fc1.weight", "fc1.bias", "fc2.weight"};
}
std::vector<std::string> build_regression(Graph& g, const AdamWOptions& a) {
  OptimizerOptions o;
  o.beta1 = a.beta1, o.beta2 = a.beta2, o.eps = a.eps, o.weight_decay = a.weight_decay, o.no_decay = a.no_decay;
  return build_regression(g, o);
}

// SGD (plain, momentum, Nesterov) and LAMB, with a gradient scale: three
// compiled steps in one call equal three interpreted ones, updated in place.
TEST(Optimizers, SgdAndLambCompiledMatchInterpreter) {
  std::vector<std::pair<std::string, OptimizerOptions>> cases;
  OptimizerOptions sgd;
  sgd.kind = OptimizerKind::sgd, sgd.weight_decay = 0.01;
  cases.emplace_back("sgd", sgd);
  sgd.momentum = 0.9;
  cases.emplace_back("sgd momentum", sgd);
  sgd.nesterov = true, sgd.no_decay = {"bias"};
  cases.emplace_back("sgd nesterov", sgd);
  OptimizerOptions lamb;
  lamb.kind = OptimizerKind::lamb, lamb.eps = 1e-6, lamb.weight_decay = 0.05, lamb.no_decay = {"bias"};
  cases.emplace_back("lamb", lamb);
  for (auto [label, opt] : cases) {
    SCOPED_TRACE(label);
    opt.grad_scale_input = true;
    Graph g;
    build_regression(g, opt);
    ASSERT_TRUE(graph::verify(g).is_ok());
    std::map<std::string, HostArray> feeds;
    std::map<std::string, Tensor> init;
    init.emplace("fc1.weight", random_tensor({6, 7}, 1));
    init.emplace("fc1.bias", random_tensor({6}, 2));
    init.emplace("fc2.weight", random_tensor({3, 6}, 3));
    int64_t params = 0;
    for (int32_t i : g.parameter_nodes()) {
      const graph::Node& n = g.node(i);
      ++params;
      feeds[n.name] = init.count(n.name) ? HostArray::from_tensor(init.at(n.name)) : HostArray(g.type(n.outputs[0]));
    }
    const Tensor x = random_tensor({5, 7}, 4), y = random_tensor({5, 3}, 5);
    Tensor lr(DType::f32, Shape{}), gs(DType::f32, Shape{});
    lr.span<float>()[0] = 0.05f;
    gs.span<float>()[0] = 0.5f;
    feeds["x"] = HostArray::from_tensor(x);
    feeds["y"] = HostArray::from_tensor(y);
    feeds[kLrName] = HostArray::from_tensor(lr);
    feeds[kGradScaleName] = HostArray::from_tensor(gs);
    std::vector<double> want_loss;
    for (int step = 0; step < 3; ++step) {
      auto r = graph::interpret_step(g, feeds, {.round_to_dtype = true});
      ASSERT_TRUE(r.is_ok()) << r.status().to_string();
      want_loss.push_back(r->outputs.at("loss").data[0]);
      ASSERT_EQ(int64_t(r->updates.size()), params);
      for (auto& [k, v] : r->updates) feeds[k] = v;
    }
    EXPECT_LT(want_loss[2], want_loss[0]);  // it learns
    auto exe = compiler::compile(g, {.opt_level = compiler::OptLevel::O2, .verify_each_pass = true});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    EXPECT_EQ((*exe)->plan.updates_in_place, params) << (*exe)->listing();
    auto session = runtime::Session::create(std::move(exe).value(), {.threads = 2});
    ASSERT_TRUE(session.is_ok()) << session.status().to_string();
    for (const auto& [k, v] : init) ASSERT_TRUE((*session)->set_parameter(k, v).is_ok());
    Tensor x3(DType::f32, {3, 5, 7}), y3(DType::f32, {3, 5, 3}), lr3(DType::f32, {3}), gs3(DType::f32, {3});
    for (int st = 0; st < 3; ++st) {
      std::copy(x.span<float>().begin(), x.span<float>().end(), x3.span<float>().begin() + st * 35);
      std::copy(y.span<float>().begin(), y.span<float>().end(), y3.span<float>().begin() + st * 15);
      lr3.span<float>()[st] = 0.05f;
      gs3.span<float>()[st] = 0.5f;
    }
    auto out = (*session)->run({{"x", &x3}, {"y", &y3}, {kLrName, &lr3}, {kGradScaleName, &gs3}},
                               {.iterations = 3, .output_mode = runtime::OutputMode::all});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    for (int st = 0; st < 3; ++st)
      EXPECT_NEAR(out->at("loss").span<float>()[st], want_loss[size_t(st)],
                  1e-5 * (1 + std::abs(want_loss[size_t(st)])));
    for (int32_t i : g.parameter_nodes()) {
      const std::string& k = g.node(i).name;
      auto got = (*session)->get_parameter(k);
      ASSERT_TRUE(got.is_ok()) << k;
      const HostArray h = HostArray::from_tensor(*got);
      const HostArray& ref = feeds.at(k);
      for (size_t e = 0; e < h.data.size(); ++e)
        ASSERT_NEAR(h.data[e], ref.data[e], 2e-5 * (1 + std::abs(ref.data[e]))) << k << "[" << e << "]";
    }
  }
}

TEST(AdamW, CompiledStepsMatchInterpreterAndUpdateInPlace) {
  AdamWOptions opt{.weight_decay = 0.1, .no_decay = {"bias"}};
  Graph g;
  const std::vector<std::string> names = build_regression(g, opt);
  ASSERT_TRUE(graph::verify(g).is_ok());

  std::map<std::string, Tensor> state;
  state.emplace("fc1.weight", random_tensor({6, 7}, 1));
  state.emplace("fc1.bias", random_tensor({6}, 2));
  state.emplace("fc2.weight", random_tensor({3, 6}, 3));
  const Tensor x = random_tensor({5, 7}, 4), y = random_tensor({5, 3}, 5);
  Tensor lr(DType::f32, Shape{});
  lr.span<float>()[0] = 0.05f;

  // Reference: three steps through the interpreter, feeding updates back.
  std::map<std::string, HostArray> feeds;
  for (const auto& [k, v] : state) {
    feeds[k] = HostArray::from_tensor(v);
    feeds[exp_avg_name(k)] = HostArray(graph::TensorType{DType::f32, v.shape()});
    feeds[exp_avg_sq_name(k)] = HostArray(graph::TensorType{DType::f32, v.shape()});
  }
  feeds[kStepName] = HostArray(graph::TensorType{DType::f32, Shape{}});
  feeds["x"] = HostArray::from_tensor(x);
  feeds["y"] = HostArray::from_tensor(y);
  feeds[kLrName] = HostArray::from_tensor(lr);
  std::vector<double> want_loss;
  for (int step = 0; step < 3; ++step) {
    auto r = graph::interpret_step(g, feeds, {.round_to_dtype = true});
    ASSERT_TRUE(r.is_ok()) << r.status().to_string();
    want_loss.push_back(r->outputs.at("loss").data[0]);
    ASSERT_EQ(r->updates.size(), 1 + 3 * names.size());
    for (auto& [k, v] : r->updates) feeds[k] = v;
  }
  EXPECT_LT(want_loss[2], want_loss[0]);  // it learns
  EXPECT_EQ(feeds.at(kStepName).data[0], 3.0);

  for (auto level : {compiler::OptLevel::O0, compiler::OptLevel::O2}) {
    auto exe = compiler::compile(g, {.opt_level = level, .verify_each_pass = true});
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    if (level == compiler::OptLevel::O2) {
      // Every update lands in its parameter's storage: no copies.
      EXPECT_EQ((*exe)->plan.updates_in_place, int64_t(1 + 3 * names.size())) << (*exe)->listing();
      for (const auto& ins : (*exe)->program.code) EXPECT_NE(ins.kind, compiler::InstrKind::copy);
    }
    auto session = runtime::Session::create(std::move(exe).value(), {.threads = 2});
    ASSERT_TRUE(session.is_ok()) << session.status().to_string();
    for (const auto& [k, v] : state) ASSERT_TRUE((*session)->set_parameter(k, v).is_ok());
    // One call of three device iterations: inputs carry a leading [3].
    Tensor x3(DType::f32, {3, 5, 7}), y3(DType::f32, {3, 5, 3}), lr3(DType::f32, {3});
    for (int s = 0; s < 3; ++s) {
      std::copy(x.span<float>().begin(), x.span<float>().end(), x3.span<float>().begin() + s * 35);
      std::copy(y.span<float>().begin(), y.span<float>().end(), y3.span<float>().begin() + s * 15);
      lr3.span<float>()[s] = 0.05f;
    }
    auto out = (*session)->run({{"x", &x3}, {"y", &y3}, {kLrName, &lr3}},
                               {.iterations = 3, .output_mode = runtime::OutputMode::all});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    for (int s = 0; s < 3; ++s)
      EXPECT_NEAR(out->at("loss").span<float>()[s], want_loss[size_t(s)], 1e-5 * (1 + std::abs(want_loss[size_t(s)])));
    for (const auto& [k, ref] : feeds) {
      if (k == "x" || k == "y" || k == kLrName) continue;
      auto got = (*session)->get_parameter(k);
      ASSERT_TRUE(got.is_ok()) << k;
      const HostArray h = HostArray::from_tensor(*got);
      for (size_t i = 0; i < h.data.size(); ++i)
        ASSERT_NEAR(h.data[i], ref.data[i], 2e-5 * (1 + std::abs(ref.data[i]))) << k << "[" << i << "]";
    }
  }
}

TEST(AdamW, OneStepMatchesTheKernel) {
  // The op's fast kernel is kernels::adamw_step with the scalars read at run time.
  Graph g;
  Builder b(g);
  ValueId p = b.parameter("p", DType::f32, {11});
  ValueId grad = b.input("g", DType::f32, {11});
  ASSERT_TRUE(append_adamw(b, std::vector<ValueId>{p}, std::vector<ValueId>{grad}, {}).is_ok());
  auto exe = compiler::compile(g);
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  auto session = runtime::Session::create(std::move(exe).value(), {.threads = 1});
  ASSERT_TRUE(session.is_ok());
  Tensor p0 = random_tensor({11}, 7), g0 = random_tensor({11}, 8);
  ASSERT_TRUE((*session)->set_parameter("p", p0).is_ok());
  Tensor lr(DType::f32, Shape{});
  lr.span<float>()[0] = 1e-2f;
  std::vector<float> param(p0.span<float>().begin(), p0.span<float>().end()), m(11), v(11);
  for (int step = 1; step <= 2; ++step) {
    ASSERT_TRUE((*session)->run({{"g", &g0}, {kLrName, &lr}}).is_ok());
    kernels::AdamWConfig c;
    c.lr = double(1e-2f);
    c.step = step;
    ASSERT_TRUE(kernels::adamw_step(param, g0.span<float>(), m, v, 11, c).is_ok());
  }
  const Tensor got = std::move((*session)->get_parameter("p")).value();
  for (int i = 0; i < 11; ++i) EXPECT_EQ(got.span<float>()[i], param[size_t(i)]) << i;
  EXPECT_EQ((*session)->get_parameter(kStepName)->span<float>()[0], 2.0f);
}

// Optimizer state in half precision (PopTorch's first_order_momentum_accum_type / second_order_..., velocity_
// accum_type): kept in its dtype, and each step equals the f32 kernel's on the widened state with the new state
// rounded to nearest even, bitwise. Gradient rounding (gradient_dtype) is round_to: f32 -> dtype -> f32.
TEST(Optimizers, HalfPrecisionStateIsKeptRoundedToItsType) {
  auto round = [](std::vector<float>& x, DType t) {
    for (float& e : x) e = t == DType::f16 ? f16_to_f32(f32_to_f16(e)) : bf16_to_f32(f32_to_bf16(e));
  };
  for (OptimizerKind kind : {OptimizerKind::adamw, OptimizerKind::sgd}) {
    SCOPED_TRACE(optimizer_kind_name(kind));
    Graph g;
    Builder b(g);
    ValueId p = b.parameter("p", DType::f32, {13});
    ValueId grad = b.input("g", DType::f32, {13});
    OptimizerOptions o;
    o.kind = kind;
    o.momentum = 0.9;
    o.first_order_dtype = DType::f16, o.second_order_dtype = DType::bf16;
    ASSERT_TRUE(append_optimizer(b, std::vector<ValueId>{p}, std::vector<ValueId>{grad}, o).is_ok());
    auto exe = compiler::compile(g);
    ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
    auto session = runtime::Session::create(std::move(exe).value(), {.threads = 1});
    ASSERT_TRUE(session.is_ok());
    Tensor p0 = random_tensor({13}, 7);
    ASSERT_TRUE((*session)->set_parameter("p", p0).is_ok());
    Tensor lr(DType::f32, Shape{});
    lr.span<float>()[0] = 1e-2f;
    std::vector<float> param(p0.span<float>().begin(), p0.span<float>().end()), m(13), v(13);
    for (int step = 1; step <= 3; ++step) {
      Tensor g0 = random_tensor({13}, 8 + uint64_t(step), -1e-3f, 1e-3f);
      ASSERT_TRUE((*session)->run({{"g", &g0}, {kLrName, &lr}}).is_ok());
      if (kind == OptimizerKind::adamw) {
        kernels::AdamWConfig c;
        c.lr = double(1e-2f), c.step = step;
        ASSERT_TRUE(kernels::adamw_step(param, g0.span<float>(), m, v, 13, c).is_ok());
        round(v, DType::bf16);
      } else {
        kernels::SgdConfig c;
        c.lr = double(1e-2f), c.momentum = 0.9, c.weight_decay = 1e-2;
        ASSERT_TRUE(kernels::sgd_step(param, g0.span<float>(), m, 13, c).is_ok());
      }
      round(m, DType::f16);
    }
    const Tensor got = std::move((*session)->get_parameter("p")).value();
    for (int i = 0; i < 13; ++i) EXPECT_EQ(got.span<float>()[i], param[size_t(i)]) << i;
    const std::string first = kind == OptimizerKind::adamw ? exp_avg_name("p") : momentum_buffer_name("p");
    const Tensor mt = std::move((*session)->get_parameter(first)).value();
    ASSERT_EQ(mt.dtype(), DType::f16);
    for (int i = 0; i < 13; ++i) EXPECT_EQ(f16_to_f32(mt.span<f16>()[i]), m[size_t(i)]) << i;
    if (kind == OptimizerKind::adamw) {
      const Tensor vt = std::move((*session)->get_parameter(exp_avg_sq_name("p"))).value();
      ASSERT_EQ(vt.dtype(), DType::bf16);
      for (int i = 0; i < 13; ++i) EXPECT_EQ(bf16_to_f32(vt.span<bf16>()[i]), v[size_t(i)]) << i;
    }
  }
  // Another dtype is named.
  Graph g;
  Builder b(g);
  ValueId p = b.parameter("p", DType::f32, {4});
  OptimizerOptions o;
  o.first_order_dtype = DType::i32;
  auto r = append_optimizer(b, std::vector<ValueId>{p}, std::vector<ValueId>{b.input("g", DType::f32, {4})}, o);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().subject(), "append_adamw: first_order_dtype") << r.status().to_string();
}

// Parameter groups: each group's parameters step with its own settings and its share of the learning rate,
// against kernels::adamw_step run by hand; the others with the optimizer's. A parameter in two groups is named.
TEST(AdamW, ParameterGroupsStepWithTheirOwnSettings) {
  Graph g;
  Builder b(g);
  ValueId p = b.parameter("p", DType::f32, {11}), q = b.parameter("q", DType::f32, {11});
  ValueId gp = b.input("gp", DType::f32, {11}), gq = b.input("gq", DType::f32, {11});
  OptimizerOptions o;
  o.weight_decay = 0.1;
  o.groups = {ParamGroup{.params = {"q"}, .lr_scale = 0.25, .weight_decay = 0.0, .beta1 = 0.8, .beta2 = 0.99,
                         .eps = 1e-6, .momentum = std::nullopt, .alpha = std::nullopt}};
  ASSERT_TRUE(append_optimizer(b, std::vector<ValueId>{p, q}, std::vector<ValueId>{gp, gq}, o).is_ok());
  auto exe = compiler::compile(g);
  ASSERT_TRUE(exe.is_ok()) << exe.status().to_string();
  auto session = runtime::Session::create(std::move(exe).value(), {.threads = 1});
  ASSERT_TRUE(session.is_ok());
  Tensor p0 = random_tensor({11}, 7), q0 = random_tensor({11}, 9), g0 = random_tensor({11}, 8);
  ASSERT_TRUE((*session)->set_parameter("p", p0).is_ok());
  ASSERT_TRUE((*session)->set_parameter("q", q0).is_ok());
  Tensor lr(DType::f32, Shape{});
  lr.span<float>()[0] = 1e-2f;
  std::vector<float> pv(p0.span<float>().begin(), p0.span<float>().end()), pm(11), pvv(11);
  std::vector<float> qv(q0.span<float>().begin(), q0.span<float>().end()), qm(11), qvv(11);
  for (int step = 1; step <= 2; ++step) {
    ASSERT_TRUE((*session)->run({{"gp", &g0}, {"gq", &g0}, {kLrName, &lr}}).is_ok());
    kernels::AdamWConfig c;
    c.lr = double(1e-2f), c.step = step, c.weight_decay = 0.1;
    ASSERT_TRUE(kernels::adamw_step(pv, g0.span<float>(), pm, pvv, 11, c).is_ok());
    kernels::AdamWConfig cq;
    cq.lr = double(1e-2f * 0.25f), cq.step = step, cq.weight_decay = 0.0, cq.beta1 = 0.8, cq.beta2 = 0.99;
    cq.eps = 1e-6;
    ASSERT_TRUE(kernels::adamw_step(qv, g0.span<float>(), qm, qvv, 11, cq).is_ok());
  }
  const Tensor got_p = std::move((*session)->get_parameter("p")).value();
  const Tensor got_q = std::move((*session)->get_parameter("q")).value();
  for (int i = 0; i < 11; ++i) {
    EXPECT_FLOAT_EQ(got_p.span<float>()[i], pv[size_t(i)]) << i;
    EXPECT_FLOAT_EQ(got_q.span<float>()[i], qv[size_t(i)]) << i;
  }
  Graph g2;
  Builder b2(g2);
  ValueId p2 = b2.parameter("p", DType::f32, {4});
  OptimizerOptions twice;
  ParamGroup only_p;
  only_p.params = {"p"};
  twice.groups = {only_p, only_p};
  auto r = append_optimizer(b2, std::vector<ValueId>{p2}, std::vector<ValueId>{b2.input("g", DType::f32, {4})},
                            twice);
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().subject(), "append_adamw: parameter 'p'") << r.status().to_string();
  EXPECT_EQ(r.status().found(), "in groups 1 and 2");
}

TEST(AdamW, BadArgumentsNameThemselves) {
  Graph g;
  Builder b(g);
  ValueId p = b.parameter("p", DType::f32, {4});
  ValueId wrong = b.input("g", DType::f32, {5});
  auto r = append_adamw(b, std::vector<ValueId>{p}, std::vector<ValueId>{wrong}, {});
  ASSERT_FALSE(r.is_ok());
  EXPECT_EQ(r.status().subject(), "append_adamw: gradient of 'p'");
  EXPECT_EQ(r.status().expected(), "f32[4]");
  EXPECT_EQ(r.status().found(), "f32[5]");

  Graph g2;
  Builder b2(g2);
  ValueId p2 = b2.parameter("p", DType::f32, {4});
  ValueId g2v = b2.input("g", DType::f32, {4});
  auto r2 = append_adamw(b2, std::vector<ValueId>{p2}, std::vector<ValueId>{g2v}, {.beta1 = 1.5});
  ASSERT_FALSE(r2.is_ok());
  EXPECT_NE(r2.status().to_string().find("beta1"), std::string::npos) << r2.status().to_string();
  EXPECT_NE(r2.status().to_string().find("in [0, 1)"), std::string::npos) << r2.status().to_string();
}

TEST(Updates, VerifierAndBuilderRejectBadUpdates) {
  Graph g;
  Builder b(g);
  ValueId p = b.parameter("p", DType::f32, {4});
  ValueId x = b.input("x", DType::f32, {4});
  ValueId y = b.input("y", DType::f32, {3});
  b.update(x, p);
  EXPECT_EQ(b.status().expected(), "a parameter");
  Graph g2;
  Builder b2(g2);
  p = b2.parameter("p", DType::f32, {4});
  y = b2.input("y", DType::f32, {3});
  b2.update(p, y);
  EXPECT_EQ(b2.status().subject(), "update of parameter 'p'");
  EXPECT_EQ(b2.status().expected(), "f32[4]");
  EXPECT_EQ(b2.status().found(), "f32[3]");
  Graph g3;
  Builder b3(g3);
  p = b3.parameter("p", DType::f32, {4});
  x = b3.input("x", DType::f32, {4});
  b3.update(p, x);
  b3.update(p, x);
  EXPECT_EQ(b3.status().found(), "a second one");
  // A graph read from elsewhere naming a missing parameter.
  Graph g4;
  Builder b4(g4);
  x = b4.input("x", DType::f32, {4});
  g4.add_update("nope", x);
  auto s = graph::verify(g4);
  EXPECT_EQ(s.subject(), "update 'nope'");
}

// Replicas of a program that updates a shared parameter would race: run()
// refuses it on all replicas at once (one replica at a time is fine).
TEST(Updates, ReplicasOfASharedUpdateAreRefused) {
  Graph g;
  Builder b(g);
  ValueId p = b.parameter("p", DType::f32, {4});
  ValueId x = b.input("x", DType::f32, {4});
  b.update(p, b.add(p, x));
  auto exe = compiler::compile(g);
  ASSERT_TRUE(exe.is_ok());
  auto s = runtime::Session::create(std::move(exe).value(), {.threads = 1, .replicas = 2});
  ASSERT_TRUE(s.is_ok()) << s.status().to_string();
  Tensor both(DType::f32, {2, 4}), one(DType::f32, {4});
  auto r = (*s)->run({{"x", &both}});
  ASSERT_FALSE(r.is_ok());
  EXPECT_NE(r.status().to_string().find("updates shared parameter 'p'"), std::string::npos) << r.status().to_string();
  EXPECT_TRUE((*s)->run_replica(1, {{"x", &one}}, 0).is_ok());
}

TEST(Updates, SwappingParametersIsRefusedNotSilentlyWrong) {
  Graph g;
  Builder b(g);
  ValueId p = b.parameter("p", DType::f32, {4});
  ValueId q = b.parameter("q", DType::f32, {4});
  b.update(p, q);
  b.update(q, p);
  auto exe = compiler::compile(g);
  ASSERT_FALSE(exe.is_ok());
  EXPECT_EQ(exe.status().code(), Code::kUnimplemented) << exe.status().to_string();
}

}  // namespace
}  // namespace aspen::train
