#include "parallel/transport.h"

namespace aspen::parallel {

Status ThreadsTransport::put(const MessageKey& key, int /*to*/, Tensor t) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    box_[key] = std::move(t);
  }
  cv_.notify_all();
  return Status();
}

Result<Tensor> ThreadsTransport::take(const MessageKey& key, int /*from*/, DType dtype, const Shape& shape,
                                      const std::string& who) {
  std::unique_lock<std::mutex> lock(mu_);
  const bool ready = cv_.wait_for(lock, timeout_, [&] { return failed_ || box_.count(key) > 0; });
  if (failed_)
    return Status::error(Code::kAborted, who, "a working pipeline", "another stage failed: " + why_,
                         "the first error (on another stage) is the cause");
  if (!ready) {
    failed_ = true;
    why_ = who + " waited longer than " + std::to_string(timeout_.count()) + " ms";
    cv_.notify_all();
    return Status::error(Code::kDeadlineExceeded, who, "the tensor within " + std::to_string(timeout_.count()) + " ms",
                         "nothing", "a stage stopped or hangs");
  }
  auto it = box_.find(key);
  Tensor t = std::move(it->second);
  box_.erase(it);
  if (t.dtype() != dtype || t.shape() != shape)
    return Status::error(Code::kInternal, who, std::string(dtype_name(dtype)) + shape.to_string(),
                         std::string(dtype_name(t.dtype())) + t.shape().to_string());
  return t;
}

void ThreadsTransport::fail(const std::string& why) {
  {
    std::lock_guard<std::mutex> lock(mu_);
    if (!failed_) {
      failed_ = true;
      why_ = why;
    }
  }
  cv_.notify_all();
}

size_t ThreadsTransport::pending() const {
  std::lock_guard<std::mutex> lock(mu_);
  return box_.size();
}

}  // namespace aspen::parallel
