#include "parallel/mpi/mpi_transport.h"

namespace aspen::parallel {

Status MpiTransport::check_tags(const MpiCommunicator& comm, int64_t edges, int64_t micros) {
  const int64_t top = tag({.edge = int(edges - 1), .micro = int(micros), .grad = true}, micros);
  if (top > comm.max_tag())
    return Status::error(Code::kUnimplemented,
                         "pipeline across processes: " + std::to_string(edges) + " edges x " + std::to_string(micros) +
                             " micro-batches",
                         "message tags up to MPI_TAG_UB " + std::to_string(comm.max_tag()), "tag " + std::to_string(top));
  return Status();
}

Status MpiTransport::put(const MessageKey& key, int to, Tensor t) {
  return comm_.post(t.raw(), int64_t(t.nbytes()), to, int(tag(key, micros_)));
}

Result<Tensor> MpiTransport::take(const MessageKey& key, int from, DType dtype, const Shape& shape,
                                  const std::string& who) {
  Tensor t(dtype, shape);
  Status s = comm_.take(t.raw(), int64_t(t.nbytes()), from, int(tag(key, micros_)));
  if (!s.is_ok()) return Status(s).with_context(who);
  return t;
}

}  // namespace aspen::parallel
