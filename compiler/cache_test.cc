#include "compiler/cache.h"

#include <gtest/gtest.h>
#include <sys/stat.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <thread>

#include "compiler/serialize.h"
#include "core/log.h"
#include "graph/builder.h"

namespace aspen::compiler {
namespace {

using graph::Builder;
using graph::Graph;
using graph::ValueId;

Graph sample_graph() {
  Graph g;
  Builder b(g);
  ValueId x = b.input("x", DType::f32, {3, 4});
  ValueId w = b.parameter("layer.0.weight", DType::f32, {4});
  b.set_stage(1);
  b.set_scope("layer.0");
  ValueId h = b.mul(x, b.broadcast(w, {3, 4}));
  b.set_scope({});
  b.checkpoint(h);
  ValueId s = b.reduce_sum(b.gelu(h, false), {0, 1}, false);
  b.output("loss", b.add(s, b.scalar(0.25f)));
  b.output("h", b.scale(h, -1.5));
  b.update(w, b.scale(w, 0.5));
  EXPECT_TRUE(b.status().is_ok()) << b.status().to_string();
  return g;
}

std::string temp_dir(const std::string& name) {
  auto p = std::filesystem::temp_directory_path() / ("aspen_" + name + "_" + std::to_string(::getpid()));
  std::filesystem::remove_all(p);
  return p.string();
}

TEST(Serialize, RoundTripsEveryField) {
  Graph g = sample_graph();
  auto back = decode_graph(encode_graph(g));
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  EXPECT_EQ(back->to_string(), g.to_string());
  EXPECT_EQ(encode_graph(*back), encode_graph(g));
  EXPECT_EQ(back->node(3).stage, 1);
  EXPECT_TRUE(back->node(3).checkpoint);
  EXPECT_EQ(back->node(3).scope, "layer.0");  // NOTE [name scopes]
  EXPECT_EQ(back->node(4).scope, "");
  ASSERT_EQ(back->updates().size(), 1u);
  EXPECT_EQ(back->updates()[0].first, "layer.0.weight");
}

TEST(Serialize, TruncationAndCorruptionAreStatusesNotCrashes) {
  const std::string bytes = encode_graph(sample_graph());
  for (size_t n = 0; n < bytes.size(); n += 3) {
    auto r = decode_graph(std::string_view(bytes).substr(0, n));
    ASSERT_FALSE(r.is_ok()) << "a prefix of " << n << " bytes decoded";
    EXPECT_EQ(r.status().code(), Code::kCorrupt);
  }
  // Flip each byte in turn: decoding must either fail cleanly or give a graph
  // the verifier judges (never crash or read out of bounds; ASan checks).
  for (size_t i = 0; i < bytes.size(); ++i) {
    std::string bad = bytes;
    bad[i] = char(bad[i] ^ 0x5a);
    auto r = decode_graph(bad);
    if (!r.is_ok()) {
      EXPECT_EQ(r.status().code(), Code::kCorrupt);
    }
  }
  EXPECT_EQ(decode_graph("").status().message(),
            "graph encoding at byte 0: expected 4 more bytes, found 0 bytes left");
}

TEST(Cache, MissThenHitGivesTheSameProgram) {
  const std::string dir = temp_dir("hit");
  ExecutableCache cache(dir);
  Graph g = sample_graph();
  bool hit = true;
  auto first = cache.compile(g, {}, &hit);
  ASSERT_TRUE(first.is_ok()) << first.status().to_string();
  EXPECT_FALSE(hit);
  EXPECT_TRUE(std::filesystem::exists(cache.entry_path(ExecutableCache::key(g, {}))));
  auto second = cache.compile(g, {}, &hit);
  ASSERT_TRUE(second.is_ok()) << second.status().to_string();
  EXPECT_TRUE(hit);
  EXPECT_EQ((*second)->listing(), (*first)->listing());
  // Other options are another entry.
  ASSERT_TRUE(cache.compile(g, {.opt_level = OptLevel::O0}, &hit).is_ok());
  EXPECT_FALSE(hit);
  std::filesystem::remove_all(dir);
}

// Every damaged entry is detected, rebuilt with a warning, and never used.
TEST(Cache, DamagedEntriesAreRebuilt) {
  const std::string dir = temp_dir("damage");
  ExecutableCache cache(dir);
  Graph g = sample_graph();
  ASSERT_TRUE(cache.compile(g, {}).is_ok());
  const std::string path = cache.entry_path(ExecutableCache::key(g, {}));
  std::string good;
  {
    std::ifstream f(path, std::ios::binary);
    good.assign(std::istreambuf_iterator<char>(f), {});
  }
  std::vector<std::string> warnings;
  LogSink old = set_log_sink([&](LogLevel, const std::string& m) { warnings.push_back(m); });
  struct Damage {
    const char* what;
    std::string bytes;
  };
  std::string flipped = good;
  flipped[good.size() / 2] = char(flipped[good.size() / 2] ^ 1);
  std::string versioned = good;
  versioned[8] = char(versioned[8] + 1);
  std::vector<Damage> cases = {{"checksum", flipped},
                               {"truncated", good.substr(0, good.size() - 7)},
                               {"version", versioned},
                               {"not an entry", "hello"}};
  for (const Damage& d : cases) {
    {
      std::ofstream f(path, std::ios::binary | std::ios::trunc);
      f << d.bytes;
    }
    warnings.clear();
    bool hit = true;
    auto exe = cache.compile(g, {}, &hit);
    ASSERT_TRUE(exe.is_ok()) << d.what;
    EXPECT_FALSE(hit) << d.what;
    ASSERT_EQ(warnings.size(), 1u) << d.what;
    EXPECT_NE(warnings[0].find(path), std::string::npos) << warnings[0];
    // The rebuilt entry is whole again.
    std::ifstream f(path, std::ios::binary);
    std::string now((std::istreambuf_iterator<char>(f)), {});
    EXPECT_EQ(now, good) << d.what;
  }
  set_log_sink(std::move(old));
  std::filesystem::remove_all(dir);
}

// Another graph's entry, copied under this graph's key, is never served as a
// hit: with only the key field edited the checksum fails; with the checksum
// forged too, the recorded request does not match the graph asked for.
TEST(Cache, ForeignEntryUnderAnotherKeyIsRebuilt) {
  const std::string dir = temp_dir("foreign");
  ExecutableCache cache(dir);
  Graph a = sample_graph();
  Graph b;
  {
    Builder bb(b);
    ValueId x = bb.input("x", DType::f32, {3, 4});
    bb.output("y", bb.scale(x, 2.0));
  }
  ASSERT_TRUE(cache.compile(a, {}).is_ok());
  const uint64_t ka = ExecutableCache::key(a, {}), kb = ExecutableCache::key(b, {});
  std::string entry;
  {
    std::ifstream f(cache.entry_path(ka), std::ios::binary);
    entry.assign(std::istreambuf_iterator<char>(f), {});
  }
  std::vector<std::string> warnings;
  LogSink old = set_log_sink([&](LogLevel, const std::string& m) { warnings.push_back(m); });
  auto serve = [&](const std::string& bytes) {
    std::ofstream(cache.entry_path(kb), std::ios::binary | std::ios::trunc) << bytes;
    warnings.clear();
    bool hit = true;
    auto exe = cache.compile(b, {}, &hit);
    EXPECT_TRUE(exe.is_ok());
    EXPECT_FALSE(hit);
    EXPECT_EQ(warnings.size(), 1u);
    return warnings.empty() ? std::string() : warnings[0];
  };
  std::string moved = entry;
  std::memcpy(moved.data() + 12, &kb, 8);  // the key field
  EXPECT_NE(serve(moved).find("matching its checksum"), std::string::npos);
  // Forge the checksum as the writer computes it (version, key, payload).
  std::string head(entry.data() + 8, 4);
  head.append(reinterpret_cast<const char*>(&kb), 8);
  const uint64_t forged = fnv1a64(std::string_view(moved).substr(36), fnv1a64(head));
  std::memcpy(moved.data() + 28, &forged, 8);
  EXPECT_NE(serve(moved).find("expected an entry compiled from the graph requested, found another graph's entry"),
            std::string::npos)
      << warnings[0];
  set_log_sink(std::move(old));
  std::filesystem::remove_all(dir);
}

// A FIFO (or a device) where an entry belongs would block the read forever: it is refused at once, the
// entry rebuilt and written in its place.
TEST(Cache, SpecialFileAsEntryIsRebuiltWithoutBlocking) {
  const std::string dir = temp_dir("fifo");
  std::filesystem::create_directories(dir);
  ExecutableCache cache(dir);
  Graph g = sample_graph();
  const std::string path = cache.entry_path(ExecutableCache::key(g, {}));
  ASSERT_EQ(::mkfifo(path.c_str(), 0600), 0);
  std::vector<std::string> warnings;
  LogSink old = set_log_sink([&](LogLevel, const std::string& m) { warnings.push_back(m); });
  bool hit = true;
  ASSERT_TRUE(cache.compile(g, {}, &hit).is_ok());
  set_log_sink(std::move(old));
  EXPECT_FALSE(hit);
  ASSERT_EQ(warnings.size(), 1u);
  EXPECT_NE(warnings[0].find("expected a regular file, found a FIFO (named pipe)"), std::string::npos) << warnings[0];
  EXPECT_TRUE(std::filesystem::is_regular_file(path));
  std::filesystem::remove_all(dir);
}

TEST(Cache, ConcurrentWritersLeaveAValidEntry) {
  const std::string dir = temp_dir("race");
  Graph g = sample_graph();
  std::vector<std::thread> writers;
  for (int i = 0; i < 4; ++i)
    writers.emplace_back([&] {
      ExecutableCache cache(dir);
      EXPECT_TRUE(cache.compile(g, {}).is_ok());
    });
  for (auto& t : writers) t.join();
  ExecutableCache cache(dir);
  bool hit = false;
  ASSERT_TRUE(cache.compile(g, {}, &hit).is_ok());
  EXPECT_TRUE(hit);
  size_t files = 0;
  for (auto& e : std::filesystem::directory_iterator(dir)) files += e.is_regular_file();
  EXPECT_EQ(files, 1u);  // no temporary files left behind
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace aspen::compiler
