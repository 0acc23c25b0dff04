// train/arrays.h: arrays as training data, for a user's own model (an imported ONNX graph): named
// columns with the examples along their first axis, cut into micro-batches the way token shards are.
//
//   ASPEN_ASSIGN_OR_RETURN(auto data, train::ArrayDataset::open("train.npz"));
//   ASPEN_ASSIGN_OR_RETURN(auto loader, train::ArrayLoader::open(data, {.micro_batch = 8, .seed = 1}));
//   ASPEN_ASSIGN_OR_RETURN(auto batch, loader.next());  // {"x": [8, ...], "y": [8, ...]}
//
// A dataset is an .npz file (numpy.savez or savez_compressed: each array a column, by its key) or a
// directory of .npy files (each file a column, by its name without ".npy"). Every column has rank >= 1
// and the same extent on axis 0: the examples. The dataset is read into memory once and shared by the
// loaders of every replica.
//
// ArrayLoader cuts the examples by train::ExampleOrder (train/data.h): the last val_fraction of them held
// out for validation (no gap: array examples do not overlap), each epoch shuffled by Philox(seed), each
// replica its slice of every global batch, the position resumable. DataLoaderOptions::seq is not used.
//
// Thread-safety: an ArrayDataset is immutable after open(); an ArrayLoader one thread at a time.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "core/status.h"
#include "core/tensor.h"
#include "train/data.h"

namespace aspen::train {

using Columns = std::map<std::string, Tensor>;

class ArrayDataset {
 public:
  // NotFound naming the path; Corrupt / Unimplemented from the readers (io/npz.h, io/npy.h);
  // InvalidArgument naming the column whose rank or example count differs, or an empty dataset.
  static Result<std::shared_ptr<const ArrayDataset>> open(const std::string& path);
  // The columns of a dataset already in memory (tests, the Python package); `path` names it in errors.
  static Result<std::shared_ptr<const ArrayDataset>> make(Columns columns, const std::string& path);

  const std::string& path() const { return path_; }
  const Columns& columns() const { return columns_; }
  int64_t examples() const { return examples_; }
  // "x: f32 [100, 3], y: i64 [100]": what the dataset holds, for messages and for agreeing under MPI.
  std::string describe() const;

  // The given examples of every column, stacked on a new axis 0 of extent examples.size().
  Columns gather(const std::vector<int64_t>& examples) const;

 private:
  std::string path_;
  Columns columns_;
  int64_t examples_ = 0;
};

class ArrayLoader {
 public:
  // InvalidArgument naming the option, or the dataset when its training split is smaller than one global
  // batch.
  static Result<ArrayLoader> open(std::shared_ptr<const ArrayDataset> data, const DataLoaderOptions& options);

  const ArrayDataset& dataset() const { return *data_; }
  const ExampleOrder& order() const { return order_; }

  // This replica's next training micro-batch.
  Columns next() { return data_->gather(order_.next()); }
  Position position() const { return order_.position(); }
  Status restore(const Position& p) { return order_.restore(p); }
  int64_t val_steps() const { return order_.val_steps(); }
  Result<Columns> val_batch(int64_t i) const;

 private:
  std::shared_ptr<const ArrayDataset> data_;
  ExampleOrder order_;
};

}  // namespace aspen::train
