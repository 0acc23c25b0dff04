#include "parallel/communicator.h"

namespace aspen::parallel {

const char* reduce_op_name(ReduceOp op) { return op == ReduceOp::sum ? "sum" : "mean"; }

const char* collective_name(Collective c) {
  switch (c) {
    case Collective::all_reduce: return "all_reduce";
    case Collective::reduce_scatter: return "reduce_scatter";
    case Collective::all_gather: return "all_gather";
    case Collective::broadcast: return "broadcast";
    case Collective::send: return "send";
    case Collective::recv: return "recv";
    case Collective::reduce: return "reduce";
  }
  return "?";
}

const char* algorithm_name(Algorithm a) {
  switch (a) {
    case Algorithm::automatic: return "automatic";
    case Algorithm::direct: return "direct";
    case Algorithm::chunked: return "chunked";
    case Algorithm::tree: return "tree";
  }
  return "?";
}

Status Communicator::check(Collective c, int64_t count, DType dtype, int peer) const {
  const std::string subject = std::string(collective_name(c)) + " (" + std::string(backend()) + ", rank " +
                              std::to_string(rank()) + " of " + std::to_string(size()) + ")";
  if (dtype != DType::f32 && dtype != DType::bf16)
    return Status::invalid_argument(subject, "dtype f32 or bf16", std::string(dtype_name(dtype)));
  if (count < 0) return Status::invalid_argument(subject, "an element count >= 0", std::to_string(count));
  if (c == Collective::broadcast && (peer < 0 || peer >= size()))
    return Status::invalid_argument(subject, "root in [0, " + std::to_string(size()) + ")", std::to_string(peer));
  if (c == Collective::send || c == Collective::recv) {
    if (peer < 0 || peer >= size())
      return Status::invalid_argument(subject, "peer in [0, " + std::to_string(size()) + ")", std::to_string(peer));
    if (peer == rank()) return Status::invalid_argument(subject, "a peer other than this rank", std::to_string(peer));
  }
  return Status();
}

Status Communicator::all_reduce(void* data, int64_t count, DType dtype, ReduceOp op) {
  ASPEN_RETURN_IF_ERROR(check(Collective::all_reduce, count, dtype, 0));
  return do_all_reduce(data, count, dtype, op);
}
Status Communicator::reduce_scatter(const void* send_buf, void* recv_buf, int64_t recv_count, DType dtype,
                                    ReduceOp op) {
  ASPEN_RETURN_IF_ERROR(check(Collective::reduce_scatter, recv_count, dtype, 0));
  return do_reduce_scatter(send_buf, recv_buf, recv_count, dtype, op);
}
Status Communicator::all_gather(const void* send_buf, void* recv_buf, int64_t send_count, DType dtype) {
  ASPEN_RETURN_IF_ERROR(check(Collective::all_gather, send_count, dtype, 0));
  return do_all_gather(send_buf, recv_buf, send_count, dtype);
}
Status Communicator::broadcast(void* data, int64_t count, DType dtype, int root) {
  ASPEN_RETURN_IF_ERROR(check(Collective::broadcast, count, dtype, root));
  return do_broadcast(data, count, dtype, root);
}
Status Communicator::send(const void* data, int64_t count, DType dtype, int peer) {
  ASPEN_RETURN_IF_ERROR(check(Collective::send, count, dtype, peer));
  return do_send(data, count, dtype, peer);
}
Status Communicator::recv(void* data, int64_t count, DType dtype, int peer) {
  ASPEN_RETURN_IF_ERROR(check(Collective::recv, count, dtype, peer));
  return do_recv(data, count, dtype, peer);
}

}  // namespace aspen::parallel
