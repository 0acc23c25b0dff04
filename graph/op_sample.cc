#include "graph/op_sample.h"

#include "core/check.h"
#include "graph/builder.h"

namespace aspen::graph {

Shape sample_shape(const std::vector<int64_t>& dims) {
  Result<Shape> s = Shape::make(dims.data(), int(dims.size()));
  ASPEN_CHECK(s.is_ok()) << s.status().to_string();
  return *s;
}

OpSample& SampleList::add(std::string label, const std::function<void(Builder&)>& build, SampleFeeds feeds) {
  OpSample& s = out_.emplace_back();
  s.label = std::move(label);
  s.feeds = std::move(feeds);
  Builder b(s.graph);
  build(b);
  s.built = b.status();
  return s;
}

}  // namespace aspen::graph
