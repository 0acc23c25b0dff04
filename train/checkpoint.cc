#include "train/checkpoint.h"

#include <fcntl.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <functional>
#include <nlohmann/json.hpp>
#include <optional>

#include "core/atomic_file.h"
#include "core/checksum.h"
#include "core/file.h"
#include "core/log.h"
#include "io/safetensors.h"

namespace aspen::train {

namespace {

namespace fs = std::filesystem;
using ordered_json = nlohmann::ordered_json;

constexpr const char* kModelFile = "model.safetensors";
constexpr const char* kOptimizerFile = "optimizer.safetensors";
constexpr const char* kTrainerFile = "trainer.json";
constexpr const char* kStepFiles[] = {kModelFile, kOptimizerFile, kTrainerFile};
constexpr const char* kLatestFile = "latest";
// Every temporary a save makes under a root starts with this (write_file_atomic's
// "latest.tmp.XXXXXX" aside), so that a later save can remove a crashed one's.
constexpr const char* kTmpPrefix = ".tmp-";
constexpr const char* kLatestTmpPrefix = "latest.tmp.";
constexpr size_t kMaxSmallFileBytes = size_t(64) << 20;  // trainer.json, latest
constexpr int kMaxListedDifferences = 5;

std::string sq(const std::string& s) { return "'" + s + "'"; }
std::string join(const std::string& dir, const std::string& name) {
  return !dir.empty() && dir.back() == '/' ? dir + name : dir + "/" + name;
}
bool starts_with(const std::string& s, const char* p) { return s.rfind(p, 0) == 0; }

std::string basename_of(std::string path) {
  while (path.size() > 1 && path.back() == '/') path.pop_back();
  const size_t slash = path.find_last_of('/');
  return slash == std::string::npos ? path : path.substr(slash + 1);
}

// Up to 40 bytes of `s`, quoted, with anything unprintable as \xNN.
std::string brief(const std::string& s) {
  std::string out = "\"";
  for (size_t i = 0; i < s.size() && i < 40; ++i) {
    const unsigned char ch = static_cast<unsigned char>(s[i]);
    if (ch >= 0x20 && ch < 0x7f && ch != '"' && ch != '\\') {
      out += char(ch);
    } else {
      char buf[8];
      std::snprintf(buf, sizeof buf, "\\x%02x", ch);
      out += buf;
    }
  }
  return out + (s.size() > 40 ? "\"..." : "\"");
}

Status io_error(const std::string& subject, const std::string& expected, int err) {
  return Status::error(Code::kIoError, subject, expected, std::strerror(err));
}

Status corrupt(const std::string& subject, const std::string& expected, const std::string& found) {
  return Status::error(Code::kCorrupt, subject, expected, found);
}

// The step of a directory named checkpoint_dir_name(step), or nullopt.
std::optional<int64_t> step_of_dir_name(const std::string& name) {
  constexpr size_t kPrefix = 5;  // "step-"
  if (name.size() < kPrefix + 8 || name.compare(0, kPrefix, "step-") != 0) return std::nullopt;
  int64_t step = 0;
  for (size_t i = kPrefix; i < name.size(); ++i) {
    if (name[i] < '0' || name[i] > '9') return std::nullopt;
    if (__builtin_mul_overflow(step, 10, &step) || __builtin_add_overflow(step, name[i] - '0', &step))
      return std::nullopt;
  }
  if (checkpoint_dir_name(step) != name) return std::nullopt;  // only the canonical spelling
  return step;
}

// Whether `path` exists (without following a final symlink); other failures are IoError.
Result<bool> exists(const std::string& path) {
  struct stat st;
  if (::lstat(path.c_str(), &st) == 0) return true;
  if (errno == ENOENT) return false;
  return io_error(path, "a path whose existence can be checked", errno);
}

bool is_directory(const std::string& path) {
  struct stat st;
  return ::stat(path.c_str(), &st) == 0 && S_ISDIR(st.st_mode);
}

Status fsync_dir(const std::string& dir) {
  const int fd = ::open(dir.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return io_error(dir, "a directory that can be opened to fsync it", errno);
  const int rc = ::fsync(fd);
  const int err = errno;
  ::close(fd);
  // EINVAL: a filesystem that does not sync directories; there is nothing more to do.
  if (rc != 0 && err != EINVAL) return io_error(dir, "fsync of the directory to succeed", err);
  return Status::ok();
}

// <root>/.tmp-<what>-XXXXXX, created empty, mode 0755 (mkdtemp's 0700 would
// stay with the step directory it becomes).
Result<std::string> make_temp_dir(const std::string& root, const std::string& what) {
  std::string path = join(root, kTmpPrefix + what + "-XXXXXX");
  if (!::mkdtemp(path.data())) return io_error(path, "a temporary directory to be created", errno);
  if (::chmod(path.c_str(), 0755) != 0) {
    const int err = errno;
    ::rmdir(path.c_str());
    return io_error(path, "chmod 0755 of a new temporary directory to succeed", err);
  }
  return path;
}

void remove_quietly(const std::string& path) {
  std::error_code ec;
  fs::remove_all(path, ec);
}

// The directory name `latest` (at `path`) holds: one line, one path component.
Result<std::string> read_latest(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxSmallFileBytes));
  std::string name = text;
  if (!name.empty() && name.back() == '\n') name.pop_back();
  if (name.empty() || name == "." || name == ".." || name.size() > 255 ||
      name.find_first_of(std::string("/\n\0", 3)) != std::string::npos)
    return corrupt(path, "one line naming a checkpoint directory beside it (like " + checkpoint_dir_name(1200) + ")",
                   brief(text));
  return name;
}

// latest's name, or "" when there is none or it cannot be read.
std::string latest_name_or_empty(const std::string& root) {
  Result<std::string> name = read_latest(join(root, kLatestFile));
  return name.is_ok() ? *name : std::string();
}

Status check_tensors(const char* what, const std::map<std::string, Tensor>& tensors) {
  for (const auto& [name, t] : tensors)
    if (t.raw() == nullptr && t.nbytes() > 0)
      return Status::invalid_argument(std::string("save_checkpoint: ") + what + " " + sq(name), "a tensor with storage",
                                      "an empty (default or moved-from) Tensor");
  return Status::ok();
}

// Writes one tensor file; its size and CRC-32C come back for trainer.json.
Result<FileDigest> write_tensors(const std::string& path, const std::map<std::string, Tensor>& tensors, int64_t step) {
  std::vector<std::pair<std::string, const Tensor*>> list;
  list.reserve(tensors.size());
  for (const auto& [name, t] : tensors) list.emplace_back(name, &t);
  FileDigest d;
  ASPEN_RETURN_IF_ERROR(io::write_safetensors(path, list, {{kCheckpointStepMetadata, std::to_string(step)}}, &d));
  return d;
}

// The trainer's object, which must be JSON object text.
Result<ordered_json> parse_trainer_json(const Checkpoint& c) {
  ordered_json trainer = ordered_json::parse(c.trainer_json, nullptr, /*allow_exceptions=*/false);
  if (trainer.is_discarded())
    return Status::invalid_argument("save_checkpoint: trainer_json", "a JSON object", "a parse error");
  if (!trainer.is_object())
    return Status::invalid_argument("save_checkpoint: trainer_json", "a JSON object",
                                    std::string("a JSON ") + trainer.type_name());
  return trainer;
}

// trainer.json: our envelope around the trainer's object, with the size and
// CRC-32C of each tensor file (as written) and of the trainer object's compact dump.
std::string trainer_file_text(const Checkpoint& c, ordered_json trainer, const FileDigest& model,
                              const FileDigest& optimizer) {
  ordered_json j = ordered_json::object();
  j["format"] = kCheckpointFormat;
  j["version"] = kCheckpointVersion;
  j["step"] = c.step;
  ordered_json files = ordered_json::object();
  for (const auto& [f, d] : {std::pair<const char*, const FileDigest&>{kModelFile, model}, {kOptimizerFile, optimizer}})
    files[f] = {{"bytes", d.bytes}, {"crc32c", crc32c_hex(d.crc32c)}};
  j["files"] = std::move(files);
  j["trainer_crc32c"] = crc32c_hex(crc32c(trainer.dump()));
  j["trainer"] = std::move(trainer);
  return j.dump(2) + "\n";
}

// What a version-2 trainer.json (at `path`) records of tensor file `f`.
Result<FileDigest> recorded_digest(const std::string& path, const ordered_json& j, const char* f) {
  const auto files = j.find("files");
  if (files == j.end() || !files->is_object())
    return corrupt(path + ": files", "the size and CRC-32C of each tensor file", "none");
  const auto e = files->find(f);
  if (e == files->end() || !e->is_object() || !e->contains("bytes") || !(*e)["bytes"].is_number_unsigned() ||
      !e->contains("crc32c") || !(*e)["crc32c"].is_string())
    return corrupt(path + ": files." + f, "{\"bytes\": N, \"crc32c\": \"8 hex digits\"}",
                   e == files->end() ? "none" : brief(e->dump()));
  const std::string hex = (*e)["crc32c"].get<std::string>();
  char* end = nullptr;
  const unsigned long crc = std::strtoul(hex.c_str(), &end, 16);
  if (hex.size() != 8 || end != hex.c_str() + 8)
    return corrupt(path + ": files." + f + ".crc32c", "8 hex digits", brief(hex));
  return FileDigest{(*e)["bytes"].get<uint64_t>(), uint32_t(crc)};
}

// NOTE [checkpoint crash safety]: `latest` must name a whole checkpoint after
// a crash at any instruction (the full argument: docs/formats.md, "Training
// checkpoints"). The files are written and fsynced in a temporary directory,
// so a step directory only ever appears whole (rename is atomic) and is
// durable (root fsynced) before `latest` is replaced, itself atomically. A
// directory cannot be renamed over a non-empty one, so re-saving a step that
// `latest` names first points `latest` at a pivot directory of hard links to
// the new files; the old directory is then moved aside, the new one moved in,
// and `latest` pointed back. Pruning renames a directory to a temporary name
// before deleting it, so a crash mid-delete never leaves half a step.
//
// install() moves the whole step directory `tmp` to <root>/<name> and points
// `latest` at it. On failure, everything is put back as it was (best effort)
// and `tmp` still holds the new files.
Status install(const std::string& root, const std::string& name, const std::string& tmp) {
  const std::string final_dir = join(root, name);
  const std::string latest = join(root, kLatestFile);
  ASPEN_ASSIGN_OR_RETURN(const bool had_latest, exists(latest));
  std::string old_latest;
  if (had_latest) {
    ASPEN_ASSIGN_OR_RETURN(old_latest, read_regular_file(latest, kMaxSmallFileBytes));
  }
  ASPEN_ASSIGN_OR_RETURN(const bool replacing, exists(final_dir));

  std::string pivot, trash;  // temporaries of a replacement
  bool latest_moved = false, old_moved = false, new_moved = false;
  // Undoes what was done, newest first. Whatever cannot be put back is left
  // in place (the old checkpoint in its trash directory, the pivot `latest`
  // names) rather than deleted.
  auto fail = [&](Status s) {
    if (new_moved) (void)::rename(final_dir.c_str(), tmp.c_str());
    if (old_moved && ::rename(trash.c_str(), final_dir.c_str()) != 0) trash.clear();
    if (latest_moved && !write_file_atomic(latest, old_latest).is_ok()) pivot.clear();
    if (!trash.empty()) remove_quietly(trash);
    if (!pivot.empty()) remove_quietly(pivot);
    return s;
  };

  if (replacing) {
    // A directory cannot be renamed over a non-empty one. If `latest` names it,
    // point `latest` first at a pivot (hard links to the new files) so it names
    // a whole checkpoint while the old directory goes and the new one comes.
    Result<std::string> current = read_latest(latest);
    if (had_latest && current.is_ok() && *current == name) {
      Result<std::string> p = make_temp_dir(root, "pivot-" + name);
      if (!p.is_ok()) return fail(p.status());
      pivot = *p;
      for (const char* f : kStepFiles)
        if (::link(join(tmp, f).c_str(), join(pivot, f).c_str()) != 0)
          return fail(io_error(join(pivot, f), "a hard link to " + join(tmp, f), errno));
      if (Status s = fsync_dir(pivot); !s.is_ok()) return fail(s);
      if (Status s = fsync_dir(root); !s.is_ok()) return fail(s);
      if (Status s = write_file_atomic(latest, basename_of(pivot) + "\n"); !s.is_ok()) return fail(s);
      latest_moved = true;
    }
    Result<std::string> t = make_temp_dir(root, "old-" + name);
    if (!t.is_ok()) return fail(t.status());
    trash = *t;
    if (::rename(final_dir.c_str(), trash.c_str()) != 0)  // onto the empty trash directory
      return fail(io_error(final_dir, "to be moved aside to " + trash, errno));
    old_moved = true;
  }
  if (::rename(tmp.c_str(), final_dir.c_str()) != 0)
    return fail(io_error(final_dir, "the new checkpoint renamed from " + tmp, errno));
  new_moved = true;
  if (Status s = fsync_dir(root); !s.is_ok()) return fail(s);
  if (Status s = write_file_atomic(latest, name + "\n"); !s.is_ok()) return fail(s);
  if (!trash.empty()) remove_quietly(trash);
  if (!pivot.empty()) remove_quietly(pivot);
  return Status::ok();
}

// Deletes step directories beyond the newest `keep` and temporaries of
// crashed saves, never what `latest` names. Failures are warnings.
void prune(const std::string& root, int64_t keep) {
  const std::string named = latest_name_or_empty(root);
  std::vector<std::pair<int64_t, std::string>> steps;
  std::vector<std::string> stale;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code dir_ec;
    if (std::optional<int64_t> s = step_of_dir_name(name); s && it->is_directory(dir_ec)) {
      steps.emplace_back(*s, name);
    } else if (starts_with(name, kTmpPrefix) || starts_with(name, kLatestTmpPrefix)) {
      stale.push_back(name);
    }
  }
  if (ec) {
    ASPEN_LOG(warning) << root << ": old checkpoints not pruned: " << ec.message();
    return;
  }
  std::sort(steps.begin(), steps.end(), std::greater<>());
  for (size_t i = static_cast<size_t>(keep); i < steps.size(); ++i) {
    const std::string& name = steps[i].second;
    if (name == named) continue;
    // Renamed first, so a crash while deleting leaves a temporary, never half a step directory.
    Result<std::string> doomed = make_temp_dir(root, "delete-" + name);
    std::string target = join(root, name);
    if (doomed.is_ok()) {
      if (::rename(target.c_str(), doomed->c_str()) == 0) {
        target = *doomed;
      } else {
        remove_quietly(*doomed);
      }
    }
    fs::remove_all(target, ec);
    if (ec) ASPEN_LOG(warning) << target << ": old checkpoint not deleted: " << ec.message();
  }
  for (const std::string& name : stale) {
    if (name == named) continue;
    fs::remove_all(join(root, name), ec);
    if (ec) ASPEN_LOG(warning) << join(root, name) << ": stale temporary not deleted: " << ec.message();
  }
}

// Reads one tensor file, first checked against its recorded size (before
// parsing, so a truncated file says so) and CRC-32C (over the mapping the
// tensors are then copied from: the file is read once).
Status read_tensors(const std::string& path, int64_t step, const std::optional<FileDigest>& want,
                    std::map<std::string, Tensor>* out) {
  if (want) {
    ASPEN_ASSIGN_OR_RETURN(const InputFile in, InputFile::open(path, kMaxBinaryFileBytes));
    if (in.size() != want->bytes)
      return corrupt(path, std::to_string(want->bytes) + " bytes (per trainer.json)",
                     std::to_string(in.size()) + " bytes (the file is damaged or was replaced)");
  }
  ASPEN_ASSIGN_OR_RETURN(io::SafetensorsFile f, io::SafetensorsFile::open(path));
  if (want) {
    const std::span<const std::byte> bytes = f.file_bytes();
    const uint32_t crc = crc32c({reinterpret_cast<const char*>(bytes.data()), bytes.size()});
    f.release_all();  // read again tensor by tensor below (NOTE [pages read once])
    if (crc != want->crc32c)
      return corrupt(path, "CRC-32C \"" + crc32c_hex(want->crc32c) + "\" (per trainer.json)",
                     "\"" + crc32c_hex(crc) + "\" (the file is damaged)");
  }
  const auto it = f.metadata().find(kCheckpointStepMetadata);
  if (it == f.metadata().end() || it->second != std::to_string(step))
    return corrupt(path + ": metadata " + sq(kCheckpointStepMetadata),
                   "\"" + std::to_string(step) + "\" (trainer.json's step)",
                   it == f.metadata().end() ? "none" : brief(it->second));
  for (const std::string& name : f.names()) {
    ASPEN_ASSIGN_OR_RETURN(Tensor t, f.read(name));
    out->emplace(name, std::move(t));
  }
  return Status::ok();
}

Result<Checkpoint> read_step_dir(const std::string& dir) {
  const std::string path = join(dir, kTrainerFile);
  ASPEN_ASSIGN_OR_RETURN(std::string text, read_regular_file(path, kMaxSmallFileBytes));
  const ordered_json j = ordered_json::parse(text, nullptr, /*allow_exceptions=*/false);
  if (j.is_discarded()) return corrupt(path, "well-formed JSON", "a parse error");
  if (!j.is_object()) return corrupt(path, "a JSON object", std::string("a JSON ") + j.type_name());
  auto field = [&](const char* key) -> const ordered_json* {
    const auto it = j.find(key);
    return it == j.end() ? nullptr : &*it;
  };
  auto found = [](const ordered_json* v) {
    if (!v) return std::string("none");
    const std::string dumped = v->dump();
    return dumped.size() > 40 ? dumped.substr(0, 40) + "..." : dumped;
  };
  const ordered_json* format = field("format");
  if (!format || *format != kCheckpointFormat)
    return corrupt(path + ": format", std::string("\"") + kCheckpointFormat + "\"", found(format));
  const ordered_json* version = field("version");
  if (!version || !version->is_number_integer()) return corrupt(path + ": version", "an integer", found(version));
  if (*version != kCheckpointVersion && *version != kCheckpointVersionWithoutChecksums)
    return Status::error(Code::kUnimplemented, path + ": version",
                         std::to_string(kCheckpointVersionWithoutChecksums) + " or " +
                             std::to_string(kCheckpointVersion) + " (what this build reads)",
                         version->dump());
  const ordered_json* step = field("step");
  if (!step || !step->is_number_integer() || step->get<int64_t>() < 0)
    return corrupt(path + ": step", "an integer >= 0", found(step));
  const ordered_json* trainer = field("trainer");
  if (!trainer || !trainer->is_object())
    return corrupt(path + ": trainer", "the trainer's JSON object", found(trainer));
  std::optional<FileDigest> model, optimizer;  // version 2: what the files must be
  if (*version == kCheckpointVersion) {
    const ordered_json* sum = field("trainer_crc32c");
    if (!sum || !sum->is_string()) return corrupt(path + ": trainer_crc32c", "8 hex digits", found(sum));
    if (const std::string got = crc32c_hex(crc32c(trainer->dump())); got != sum->get<std::string>())
      return corrupt(path + ": trainer", "an object whose CRC-32C is " + found(sum) + " (trainer_crc32c)",
                     "\"" + got + "\" (the file is damaged)");
    ASPEN_ASSIGN_OR_RETURN(model, recorded_digest(path, j, kModelFile));
    ASPEN_ASSIGN_OR_RETURN(optimizer, recorded_digest(path, j, kOptimizerFile));
  } else {
    ASPEN_LOG(warning) << path << ": a version " << kCheckpointVersionWithoutChecksums
                       << " checkpoint has no checksums; its tensor data is not verified";
  }

  Checkpoint c;
  c.step = step->get<int64_t>();
  if (std::optional<int64_t> named = step_of_dir_name(basename_of(dir)); named && *named != c.step)
    return corrupt(path + ": step", std::to_string(*named) + " (the directory's name)", std::to_string(c.step));
  c.trainer_json = trainer->dump();
  ASPEN_RETURN_IF_ERROR(read_tensors(join(dir, kModelFile), c.step, model, &c.weights));
  ASPEN_RETURN_IF_ERROR(read_tensors(join(dir, kOptimizerFile), c.step, optimizer, &c.optimizer));
  return c;
}

struct Difference {
  std::string subject, expected, found;
};

std::string type_string(DType dtype, const Shape& shape) { return std::string(dtype_name(dtype)) + shape.to_string(); }

// The differences between `have` and `want`, in name order.
void compare(const std::string& what, const std::map<std::string, Tensor>& have, const TensorTypes& want,
             std::vector<Difference>* out) {
  auto h = have.begin();
  auto w = want.begin();
  while (h != have.end() || w != want.end()) {
    if (w == want.end() || (h != have.end() && h->first < w->first)) {
      out->push_back({what + " " + sq(h->first), "nothing (not in this model)",
                      type_string(h->second.dtype(), h->second.shape())});
      ++h;
    } else if (h == have.end() || w->first < h->first) {
      out->push_back({what + " " + sq(w->first), type_string(w->second.first, w->second.second), "nothing (missing)"});
      ++w;
    } else {
      if (h->second.dtype() != w->second.first || h->second.shape() != w->second.second)
        out->push_back({what + " " + sq(w->first), type_string(w->second.first, w->second.second),
                        type_string(h->second.dtype(), h->second.shape())});
      ++h;
      ++w;
    }
  }
}

}  // namespace

std::string checkpoint_dir_name(int64_t step) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "step-%08lld", static_cast<long long>(step));
  return buf;
}

Status save_checkpoint(const std::string& root, const Checkpoint& c, int64_t keep) {
  if (keep < 1)
    return Status::invalid_argument("save_checkpoint: keep", "at least 1 (the checkpoint just saved)",
                                    std::to_string(keep));
  if (c.step < 0) return Status::invalid_argument("save_checkpoint: step", "an integer >= 0", std::to_string(c.step));
  ASPEN_RETURN_IF_ERROR(check_tensors("weight", c.weights));
  ASPEN_RETURN_IF_ERROR(check_tensors("optimizer state", c.optimizer));
  ASPEN_ASSIGN_OR_RETURN(ordered_json trainer, parse_trainer_json(c));  // checked before anything is written
  const std::string name = checkpoint_dir_name(c.step);
  const std::string context = "save_checkpoint " + join(root, name);

  std::error_code ec;
  if (fs::create_directories(root, ec)) {
    const std::string parent = fs::path(root).lexically_normal().parent_path().string();
    (void)fsync_dir(parent.empty() ? "." : parent);  // durability of a new root's own name: best effort
  }
  if (ec) return Status::error(Code::kIoError, root, "a checkpoint root that exists or can be created", ec.message());
  Result<std::string> tmp_or = make_temp_dir(root, name);
  if (!tmp_or.is_ok()) return tmp_or.status().with_context(context);
  const std::string tmp = *tmp_or;

  Result<FileDigest> model = write_tensors(join(tmp, kModelFile), c.weights, c.step);
  Result<FileDigest> optimizer = model.is_ok() ? write_tensors(join(tmp, kOptimizerFile), c.optimizer, c.step)
                                               : Result<FileDigest>(model.status());
  Status s = optimizer.status();
  if (s.is_ok())
    s = write_file_atomic(join(tmp, kTrainerFile), trainer_file_text(c, std::move(trainer), *model, *optimizer));
  if (s.is_ok()) s = fsync_dir(tmp);
  if (s.is_ok()) s = install(root, name, tmp);
  if (!s.is_ok()) {
    remove_quietly(tmp);
    return std::move(s).with_context(context);
  }
  prune(root, keep);
  return Status::ok();
}

Result<Checkpoint> load_checkpoint(const std::string& path) {
  struct stat st;
  if (::stat(path.c_str(), &st) != 0) return io_error(path, "a checkpoint root or step directory", errno);
  if (!S_ISDIR(st.st_mode))
    return Status::invalid_argument(path, "a directory (a checkpoint root or step directory)", "another kind of file");
  const std::string latest = join(path, kLatestFile);
  ASPEN_ASSIGN_OR_RETURN(const bool has_latest, exists(latest));
  if (has_latest) {
    ASPEN_ASSIGN_OR_RETURN(const std::string name, read_latest(latest));
    const std::string dir = join(path, name);
    if (!is_directory(dir))
      return Status::error(Code::kNotFound, latest, "the name of a checkpoint directory beside it",
                           sq(name) + ", and there is no directory " + dir);
    return read_step_dir(dir);
  }
  ASPEN_ASSIGN_OR_RETURN(const bool has_trainer, exists(join(path, kTrainerFile)));
  if (has_trainer) return read_step_dir(path);
  std::string hint;
  if (Result<std::vector<std::string>> steps = list_checkpoints(path); steps.is_ok() && !steps->empty())
    hint = "load a step directory, e.g. the newest: " + steps->back();
  return Status::error(
      Code::kNotFound, latest,
      "a file naming the checkpoint to load (or, for a step directory, " + join(path, kTrainerFile) + ")", "neither",
      hint);
}

Result<std::vector<std::string>> list_checkpoints(const std::string& root) {
  std::vector<std::pair<int64_t, std::string>> steps;
  std::error_code ec;
  for (fs::directory_iterator it(root, ec), end; !ec && it != end; it.increment(ec)) {
    const std::string name = it->path().filename().string();
    std::error_code dir_ec;
    if (std::optional<int64_t> s = step_of_dir_name(name); s && it->is_directory(dir_ec)) steps.emplace_back(*s, name);
  }
  if (ec) return Status::error(Code::kIoError, root, "a readable checkpoint root", ec.message());
  std::sort(steps.begin(), steps.end());
  std::vector<std::string> out;
  out.reserve(steps.size());
  for (const auto& [step, name] : steps) out.push_back(join(root, name));
  return out;
}

Status check_compatible(const Checkpoint& c, const TensorTypes& expected_weights, const TensorTypes& expected_optimizer,
                        const std::string& path) {
  std::vector<Difference> diffs;
  compare("parameter", c.weights, expected_weights, &diffs);
  compare("optimizer state", c.optimizer, expected_optimizer, &diffs);
  if (diffs.empty()) return Status::ok();
  std::string hint;
  if (diffs.size() > 1) {
    hint = std::to_string(diffs.size()) + " differences; also ";
    for (size_t i = 1; i < diffs.size() && i < size_t(kMaxListedDifferences); ++i)
      hint += (i > 1 ? "; " : "") + diffs[i].subject + ": expected " + diffs[i].expected + ", found " + diffs[i].found;
    if (diffs.size() > size_t(kMaxListedDifferences)) hint += "; ...";
  }
  return Status::error(Code::kInvalidArgument, "checkpoint " + path + ": " + diffs[0].subject, diffs[0].expected,
                       diffs[0].found, hint);
}

}  // namespace aspen::train
