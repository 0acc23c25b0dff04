// parallel/transport.h: tensors sent between the devices of one training
// step (a pipeline edge's activation or its gradient, by micro-batch), the
// point-to-point half of a plan (train/plan.h).
//
// A message is named by its key (edge, micro-batch, gradient or not) and
// travels from one endpoint to another (a pipeline stage's index). put()
// never waits: the transport holds what a schedule has in flight (at most
// `stages` micro-batches per edge with 1F1B). take() waits for its message,
// for the transport's failure or for the timeout, and its error names `who`
// (the device and instruction that waits). fail() wakes every take with the
// first failure's reason. flush(), after a step: every put has been taken
// (or handed to the network).
//
// Backends: ThreadsTransport (devices of one process: an in-memory box, also
// the stub tests of a runner use) and MpiTransport (stages in different
// processes: tagged MPI messages, parallel/mpi/mpi_transport.h).
//
// Thread-safety: put, take and fail may be called from any thread at once.
#pragma once

#include <chrono>
#include <condition_variable>
#include <map>
#include <mutex>
#include <string>
#include <tuple>

#include "core/status.h"
#include "core/tensor.h"

namespace aspen::parallel {

struct MessageKey {
  int edge = 0;
  int micro = 0;
  bool grad = false;
  auto operator<=>(const MessageKey&) const = default;
};

class Transport {
 public:
  virtual ~Transport() = default;
  virtual Status put(const MessageKey& key, int to, Tensor t) = 0;
  // A tensor of `dtype` and `shape` from endpoint `from`.
  virtual Result<Tensor> take(const MessageKey& key, int from, DType dtype, const Shape& shape,
                              const std::string& who) = 0;
  virtual void fail(const std::string& why) = 0;
  virtual Status flush() { return Status(); }
};

// The endpoints of one process: a box under a mutex. A take that waits
// longer than `timeout` fails the transport (DeadlineExceeded naming who).
class ThreadsTransport final : public Transport {
 public:
  explicit ThreadsTransport(std::chrono::milliseconds timeout) : timeout_(timeout) {}
  Status put(const MessageKey& key, int to, Tensor t) override;
  Result<Tensor> take(const MessageKey& key, int from, DType dtype, const Shape& shape,
                      const std::string& who) override;
  void fail(const std::string& why) override;
  // Puts not yet taken (a schedule that sends what nobody receives leaves some).
  size_t pending() const;

 private:
  std::chrono::milliseconds timeout_;
  mutable std::mutex mu_;
  std::condition_variable cv_;
  std::map<MessageKey, Tensor> box_;
  bool failed_ = false;
  std::string why_;
};

}  // namespace aspen::parallel
