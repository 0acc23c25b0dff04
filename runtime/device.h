// runtime/device.h: a CPU device: its own thread team and its arena.
//
// Everything a device computes runs on its team (core/thread_team.h), so its
// kernels use exactly its threads; its transient values live at the memory
// plan's offsets in its one arena, allocated once when a program is loaded.
//
// Thread-safety: submit work through team(); the arena belongs to whatever
// runs on the team.
#pragma once

#include <memory>
#include <string>

#include "core/status.h"
#include "core/thread_team.h"

namespace aspen::runtime {

class CpuDevice {
 public:
  // threads = 0: every core the process budget still has free.
  static Result<std::unique_ptr<CpuDevice>> create(std::string name, int threads = 0);
  ~CpuDevice();

  const std::string& name() const { return team_->name(); }
  ThreadTeam& team() { return *team_; }
  // (Re)sizes the arena; contents are not preserved.
  Status reserve_arena(int64_t bytes);
  uint8_t* arena() { return arena_; }
  int64_t arena_bytes() const { return arena_bytes_; }

 private:
  explicit CpuDevice(std::unique_ptr<ThreadTeam> team) : team_(std::move(team)) {}
  std::unique_ptr<ThreadTeam> team_;
  uint8_t* arena_ = nullptr;
  int64_t arena_bytes_ = 0;
};

}  // namespace aspen::runtime
