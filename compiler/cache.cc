#include "compiler/cache.h"

#include <fcntl.h>
#include <unistd.h>

#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <thread>

#include "compiler/serialize.h"
#include "core/atomic_file.h"
#include "core/file.h"
#include "core/log.h"
#include "graph/verify.h"
#include "kernels/matmul_choice.h"

namespace aspen::compiler {

namespace {

constexpr char kMagic[8] = {'A', 'S', 'P', 'N', 'E', 'X', 'E', 'C'};
constexpr size_t kHeaderBytes = 8 + 4 + 8 + 8 + 8;

std::string encode_options(const CompileOptions& o) {
  std::string s;
  s += char(o.opt_level);
  s += char(o.recompute ? 1 : 0);
  s += char(o.compute);
  s += char(o.partials);
  s += char(o.stochastic_rounding ? 1 : 0);
  s.append(reinterpret_cast<const char*>(&o.max_folded_elements), sizeof(o.max_folded_elements));
  return s;
}

template <class T>
void put(std::string& s, T v) {
  s.append(reinterpret_cast<const char*>(&v), sizeof(T));
}
template <class T>
T get(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof(T));
  return v;
}


// An entry holds a graph (constants included), never weights: anything larger is not ours.
constexpr uint64_t kMaxEntryBytes = uint64_t(4) << 30;

// What an entry records of the graph it was compiled from: the encoding's
// length and a second hash of it (another seed than the key's), so an entry
// is used only for the graph that made it, even under a colliding key.
struct Request {
  uint64_t bytes = 0, hash = 0;
};
constexpr uint64_t kRequestSeed = 0x6173706e72657131ull;  // "aspnreq1"
Request request_of(const std::string& encoded_graph) { return {encoded_graph.size(), fnv1a64(encoded_graph, kRequestSeed)}; }

// The checksum covers the version and key too: an entry copied under another
// name, its key field edited, fails it.
uint64_t entry_checksum(uint32_t version, uint64_t key, std::string_view body) {
  std::string head;
  put<uint32_t>(head, version);
  put<uint64_t>(head, key);
  return fnv1a64(body, fnv1a64(head));
}

// Reads and checks an entry; the graph it holds, or why it cannot be used.
Result<graph::Graph> read_entry(const std::string& path, uint64_t key, const std::string& options,
                                const Request& request) {
  Result<std::string> read = read_regular_file(path, kMaxEntryBytes);
  if (!read.is_ok() && read.status().code() == Code::kNotFound)
    return Status::error(Code::kNotFound, path, "a cache entry", "none");
  if (!read.is_ok()) return read.status();
  const std::string& data = *read;
  if (data.size() < kHeaderBytes)
    return Status::error(Code::kCorrupt, path, "at least " + std::to_string(kHeaderBytes) + " bytes",
                         std::to_string(data.size()) + " (truncated)");
  if (std::memcmp(data.data(), kMagic, 8) != 0)
    return Status::error(Code::kCorrupt, path, "an aspen executable (magic ASPNEXEC)", "other bytes");
  const uint32_t version = get<uint32_t>(data.data() + 8);
  if (version != kExecutableFormatVersion)
    return Status::error(Code::kCorrupt, path, "format version " + std::to_string(kExecutableFormatVersion),
                         "version " + std::to_string(version));
  if (get<uint64_t>(data.data() + 12) != key)
    return Status::error(Code::kCorrupt, path, "the key of its name", "another key");
  const uint64_t payload = get<uint64_t>(data.data() + 20);
  if (payload != data.size() - kHeaderBytes)
    return Status::error(Code::kCorrupt, path, std::to_string(payload) + " payload bytes",
                         std::to_string(data.size() - kHeaderBytes) + " (truncated or padded)");
  const std::string_view body(data.data() + kHeaderBytes, size_t(payload));
  if (entry_checksum(version, key, body) != get<uint64_t>(data.data() + 28))
    return Status::error(Code::kCorrupt, path, "a header and payload matching its checksum", "a mismatch");
  if (body.size() < 16 || get<uint64_t>(body.data()) != request.bytes || get<uint64_t>(body.data() + 8) != request.hash)
    return Status::error(Code::kCorrupt, path, "an entry compiled from the graph requested", "another graph's entry");
  if (body.substr(16, options.size()) != options)
    return Status::error(Code::kCorrupt, path, "the compile options of its key", "other options");
  ASPEN_ASSIGN_OR_RETURN(graph::Graph g, decode_graph(body.substr(16 + options.size())));
  ASPEN_RETURN_IF_ERROR(graph::verify(g));
  return g;
}

}  // namespace

std::string default_cache_dir() {
  if (const char* d = std::getenv("ASPEN_CACHE_DIR"); d && *d) return d;
  if (const char* d = std::getenv("XDG_CACHE_HOME"); d && *d) return std::string(d) + "/aspen";
  if (const char* h = std::getenv("HOME"); h && *h) return std::string(h) + "/.cache/aspen";
  return ".aspen-cache";
}

uint64_t ExecutableCache::key(const graph::Graph& g, const CompileOptions& options) {
  return key_of(encode_graph(g), options);
}

uint64_t ExecutableCache::key_of(const std::string& encoded_graph, const CompileOptions& options) {
  uint64_t h = fnv1a64(encoded_graph);
  h = fnv1a64(encode_options(options), h);
  const uint32_t v = kExecutableFormatVersion;
  return fnv1a64(std::string_view(reinterpret_cast<const char*>(&v), sizeof(v)), h);
}

std::string ExecutableCache::entry_path(uint64_t key) const {
  char name[32];
  std::snprintf(name, sizeof(name), "%016llx.aspenexe", static_cast<unsigned long long>(key));
  return dir_ + "/" + name;
}

Result<std::unique_ptr<Executable>> ExecutableCache::compile(const graph::Graph& g, const CompileOptions& options,
                                                             bool* hit, bool* stored) {
  if (hit) *hit = false;
  if (stored) *stored = false;
  // NOTE [matmul choice]: the products' measured backends live beside the entries, per CPU identity.
  const std::string choices = kernels::matmul_choices_path(dir_);
  if (Status st = kernels::load_matmul_choices(choices); !st.is_ok())
    ASPEN_LOG(warning) << "executable cache: " << st.message();
  const auto keep_choices = [&] {
    if (!kernels::matmul_choices_changed()) return;
    std::error_code dir_ec;
    std::filesystem::create_directories(dir_, dir_ec);
    if (Status st = kernels::save_matmul_choices(choices); !st.is_ok())
      ASPEN_LOG(warning) << "executable cache: matmul choices not stored: " << st.message();
  };
  const std::string encoded = encode_graph(g);
  const uint64_t k = key_of(encoded, options);
  const Request request = request_of(encoded);
  const std::string path = entry_path(k);
  const std::string opts = encode_options(options);
  auto cached = read_entry(path, k, opts, request);
  if (cached.is_ok()) {
    auto exe = lower_optimized(std::move(cached).value(), options);
    if (exe.is_ok()) {
      if (hit) *hit = true;
      keep_choices();
      return exe;
    }
    ASPEN_LOG(warning) << "executable cache: " << path << " could not be loaded (" << exe.status().message()
                       << "); rebuilding it";
  } else if (cached.status().code() != Code::kNotFound) {
    ASPEN_LOG(warning) << "executable cache: ignoring " << cached.status().message() << "; rebuilding it";
  }
  ASPEN_ASSIGN_OR_RETURN(std::unique_ptr<Executable> exe, compiler::compile(g, options));
  std::string bytes(kMagic, 8);
  put<uint32_t>(bytes, kExecutableFormatVersion);
  put<uint64_t>(bytes, k);
  std::string body;
  put<uint64_t>(body, request.bytes);
  put<uint64_t>(body, request.hash);
  body += opts + encode_graph(exe->graph);
  put<uint64_t>(bytes, body.size());
  put<uint64_t>(bytes, entry_checksum(kExecutableFormatVersion, k, body));
  bytes += body;
  std::error_code ec;
  std::filesystem::create_directories(dir_, ec);
  Status w = ec ? Status::error(Code::kIoError, dir_, "a cache directory", ec.message()) : write_file_atomic(path, bytes);
  if (!w.is_ok()) ASPEN_LOG(warning) << "executable cache: not stored: " << w.message();
  if (stored) *stored = w.is_ok();
  keep_choices();
  return exe;
}

}  // namespace aspen::compiler
