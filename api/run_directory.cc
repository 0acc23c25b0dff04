#include "api/run_directory.h"

#include <algorithm>
#include <filesystem>
#include <vector>

#include "train/checkpoint.h"
#include "train/report.h"

namespace aspen::api {

namespace fs = std::filesystem;

Result<std::shared_ptr<DirectoryLock>> lock_run_directory(const std::string& dir) {
  ASPEN_ASSIGN_OR_RETURN(DirectoryLock lock, DirectoryLock::acquire(dir, "run directory"));
  return std::make_shared<DirectoryLock>(std::move(lock));
}

namespace {

// What of an earlier run `dir` holds ("" when nothing): a newcomer's rerun
// must not replace it silently.
std::string earlier_run(const std::string& run_dir, const std::string& checkpoint_dir) {
  std::vector<std::string> found;
  std::error_code ec;
  if (fs::exists(run_dir + "/" + train::kMetricsFile, ec)) found.push_back(train::kMetricsFile);
  if (fs::exists(run_dir + "/model", ec)) found.push_back("an exported model");
  if (auto steps = train::list_checkpoints(checkpoint_dir); steps.is_ok() && !steps->empty())
    found.push_back(std::to_string(steps->size()) + " checkpoint" + (steps->size() > 1 ? "s" : "") + " (newest " +
                    fs::path(steps->back()).filename().string() + ")");
  std::string s;
  for (size_t i = 0; i < found.size(); ++i) s += (i ? ", " : "") + found[i];
  return s;
}

}  // namespace

Status remove_earlier_run(const std::string& run_dir, const std::string& checkpoint_dir) {
  std::error_code ec;
  for (const char* f : {train::kMetricsFile, train::kLossSvgFile, "model", "config.yaml"}) {
    fs::remove_all(run_dir + "/" + f, ec);
    if (ec) return Status::error(Code::kIoError, run_dir + "/" + f, "an earlier run's file that can be removed", ec.message());
  }
  ASPEN_ASSIGN_OR_RETURN(const std::vector<std::string> steps, train::list_checkpoints(checkpoint_dir));
  for (const std::string& s : steps) {
    fs::remove_all(s, ec);
    if (ec) return Status::error(Code::kIoError, s, "an earlier run's checkpoint that can be removed", ec.message());
  }
  fs::remove(checkpoint_dir + "/latest", ec);
  if (ec) return Status::error(Code::kIoError, checkpoint_dir + "/latest", "a file that can be removed", ec.message());
  return Status::ok();
}

Result<ClaimedDirectories> claim_run_directories(const std::string& run_dir, const std::string& checkpoint_dir,
                                                 std::shared_ptr<DirectoryLock> run_lock, bool resuming,
                                                 bool overwrite) {
  ClaimedDirectories out;
  if (run_lock) {
    out.run_lock = std::move(run_lock);
  } else {
    ASPEN_ASSIGN_OR_RETURN(out.run_lock, lock_run_directory(run_dir));
  }
  std::error_code ec;
  const fs::path run = fs::weakly_canonical(run_dir, ec);
  if (ec) return Status::error(Code::kIoError, "run directory '" + run_dir + "'", "a path that can be resolved", ec.message());
  const fs::path ckpt = fs::weakly_canonical(checkpoint_dir, ec);
  if (ec)
    return Status::error(Code::kIoError, "checkpoint directory (checkpoint.dir) '" + checkpoint_dir + "'",
                         "a path that can be resolved", ec.message());
  const bool inside = std::mismatch(run.begin(), run.end(), ckpt.begin(), ckpt.end()).first == run.end();
  if (!inside) {
    ASPEN_ASSIGN_OR_RETURN(DirectoryLock lock, DirectoryLock::acquire(checkpoint_dir, "checkpoint directory (checkpoint.dir)"));
    out.checkpoint_lock = std::make_shared<DirectoryLock>(std::move(lock));
  }
  if (!resuming) {
    if (const std::string held = earlier_run(run_dir, checkpoint_dir); !held.empty()) {
      if (!overwrite)
        return Status::error(Code::kFailedPrecondition, "run directory '" + run_dir + "'",
                             "a new or empty run directory", "an earlier run's files: " + held,
                             "--resume continues that run, --overwrite deletes it and starts again, --run-dir DIR "
                             "(or log.run_dir) starts elsewhere");
      out.earlier_run = held;
    }
  }
  // Every output directory before step 1, not at the first save.
  ASPEN_RETURN_IF_ERROR(check_writable_directory(run_dir, "run directory (log.run_dir)"));
  ASPEN_RETURN_IF_ERROR(check_writable_directory(checkpoint_dir, "checkpoint directory (checkpoint.dir)"));
  return out;
}

}  // namespace aspen::api
