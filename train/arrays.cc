#include "train/arrays.h"

#include <algorithm>
#include <cstring>
#include <filesystem>

#include "core/check.h"
#include "io/npy.h"
#include "io/npz.h"

namespace aspen::train {

namespace fs = std::filesystem;

Result<std::shared_ptr<const ArrayDataset>> ArrayDataset::open(const std::string& path) {
  std::error_code ec;
  const fs::file_status st = fs::status(path, ec);
  if (st.type() == fs::file_type::not_found)
    return Status::error(Code::kNotFound, path, "an .npz file or a directory of .npy files", "nothing there");
  if (ec) return Status::error(Code::kIoError, path, "an .npz file or a directory of .npy files", ec.message());
  Columns columns;
  if (fs::is_directory(st)) {
    std::vector<std::string> files;
    for (const fs::directory_entry& e : fs::directory_iterator(path, ec))
      if (e.path().extension() == ".npy") files.push_back(e.path().filename().string());
    if (ec) return Status::error(Code::kIoError, path, "a readable directory", ec.message());
    std::sort(files.begin(), files.end());
    for (const std::string& f : files) {
      ASPEN_ASSIGN_OR_RETURN(Tensor t, io::read_npy((fs::path(path) / f).string()));
      columns.emplace(f.substr(0, f.size() - 4), std::move(t));
    }
  } else {
    ASPEN_ASSIGN_OR_RETURN(columns, io::read_npz(path));
  }
  return make(std::move(columns), path);
}

Result<std::shared_ptr<const ArrayDataset>> ArrayDataset::make(Columns columns, const std::string& path) {
  auto d = std::make_shared<ArrayDataset>();
  d->path_ = path;
  if (columns.empty())
    return Status::invalid_argument(path, "arrays (.npz members or .npy files), one per column", "none");
  std::string first;
  for (const auto& [name, t] : columns) {
    if (t.shape().rank() < 1)
      return Status::invalid_argument(path + ": column '" + name + "'", "an array of rank >= 1 (examples on axis 0)",
                                      "a scalar");
    if (first.empty()) {
      first = name;
      d->examples_ = t.shape()[0];
    } else if (t.shape()[0] != d->examples_) {
      return Status::invalid_argument(
          path + ": column '" + name + "'",
          std::to_string(d->examples_) + " examples on axis 0, as column '" + first + "' has",
          std::to_string(t.shape()[0]) + " (shape " + t.shape().to_string() + ")");
    }
  }
  d->columns_ = std::move(columns);
  return std::shared_ptr<const ArrayDataset>(std::move(d));
}

std::string ArrayDataset::describe() const {
  std::string out;
  for (const auto& [name, t] : columns_)
    out += (out.empty() ? "" : ", ") + name + ": " + std::string(dtype_name(t.dtype())) + " " + t.shape().to_string();
  return out;
}

Columns ArrayDataset::gather(const std::vector<int64_t>& examples) const {
  Columns out;
  for (const auto& [name, t] : columns_) {
    std::vector<int64_t> dims(t.shape().begin(), t.shape().end());
    dims[0] = int64_t(examples.size());
    Tensor b(t.dtype(), *Shape::make(dims.data(), int(dims.size())));
    const size_t row = examples_ > 0 ? t.nbytes() / size_t(examples_) : 0;
    for (size_t i = 0; i < examples.size(); ++i) {
      ASPEN_CHECK(examples[i] >= 0 && examples[i] < examples_) << "example " << examples[i] << " of " << examples_;
      std::memcpy(static_cast<char*>(b.raw()) + i * row, static_cast<const char*>(t.raw()) + size_t(examples[i]) * row,
                  row);
    }
    out.emplace(name, std::move(b));
  }
  return out;
}

Result<ArrayLoader> ArrayLoader::open(std::shared_ptr<const ArrayDataset> data, const DataLoaderOptions& options) {
  ArrayLoader l;
  ASPEN_ASSIGN_OR_RETURN(l.order_, ExampleOrder::make(data->examples(), 0, options, data->path(),
                                                      std::to_string(data->examples()) + " examples"));
  l.data_ = std::move(data);
  return l;
}

Result<Columns> ArrayLoader::val_batch(int64_t i) const {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<int64_t> examples, order_.val_batch(i));
  return data_->gather(examples);
}

}  // namespace aspen::train
