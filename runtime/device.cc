#include "runtime/device.h"

#include "core/tensor.h"

namespace aspen::runtime {

Result<std::unique_ptr<CpuDevice>> CpuDevice::create(std::string name, int threads) {
  if (threads < 0)
    return Status::invalid_argument("device '" + name + "': threads", ">= 0 (0: all free cores)", std::to_string(threads));
  if (threads == 0) threads = std::max(1, CoreBudget::global().available());
  ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<ThreadTeam> team, ThreadTeam::create(std::move(name), threads));
  return std::unique_ptr<CpuDevice>(new CpuDevice(std::move(team)));
}

CpuDevice::~CpuDevice() { aligned_free(arena_); }

Status CpuDevice::reserve_arena(int64_t bytes) {
  if (bytes <= arena_bytes_) return Status();
  void* p = aligned_alloc_zeroed(size_t(bytes));
  if (!p)
    return Status::error(Code::kFailedPrecondition, "device '" + name() + "' arena", std::to_string(bytes) + " bytes",
                         "the allocation refused");
  aligned_free(arena_);
  arena_ = static_cast<uint8_t*>(p);
  arena_bytes_ = bytes;
  return Status();
}

}  // namespace aspen::runtime
