// train/arrays_test.cc: array datasets (.npz, a directory of .npy files) and their loader.
#include "train/arrays.h"

#include <gtest/gtest.h>

#include <set>

#include "io/npy.h"
#include "io/npz.h"
#include "io/test_files.h"

namespace aspen::train {
namespace {

using io::test_files::TempDir;

// Example i of column "x" is [i, i + 0.5] and of column "y" is 10·i: every batch says which examples it holds.
Columns counting(int64_t n) {
  Columns c;
  c.emplace("x", Tensor(DType::f32, Shape{n, 2}));
  c.emplace("y", Tensor(DType::i64, Shape{n}));
  for (int64_t i = 0; i < n; ++i) {
    c.at("x").data<float>()[2 * i] = float(i);
    c.at("x").data<float>()[2 * i + 1] = float(i) + 0.5f;
    c.at("y").data<int64_t>()[i] = 10 * i;
  }
  return c;
}

std::vector<int64_t> examples_of(const Columns& b) {
  const Tensor& x = b.at("x");
  const Tensor& y = b.at("y");
  std::vector<int64_t> out;
  for (int64_t r = 0; r < x.shape()[0]; ++r) {
    const int64_t i = int64_t(x.data<float>()[2 * r]);
    EXPECT_EQ(x.data<float>()[2 * r + 1], float(i) + 0.5f);
    EXPECT_EQ(y.data<int64_t>()[r], 10 * i) << "the columns of one example stay together";
    out.push_back(i);
  }
  return out;
}

TEST(ArrayDataset, OpensAnNpzAndADirectoryOfNpyFiles) {
  TempDir t;
  ASSERT_TRUE(io::write_npz(t / "d.npz", counting(7)).is_ok());
  ASSERT_TRUE(io::write_npy(t / "x.npy", counting(7).at("x")).is_ok());
  ASSERT_TRUE(io::write_npy(t / "y.npy", counting(7).at("y")).is_ok());
  for (const std::string& path : {t / "d.npz", t.path()}) {
    SCOPED_TRACE(path);
    auto d = ArrayDataset::open(path);
    ASSERT_TRUE(d.is_ok()) << d.status().to_string();
    EXPECT_EQ((*d)->examples(), 7);
    EXPECT_EQ((*d)->describe(), "x: f32 [7, 2], y: i64 [7]");
    EXPECT_EQ(examples_of((*d)->gather({6, 0, 3})), (std::vector<int64_t>{6, 0, 3}));
  }
}

TEST(ArrayDataset, RefusesColumnsThatDisagree) {
  Columns c = counting(5);
  c.emplace("z", Tensor(DType::f32, Shape{4, 3}));
  auto d = ArrayDataset::make(std::move(c), "d.npz");
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().message(),
            "d.npz: column 'z': expected 5 examples on axis 0, as column 'x' has, found 4 (shape [4, 3])");
  Columns s = counting(5);
  s.emplace("a", Tensor(DType::f32, Shape{}));
  d = ArrayDataset::make(std::move(s), "d.npz");
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().to_string().find("column 'a': expected an array of rank >= 1"), std::string::npos);
  d = ArrayDataset::open(TempDir() / "missing.npz");
  ASSERT_FALSE(d.is_ok());
  EXPECT_EQ(d.status().code(), Code::kNotFound);
  TempDir empty;
  d = ArrayDataset::open(empty.path());
  ASSERT_FALSE(d.is_ok());
  EXPECT_NE(d.status().to_string().find("expected arrays (.npz members or .npy files), one per column, found none"),
            std::string::npos);
}

TEST(ArrayLoader, EpochsArePermutationsAndReplicasSplitEachGlobalBatch) {
  auto d = *ArrayDataset::make(counting(23), "d");
  const DataLoaderOptions o{.micro_batch = 2, .accumulation = 2, .replicas = 2, .val_fraction = 0.1, .seed = 5};
  std::vector<ArrayLoader> loaders;
  for (int64_t r = 0; r < 2; ++r) {
    DataLoaderOptions ro = o;
    ro.replica = r;
    auto l = ArrayLoader::open(d, ro);
    ASSERT_TRUE(l.is_ok()) << l.status().to_string();
    loaders.push_back(std::move(*l));
  }
  // 23 examples: 2 for validation (the tail, no gap), 21 for training: 2 global batches of 8 per epoch.
  EXPECT_EQ(loaders[0].order().train_examples(), 21);
  EXPECT_EQ(loaders[0].order().steps_per_epoch(), 4);
  for (int epoch = 0; epoch < 2; ++epoch) {
    std::set<int64_t> seen;
    for (int step = 0; step < 4; ++step)
      for (auto& l : loaders)
        for (int64_t e : examples_of(l.next())) {
          EXPECT_LT(e, 21) << "a validation example in training";
          EXPECT_TRUE(seen.insert(e).second) << "example " << e << " twice in epoch " << epoch;
        }
    EXPECT_EQ(seen.size(), 16u);
  }
  EXPECT_EQ(loaders[0].val_steps(), 0);  // 2 validation examples < one batch of micro x replicas
  DataLoaderOptions v = o;
  v.replicas = 1;
  v.accumulation = 1;
  auto val = *ArrayLoader::open(d, v);
  ASSERT_EQ(val.val_steps(), 1);
  EXPECT_EQ(examples_of(*val.val_batch(0)), (std::vector<int64_t>{21, 22}));
  EXPECT_FALSE(val.val_batch(1).is_ok());
}

TEST(ArrayLoader, ResumeContinuesExactly) {
  auto d = *ArrayDataset::make(counting(10), "d");
  const DataLoaderOptions o{.micro_batch = 3, .seed = 9};
  auto a = *ArrayLoader::open(d, o);
  std::vector<std::vector<int64_t>> want;
  for (int i = 0; i < 7; ++i) want.push_back(examples_of(a.next()));
  auto b = *ArrayLoader::open(d, o);
  for (int i = 0; i < 4; ++i) b.next();
  const Position p = b.position();
  auto c = *ArrayLoader::open(d, o);
  ASSERT_TRUE(c.restore(p).is_ok());
  for (int i = 4; i < 7; ++i) EXPECT_EQ(examples_of(c.next()), want[size_t(i)]) << "batch " << i;
}

TEST(ArrayLoader, TooFewExamplesNamesBothCounts) {
  auto d = *ArrayDataset::make(counting(5), "data.npz");
  auto l = ArrayLoader::open(d, {.micro_batch = 4, .replicas = 2});
  ASSERT_FALSE(l.is_ok());
  EXPECT_EQ(l.status().message(),
            "data.npz: training examples: expected at least one global batch (8 = micro 4 x accumulation 1 x "
            "replicas 2), found 5 (5 examples, val_fraction 0.000000)");
}

}  // namespace
}  // namespace aspen::train
