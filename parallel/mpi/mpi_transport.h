// parallel/mpi/mpi_transport.h: parallel::Transport between processes (a
// model's pipeline stages across processes): tagged, buffered messages of an
// MpiCommunicator (its post/take/flush), the endpoint being the rank in that
// communicator (the replica's "pipe" group, whose rank is the stage).
//
// A message's tag is (edge · (micros + 1) + micro) · 2 + grad: micro-batches
// 0 .. micros - 1 are training's and micro-batch `micros` evaluation's.
// check_tags() refuses, before any message, a layout whose largest tag would
// pass MPI_TAG_UB.
//
// Thread-safety: as the communicator's post/take (one thread per process here).
#pragma once

#include <cstdint>

#include "parallel/mpi/mpi_communicator.h"
#include "parallel/transport.h"

namespace aspen::parallel {

class MpiTransport final : public Transport {
 public:
  MpiTransport(MpiCommunicator& comm, int micros) : comm_(comm), micros_(micros) {}

  static int64_t tag(const MessageKey& key, int64_t micros) {
    return (int64_t(key.edge) * (micros + 1) + key.micro) * 2 + int64_t(key.grad);
  }
  // Unimplemented naming the counts when `edges` edges of `micros` micro-batches (and evaluation's) need tags
  // past the communicator's MPI_TAG_UB.
  static Status check_tags(const MpiCommunicator& comm, int64_t edges, int64_t micros);

  Status put(const MessageKey& key, int to, Tensor t) override;
  Result<Tensor> take(const MessageKey& key, int from, DType dtype, const Shape& shape,
                      const std::string& who) override;
  void fail(const std::string& why) override { comm_.abort(why); }
  Status flush() override { return comm_.flush(); }

 private:
  MpiCommunicator& comm_;
  int micros_;
};

}  // namespace aspen::parallel
