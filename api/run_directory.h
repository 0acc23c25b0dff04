// api/run_directory.h: a training run's directories, claimed before step 1 (W1 "nothing the user had is
// lost"): the run directory's lock, the checkpoint directory's when it lies outside, the refusal of an
// earlier run's files unless resuming or overwriting, and both directories writable.
#pragma once

#include <memory>
#include <string>

#include "core/file.h"
#include "core/status.h"

namespace aspen::api {

// Takes the lock of a run directory (creating it): FailedPrecondition naming
// the directory and the pid of the job that holds it.
Result<std::shared_ptr<DirectoryLock>> lock_run_directory(const std::string& dir);

struct ClaimedDirectories {
  std::shared_ptr<DirectoryLock> run_lock, checkpoint_lock;  // checkpoint_lock: null inside the run directory
  std::string earlier_run;  // with overwrite: what of an earlier run they hold, to delete once the run starts
};

// `run_lock`: the run directory's lock when the caller holds it already (aspen train takes it first), else
// null. Refuses an earlier run's files unless `resuming` or `overwrite`, naming them and the way out.
Result<ClaimedDirectories> claim_run_directories(const std::string& run_dir, const std::string& checkpoint_dir,
                                                 std::shared_ptr<DirectoryLock> run_lock, bool resuming,
                                                 bool overwrite);

// Deletes what a run wrote there (never other files a user keeps beside it).
Status remove_earlier_run(const std::string& run_dir, const std::string& checkpoint_dir);

}  // namespace aspen::api
