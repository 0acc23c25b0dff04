// compiler/cache.h: the on-disk executable cache.
//
// compile_cached() looks up an entry keyed by hash(graph encoding, options,
// format version). An entry holds the graph after passes; loading it skips
// the passes and re-runs only memory planning and lowering (prepared kernels
// are process-local: a oneDNN primitive cannot be saved). Entries are checked
// before use: magic, format version, key, length, checksum (over version, key
// and payload) and the graph it was compiled from. A corrupt,
// truncated or foreign entry is rebuilt with a warning, never used. Entries
// are written to a temporary file in the same directory, fsynced and renamed,
// so concurrent writers of one key cannot leave a torn file (the last rename
// wins, and both wrote the same bytes).
//
// Layout of an entry file (pinned; docs/formats.md):
//   "ASPNEXEC" | u32 format version | u64 key | u64 payload bytes | u64 FNV-1a of (version, key, payload) | payload
// payload = u64 request bytes | u64 request hash | encoded options | encoded graph after passes
// (compiler/serialize.h); the request is the encoding of the graph asked for (its length and FNV-1a
// under a second seed), compared on load.
//
// Thread-safety: an ExecutableCache may be used from several threads.
#pragma once

#include <memory>
#include <string>

#include "compiler/executable.h"

namespace aspen::compiler {

inline constexpr uint32_t kExecutableFormatVersion = 5;  // 2: graph updates; 3: checksum over key, request hash;
                                                         // 4: send/recv gone (ops 39, 40 renumbered);
                                                         // 5: node scopes

// $ASPEN_CACHE_DIR if set, else $XDG_CACHE_HOME/aspen, else ~/.cache/aspen.
std::string default_cache_dir();

class ExecutableCache {
 public:
  explicit ExecutableCache(std::string dir) : dir_(std::move(dir)) {}
  const std::string& dir() const { return dir_; }

  // The cache key of (graph, options).
  static uint64_t key(const graph::Graph& graph, const CompileOptions& options);
  static uint64_t key_of(const std::string& encoded_graph, const CompileOptions& options);
  std::string entry_path(uint64_t key) const;

  // Loads the entry for (graph, options) or compiles and stores it. *hit says
  // which happened; *stored whether a compiled entry was written. Failing to
  // write the entry is a warning, not an error.
  Result<std::unique_ptr<Executable>> compile(const graph::Graph& graph, const CompileOptions& options,
                                              bool* hit = nullptr, bool* stored = nullptr);

 private:
  std::string dir_;
};

}  // namespace aspen::compiler
