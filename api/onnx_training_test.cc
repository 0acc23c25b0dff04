// api/onnx_training_test.cc: training imported graphs. 10 AdamW steps of models as PyTorch exports them
// (models/testdata/onnx/<case>, with a loss added by models::add_onnx_loss) equal PyTorch's own 10 steps
// on the same batches from the same weights (models/testdata/onnx_train/<case>, written by
// scripts/golden/make_onnx_golden.py): each step's loss within 1e-4 relative.
#include <gtest/gtest.h>

#include <cmath>
#include <cstdlib>
#include <cstring>
#include <fstream>

#include "api/training_model.h"
#include "io/onnx.h"
#include "models/onnx_import.h"

namespace aspen::api {
namespace {

const std::string kData = ASPEN_MODELS_TESTDATA;

Result<Tensor> read_tensor(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(io::OnnxTensor t, io::read_onnx_tensor(path));
  return models::tensor_from_onnx(t, path);
}

// Batch k of a stack [steps, ...] as its own tensor.
Tensor slice(const Tensor& all, int64_t k) {
  std::vector<int64_t> d(all.shape().begin() + 1, all.shape().end());
  Tensor t(all.dtype(), *Shape::make(d.data(), int(d.size())));
  std::memcpy(t.raw(), static_cast<const char*>(all.raw()) + size_t(k) * t.nbytes(), t.nbytes());
  return t;
}

void expect_torch_parity(const std::string& name, models::OnnxLoss loss) {
  auto file = io::read_onnx_model(kData + "/onnx/" + name + "/model.onnx");
  ASSERT_TRUE(file.is_ok()) << file.status().to_string();
  models::OnnxImportOptions io;
  for (const auto& v : file->graph.inputs)
    for (const auto& d : v.dims)
      if (d.value < 0) io.dims[d.param] = 2;  // the batch of the golden's batches
  auto imp = models::import_onnx(*file, io);
  ASSERT_TRUE(imp.is_ok()) << imp.status().to_string();
  loss.output = imp->outputs.at(0);
  ASSERT_TRUE(models::add_onnx_loss(*imp, loss).is_ok());
  TrainingOptions t;
  t.optimizer.kind = train::OptimizerKind::adamw;
  t.optimizer.beta1 = 0.9;
  t.optimizer.beta2 = 0.999;
  t.optimizer.eps = 1e-8;
  t.optimizer.weight_decay = 0.01;
  t.schedule.lr = 1e-2;
  Options o;
  o.threads(2);
  auto m = TrainingModel::create(imp->graph, o, t);
  ASSERT_TRUE(m.is_ok()) << m.status().to_string();
  ASSERT_TRUE((*m)->copy_weights_to_device(imp->weight_pointers()).is_ok());
  const std::string dir = kData + "/onnx_train/" + name;
  auto inputs = read_tensor(dir + "/inputs.pb"), targets = read_tensor(dir + "/targets.pb");
  ASSERT_TRUE(inputs.is_ok() && targets.is_ok());
  std::ifstream lf(dir + "/losses.txt");
  std::vector<double> want;
  for (double v; lf >> v;) want.push_back(v);
  ASSERT_EQ(want.size(), 10u);
  for (int64_t k = 0; k < 10; ++k) {
    Tensor x = slice(*inputs, k), y = slice(*targets, k);
    auto out = (*m)->run({{imp->inputs.at(0), &x}, {loss.targets, &y}});
    ASSERT_TRUE(out.is_ok()) << out.status().to_string();
    EXPECT_NEAR(out->at("loss").data<float>()[0], want[size_t(k)], 1e-4 * std::fabs(want[size_t(k)]))
        << "step " << k + 1;
  }
}

TEST(OnnxTraining, ExportedBlockMatchesPyTorch) {
  expect_torch_parity("block_dynamo", {.kind = models::OnnxLoss::Kind::mse});
}

TEST(OnnxTraining, ExportedGpt2MatchesPyTorch) {
  expect_torch_parity("gpt2_unoptimized", {.kind = models::OnnxLoss::Kind::cross_entropy});
}

}  // namespace
}  // namespace aspen::api
