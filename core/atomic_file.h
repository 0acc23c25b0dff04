// core/atomic_file.h: writing a file so that readers see the old file or the
// whole new one, never a part (checkpoints, safetensors, traces, token shards,
// executable cache entries).
//
// The bytes go to a uniquely named temporary file beside `path` (mkstemp:
// concurrent writers of the same path, threads or processes, never share
// one), which is fsynced and renamed over `path`; then the directory is
// fsynced so the rename survives a crash (a directory that cannot be synced
// leaves the file written all the same). On any failure the temporary file is
// removed and `path` is untouched.
//
// Thread-safety: safe to call concurrently, also for the same path (the last
// rename wins; each reader sees one whole file).
#pragma once

#include <span>
#include <string>
#include <string_view>

#include "core/status.h"

namespace aspen {

// Writes the concatenation of `parts` to `path` (mode 0644). An OS failure is
// an IoError naming `path`, the step that failed and strerror.
[[nodiscard]] Status write_file_atomic(const std::string& path, std::span<const std::string_view> parts);
[[nodiscard]] inline Status write_file_atomic(const std::string& path, std::string_view bytes) {
  return write_file_atomic(path, std::span<const std::string_view>(&bytes, 1));
}

}  // namespace aspen
