// train/checkpoint.h: training checkpoints (weights, optimizer state and the
// trainer's own state), written so that a crash at any moment leaves a whole
// checkpoint to resume from.
//
//   ASPEN_RETURN_IF_ERROR(train::save_checkpoint("runs/a", ckpt));  // keeps the newest 2
//   ASPEN_ASSIGN_OR_RETURN(train::Checkpoint c, train::load_checkpoint("runs/a"));
//
// Layout (byte format and the crash-safety argument: docs/formats.md,
// "Training checkpoints"):
//   <root>/step-00001200/model.safetensors      the weights, Hugging Face names
//   <root>/step-00001200/optimizer.safetensors  the optimizer state ("optimizer.*")
//   <root>/step-00001200/trainer.json           {"format", "version", "step", "trainer": {...}}
//   <root>/latest                               "step-00001200\n"
// A step directory is built under a temporary name, every file fsynced, then
// renamed into place; `latest` is replaced (write_file_atomic) only after
// that, so it always names a whole checkpoint. The trainer's JSON object is
// opaque here (its step, RNG, data position, loss scale, config); it comes
// back as its compact dump with its key order (numbers beyond 64-bit integers
// and doubles lose precision, as in any JSON).
//
// Checkpoints hold full logical tensors by name, so a checkpoint written under
// one parallel layout loads under any other; check_compatible says whether it
// belongs to the model at hand at all.
//
// Thread-safety: one writer per root at a time (a second writer's temporaries
// look stale to the first and may be removed). Readers may run during a save;
// with keep = 1, one that read `latest` just before may find its directory
// pruned (an error naming it; read again).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "core/dtype.h"
#include "core/shape.h"
#include "core/status.h"
#include "core/tensor.h"

namespace aspen::train {

struct Checkpoint {
  std::map<std::string, Tensor> weights = {};    // model parameters, Hugging Face names (f32 master weights)
  std::map<std::string, Tensor> optimizer = {};  // optimizer state: optimizer.step, optimizer.exp_avg.<p>, ...
  std::string trainer_json = "{}";               // the trainer's own JSON object, opaque here
  int64_t step = 0;                              // optimizer steps done
};

// Pinned (reaches disk): trainer.json's "format" and "version", the
// safetensors metadata key holding the step, and the directory names.
inline constexpr const char* kCheckpointFormat = "aspen-train-checkpoint";
inline constexpr int kCheckpointVersion = 2;  // 2: trainer.json records each file's size and CRC-32C
inline constexpr int kCheckpointVersionWithoutChecksums = 1;  // still read (with a warning)
inline constexpr const char* kCheckpointStepMetadata = "aspen.step";

// "step-00001200": at least 8 digits, so names sort by step up to 10^8.
std::string checkpoint_dir_name(int64_t step);

// Writes the checkpoint of step c.step under `root` (created if missing),
// points `latest` at it, then deletes the checkpoints beyond the newest `keep`
// (never the one `latest` names) and temporaries of crashed writers. Saving a
// step that exists replaces it, crash-safely too. A bad argument (keep < 1, a
// negative step, trainer_json not a JSON object, a bad tensor name) is
// InvalidArgument; an OS failure is IoError naming the file and strerror, the
// temporaries are removed and `latest` is left as it was. Failing to prune
// afterwards is only a warning: the checkpoint is saved.
[[nodiscard]] Status save_checkpoint(const std::string& root, const Checkpoint& c, int64_t keep = 2);

// `path` is a root (the checkpoint `latest` names) or a step directory. Every
// file is validated (each file's size and CRC-32C against those trainer.json
// records, the trainer object's own CRC-32C, the safetensors reader,
// trainer.json's format, version and step, the step agreeing across the files
// and the directory's name); errors name the file. A damaged file is Corrupt:
// nothing falls back to an older checkpoint by itself (load that one by its
// step directory). A root without `latest` is NotFound naming it.
Result<Checkpoint> load_checkpoint(const std::string& path);

// The step directories under `root` (paths), oldest first.
Result<std::vector<std::string>> list_checkpoints(const std::string& root);

// Whether checkpoint `c` (read from `path`, which names it in errors) belongs
// to a model whose weights and optimizer state have exactly these names,
// dtypes and shapes. InvalidArgument listing the first few differences:
//   "checkpoint runs/a: parameter 'x': expected f32[48, 1000], found f32[48, 999]"
// (then "parameter 'y' (f32[48]) missing", "parameter 'z' (f32[3]) not in this
// model", "optimizer state '...' ..."), with the number of differences.
using TensorTypes = std::map<std::string, std::pair<DType, Shape>>;
[[nodiscard]] Status check_compatible(const Checkpoint& c, const TensorTypes& expected_weights,
                                      const TensorTypes& expected_optimizer, const std::string& path);

}  // namespace aspen::train
