// graph/ops_state.cc: ops that write into state (a KV cache, a generation's
// token history and key mask) at positions known only at run time.
//
//   write_slice(dst, src, index) {axis}: dst with dst[..., index:index+T, ...]
//       on `axis` replaced by src; src has dst's dtype and rank, T on the axis
//       and dst's extents elsewhere; index i32[] is a run-time value.
//       index < 0 or index + T > S (dst's extent) is a run-time Status.
// Meant for Builder::update(dst, write_slice(dst, ...)): the memory plan then
// writes only the slice, into the state's own storage. Not differentiated
// (state ops of inference).
#include <cstring>

#include "graph/builder.h"
#include "graph/op_sample.h"
#include "graph/ops_nn_util.h"
#include "graph/ops_registry.h"

namespace aspen::graph {

namespace {
using namespace nnutil;

struct SliceGeometry {
  int64_t outer = 1;  // product of dst's extents before the axis
  int64_t S = 0, T = 0;
  int64_t inner = 1;  // product of extents after the axis
};

Result<SliceGeometry> geometry(const Node& n, const TensorType& dst, const TensorType& src) {
  const int rank = dst.shape.rank();
  ASPEN_ASSIGN_OR_RETURN(const int axis, axis_of(n, "axis", n.attrs.i("axis"), rank));
  SliceGeometry g;
  for (int d = 0; d < rank; ++d) {
    if (d < axis) g.outer *= dst.shape[d];
    if (d > axis) g.inner *= dst.shape[d];
  }
  g.S = dst.shape[axis];
  g.T = src.shape[axis];
  return g;
}

Status infer_write_slice(const Node& n, std::span<const TensorType> in, std::vector<TensorType>& out) {
  const TensorType &dst = in[0], &src = in[1], &index = in[2];
  ASPEN_RETURN_IF_ERROR(expect_rank(n, "dst", dst, 1));
  if (src.dtype != dst.dtype || src.shape.rank() != dst.shape.rank())
    return rule_error(n, "src", std::string(dtype_name(dst.dtype)) + " of rank " + str(dst.shape.rank()) + " (dst's)",
                      src.to_string());
  ASPEN_ASSIGN_OR_RETURN(const int axis, axis_of(n, "axis", n.attrs.i("axis"), dst.shape.rank()));
  for (int d = 0; d < dst.shape.rank(); ++d) {
    if (d == axis ? src.shape[d] > dst.shape[d] : src.shape[d] != dst.shape[d])
      return rule_error(n, "src", "dst's extents off the axis and at most " + str(dst.shape[axis]) + " on it",
                        src.to_string());
  }
  if (index != TensorType{DType::i32, Shape{}}) return rule_error(n, "index", "i32[] (a scalar)", index.to_string());
  out = {dst};
  return Status();
}

Status check_index(int64_t index, const SliceGeometry& g) {
  if (index < 0 || index + g.T > g.S)
    return Status::invalid_argument("write_slice: index", "in [0, " + std::to_string(g.S - g.T) + "]",
                                    std::to_string(index));
  return Status();
}

Status eval_write_slice(const Node& n, std::span<const HostArray* const> in, std::span<HostArray> out) {
  ASPEN_ASSIGN_OR_RETURN(const SliceGeometry g, geometry(n, in[0]->type, in[1]->type));
  const int64_t index = int64_t(in[2]->data[0]);
  ASPEN_RETURN_IF_ERROR(check_index(index, g));
  out[0].data = in[0]->data;
  for (int64_t o = 0; o < g.outer; ++o)
    std::copy_n(in[1]->data.data() + o * g.T * g.inner, g.T * g.inner,
                out[0].data.data() + (o * g.S + index) * g.inner);
  return Status();
}

Prepared prepare_write_slice(const Node& n, Types in, Types out) {
  ASPEN_ASSIGN_OR_RETURN(SliceGeometry g, geometry(n, in[0], in[1]));
  const int64_t elem = int64_t(dtype_size(in[0].dtype));
  g.inner *= elem;  // in bytes from here on
  const int64_t total = out[0].bytes();
  return make_kernel([g, total](In i, Out o) -> Status {
    const int64_t index = *static_cast<const int32_t*>(i[2]);
    ASPEN_RETURN_IF_ERROR(check_index(index, g));
    char* y = static_cast<char*>(o[0]);
    const char* src = static_cast<const char*>(i[1]);
    if (o[0] != i[0] && total) std::memcpy(y, i[0], size_t(total));  // not planned in place
    for (int64_t k = 0; k < g.outer; ++k)
      std::memcpy(y + (k * g.S + index) * g.inner, src + k * g.T * g.inner, size_t(g.T * g.inner));
    return Status();
  });
}

// Samples for the kernel sweep (graph/op_sample.h): every axis, the first and the last position, any dtype
// (the kernel copies bytes). The in-place form and bad indices are tested in graph/ops_fast_test.cc.
void samples_write_slice(SampleList& s) {
  for (DType dt : {DType::f32, DType::bf16, DType::i32})
    for (int64_t axis : {0, 1, 2})
      for (int64_t at_end : {0, 1}) {
        const std::vector<int64_t> dst = {3, 7, 5};
        std::vector<int64_t> src = dst;
        src[size_t(axis)] = 2;
        const double index = at_end ? double(dst[size_t(axis)] - 2) : 0.0;
        s.add(std::string(dtype_name(dt)) + " axis " + std::to_string(axis) + " index " + std::to_string(int(index)),
              [&](Builder& b) {
                b.op(OpKind::write_slice,
                     {b.input("dst", dt, sample_shape(dst)), b.input("src", dt, sample_shape(src)),
                      b.input("index", DType::i32, Shape{})},
                     {{"axis", axis}});
              },
              {.int_hi = 100, .values = {{"index", {index}}}});
      }
}

}  // namespace

void register_state_ops(OpTable& t) {
  t.define(OpKind::write_slice, {.flags = kWritesInPlace,
                                 .min_inputs = 3,
                                 .max_inputs = 3,
                                 .attrs = {{"axis", AttrKind::i64, true}},
                                 .infer = infer_write_slice,
                                 .eval = eval_write_slice,
                                 .prepare = prepare_write_slice,
                                 .samples = samples_write_slice});
}

}  // namespace aspen::graph
