// train/checkpoint_test.cc: training checkpoints: bit-exact round trips,
// pruning and re-saving, every error worded exactly, damaged files, and crash
// safety: a writer killed with SIGKILL at random moments, and a disk that
// fills up (RLIMIT_FSIZE) in the middle of a save.
#include "train/checkpoint.h"

#include <gtest/gtest.h>
#include <signal.h>
#include <stdlib.h>
#include <sys/resource.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>
#include <sstream>
#include <nlohmann/json.hpp>
#include <thread>

#include "io/test_files.h"

namespace aspen::train {
namespace {

namespace fs = std::filesystem;
using io::test_files::read_bytes;
using io::test_files::TempDir;
using io::test_files::write_bytes;
using ordered_json = nlohmann::ordered_json;



// A tensor whose every byte is a function of (seed, index), NaN payloads and all.
Tensor patterned(DType dtype, Shape shape, uint64_t seed) {
  Tensor t(dtype, shape);
  auto* p = static_cast<unsigned char*>(t.raw());
  uint64_t x = seed * 0x9E3779B97F4A7C15ull + 1;
  for (size_t i = 0; i < t.nbytes(); ++i) {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    p[i] = static_cast<unsigned char>(x >> 24);
  }
  return t;
}

// The checkpoint of step k: `floats` f32 weights and as many optimizer
// values, a bf16 tensor, a scalar, every byte and the trainer's JSON a
// function of k (so a checkpoint that mixed two steps would be seen).
Checkpoint step_checkpoint(int64_t k, int64_t floats = 4096) {
  Checkpoint c;
  c.step = k;
  const uint64_t seed = static_cast<uint64_t>(k) * 4;
  c.weights.emplace("transformer.wte.weight", patterned(DType::f32, Shape{floats / 256, 256}, seed));
  c.weights.emplace("transformer.ln_f.weight", patterned(DType::bf16, Shape{1000}, seed + 1));
  c.optimizer.emplace("optimizer.exp_avg.transformer.wte.weight",
                      patterned(DType::f32, Shape{floats / 256, 256}, seed + 2));
  c.optimizer.emplace("optimizer.step", patterned(DType::f32, Shape{}, seed + 3));
  // Keys not in sorted order, a u64 beyond int64, a double: all come back as written.
  c.trainer_json = R"({"step":)" + std::to_string(k) + R"(,"rng":[1,18446744073709551615],"lr":0.00025,)" +
                   R"("data":{"epoch":0,"step_in_epoch":)" + std::to_string(3 * k) + "}}";
  return c;
}

void expect_same_tensors(const std::map<std::string, Tensor>& got, const std::map<std::string, Tensor>& want) {
  ASSERT_EQ(got.size(), want.size());
  for (const auto& [name, t] : want) {
    ASSERT_TRUE(got.count(name)) << name;
    const Tensor& g = got.at(name);
    ASSERT_EQ(g.dtype(), t.dtype()) << name;
    ASSERT_EQ(g.shape(), t.shape()) << name;
    ASSERT_EQ(std::memcmp(g.raw(), t.raw(), t.nbytes()), 0) << name;
  }
}

void expect_same(const Checkpoint& got, const Checkpoint& want) {
  EXPECT_EQ(got.step, want.step);
  EXPECT_EQ(got.trainer_json, want.trainer_json);
  expect_same_tensors(got.weights, want.weights);
  expect_same_tensors(got.optimizer, want.optimizer);
}

std::vector<std::string> temporaries(const std::string& root) {
  std::vector<std::string> out;
  for (const auto& e : fs::directory_iterator(root)) {
    const std::string name = e.path().filename().string();
    if (name.rfind(".tmp-", 0) == 0 || name.rfind("latest.tmp.", 0) == 0) out.push_back(name);
  }
  return out;
}

TEST(Checkpoint, RoundTripIsBitExactThroughRootAndStepDirectory) {
  TempDir d;
  const std::string root = d / "run";  // created by the save
  Checkpoint c = step_checkpoint(7);
  float* w = c.weights.at("transformer.wte.weight").data<float>();
  w[0] = -0.0f;
  w[1] = 1e-40f;  // subnormal
  ASSERT_TRUE(save_checkpoint(root, c).is_ok());
  EXPECT_EQ(read_bytes(root + "/latest"), "step-00000007\n");
  auto list = list_checkpoints(root);
  ASSERT_TRUE(list.is_ok()) << list.status().to_string();
  EXPECT_EQ(*list, std::vector<std::string>{root + "/step-00000007"});
  EXPECT_NE(read_bytes(root + "/step-00000007/trainer.json").find(R"("format": "aspen-train-checkpoint")"),
            std::string::npos);
  for (const std::string& path : {root, root + "/step-00000007", root + "/step-00000007/"}) {
    SCOPED_TRACE(path);
    auto back = load_checkpoint(path);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    expect_same(*back, c);
  }
  EXPECT_TRUE(temporaries(root).empty());
  EXPECT_EQ(fs::status(root + "/step-00000007").permissions() & fs::perms::all,
            fs::perms::owner_all | fs::perms::group_read | fs::perms::group_exec | fs::perms::others_read |
                fs::perms::others_exec);  // 0755, not mkdtemp's 0700

  // Empty optimizer state and trainer object, step 0.
  Checkpoint bare;
  bare.weights.emplace("w", patterned(DType::bf16, Shape{3, 5}, 9));
  ASSERT_TRUE(save_checkpoint(d / "bare", bare).is_ok());
  auto back = load_checkpoint(d / "bare");
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  expect_same(*back, bare);
  EXPECT_EQ(checkpoint_dir_name(123456789), "step-123456789");
}

TEST(Checkpoint, KeepPrunesOldStepsAndResavingAStepReplacesIt) {
  TempDir d;
  const std::string root = d / "run";
  for (int64_t k = 1; k <= 5; ++k) ASSERT_TRUE(save_checkpoint(root, step_checkpoint(k)).is_ok());
  EXPECT_EQ(*list_checkpoints(root), (std::vector<std::string>{root + "/step-00000004", root + "/step-00000005"}));

  // Re-saving the step `latest` names (through a pivot directory).
  Checkpoint again = step_checkpoint(5);
  again.trainer_json = R"({"again":true})";
  again.weights.at("transformer.wte.weight") = patterned(DType::f32, Shape{4, 4}, 99);
  ASSERT_TRUE(save_checkpoint(root, again).is_ok());
  auto back = load_checkpoint(root);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  expect_same(*back, again);
  EXPECT_EQ(*list_checkpoints(root), (std::vector<std::string>{root + "/step-00000004", root + "/step-00000005"}));
  EXPECT_TRUE(temporaries(root).empty());

  // A run resumed from step 3: `latest` follows it, and is never pruned.
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(3)).is_ok());
  EXPECT_EQ(read_bytes(root + "/latest"), "step-00000003\n");
  EXPECT_EQ(list_checkpoints(root)->size(), 3u);
  // Re-saving a step `latest` does not name (moved aside directly).
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(4), /*keep=*/1).is_ok());
  back = load_checkpoint(root);
  ASSERT_TRUE(back.is_ok()) << back.status().to_string();
  expect_same(*back, step_checkpoint(4));
  EXPECT_EQ(*list_checkpoints(root), (std::vector<std::string>{root + "/step-00000004", root + "/step-00000005"}));
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(6), /*keep=*/1).is_ok());
  EXPECT_EQ(*list_checkpoints(root), std::vector<std::string>{root + "/step-00000006"});

  // Temporaries of crashed saves are removed by the next one; unrelated files stay.
  fs::create_directories(root + "/.tmp-step-00000007-abcdef");
  write_bytes(root + "/.tmp-step-00000007-abcdef/model.safetensors", "half");
  write_bytes(root + "/latest.tmp.ZZZZZZ", "step-");
  write_bytes(root + "/notes.txt", "mine");
  fs::create_directories(root + "/step-7");  // not a step directory's name
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(8)).is_ok());
  EXPECT_TRUE(temporaries(root).empty());
  EXPECT_TRUE(fs::exists(root + "/notes.txt"));
  EXPECT_TRUE(fs::exists(root + "/step-7"));
  EXPECT_EQ(*list_checkpoints(root), (std::vector<std::string>{root + "/step-00000006", root + "/step-00000008"}));
}

TEST(Checkpoint, BadArgumentsAreNamed) {
  TempDir d;
  const std::string root = d / "run";
  auto error = [&](const Checkpoint& c, int64_t keep = 2) { return save_checkpoint(root, c, keep).message(); };
  EXPECT_EQ(error(step_checkpoint(1), 0),
            "save_checkpoint: keep: expected at least 1 (the checkpoint just saved), found 0");
  EXPECT_EQ(error(step_checkpoint(-1)), "save_checkpoint: step: expected an integer >= 0, found -1");
  Checkpoint c = step_checkpoint(1);
  c.trainer_json = "[1, 2]";
  EXPECT_EQ(error(c), "save_checkpoint: trainer_json: expected a JSON object, found a JSON array");
  c.trainer_json = R"({"step": )";
  EXPECT_EQ(error(c), "save_checkpoint: trainer_json: expected a JSON object, found a parse error");
  c = step_checkpoint(1);
  Tensor gone = std::move(c.optimizer.at("optimizer.step"));
  EXPECT_EQ(error(c),
            "save_checkpoint: optimizer state 'optimizer.step': expected a tensor with storage, found an "
            "empty (default or moved-from) Tensor");
  EXPECT_FALSE(fs::exists(root + "/latest"));
  write_bytes(d / "file", "x");
  Status s = save_checkpoint(d / "file", step_checkpoint(1));
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.message().rfind(d / "file" + ": expected a checkpoint root that exists or can be created, found ", 0), 0u)
      << s.message();
}

TEST(Checkpoint, DamagedFilesAreErrorsNamingTheFile) {
  TempDir d;
  const std::string root = d / "run";
  const std::string dir = root + "/step-00000002";
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(1)).is_ok());
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(2)).is_ok());
  auto error = [&]() { return load_checkpoint(root).status(); };
  auto restore = [&]() { ASSERT_TRUE(save_checkpoint(root, step_checkpoint(2)).is_ok()); };

  // Truncated or flipped model.safetensors, at many lengths: an error naming it, never a crash.
  const std::string model = read_bytes(dir + "/model.safetensors");
  for (size_t n = 0; n < model.size(); n += model.size() / 37 + 1) {
    write_bytes(dir + "/model.safetensors", model.substr(0, n));
    Status s = error();
    ASSERT_EQ(s.code(), Code::kCorrupt) << n << ": " << s.to_string();
    ASSERT_EQ(s.message().rfind(dir + "/model.safetensors", 0), 0u) << s.message();
  }
  write_bytes(dir + "/model.safetensors", model.substr(0, model.size() / 2));
  EXPECT_EQ(error().message(), dir + "/model.safetensors: expected " + std::to_string(model.size()) +
                                   " bytes (per trainer.json), found " + std::to_string(model.size() / 2) +
                                   " bytes (the file is damaged or was replaced)");
  // One flipped bit in the tensor data (the last byte): the checksum names the file.
  for (const char* f : {"/model.safetensors", "/optimizer.safetensors"}) {
    restore();
    std::string bytes = read_bytes(dir + f);
    bytes.back() ^= 1;
    write_bytes(dir + f, bytes);
    const Status s = error();
    EXPECT_EQ(s.code(), Code::kCorrupt);
    EXPECT_EQ(s.message().rfind(dir + f + ": expected CRC-32C \"", 0), 0u) << s.message();
    EXPECT_NE(s.message().find("(per trainer.json), found \""), std::string::npos) << s.message();
    EXPECT_NE(s.message().find("(the file is damaged)"), std::string::npos) << s.message();
  }
  // Another step's file of the same size is caught too.
  restore();
  write_bytes(dir + "/optimizer.safetensors", read_bytes(root + "/step-00000001/optimizer.safetensors"));
  EXPECT_EQ(error().message().rfind(dir + "/optimizer.safetensors: expected CRC-32C", 0), 0u) << error().message();
  // A digit changed inside the trainer object (a loss scale, a data position): its own checksum.
  restore();
  {
    std::string text = read_bytes(dir + "/trainer.json");
    const size_t at = text.find("0.00025");
    ASSERT_NE(at, std::string::npos);
    text.replace(at, 7, "0.00026");
    write_bytes(dir + "/trainer.json", text);
    EXPECT_EQ(error().message().rfind(dir + "/trainer.json: trainer: expected an object whose CRC-32C is \"", 0), 0u)
        << error().message();
  }
  // A version-1 checkpoint (before checksums) still loads.
  restore();
  {
    ordered_json j = ordered_json::parse(read_bytes(dir + "/trainer.json"));
    j["version"] = 1;
    j.erase("files");
    j.erase("trainer_crc32c");
    write_bytes(dir + "/trainer.json", j.dump());
    Result<Checkpoint> old = load_checkpoint(root);
    ASSERT_TRUE(old.is_ok()) << old.status().to_string();
    EXPECT_EQ(old->step, 2);
  }
  restore();
  fs::remove(dir + "/optimizer.safetensors");
  EXPECT_EQ(error().message(),
            dir + "/optimizer.safetensors: expected a readable file, found No such file or directory");

  // trainer.json: truncated at every length, then each field wrong.
  restore();
  const std::string trainer = read_bytes(dir + "/trainer.json");
  for (size_t n = 0; n + 1 < trainer.size(); ++n) {
    write_bytes(dir + "/trainer.json", trainer.substr(0, n));
    Status s = error();
    ASSERT_EQ(s.code(), Code::kCorrupt) << n << ": " << s.to_string();
    ASSERT_EQ(s.message().rfind(dir + "/trainer.json", 0), 0u) << s.message();
  }
  auto trainer_error = [&](const std::string& text) {
    write_bytes(dir + "/trainer.json", text);
    return error().message();
  };
  const std::string t = dir + "/trainer.json";
  EXPECT_EQ(trainer_error("{not json"), t + ": expected well-formed JSON, found a parse error");
  EXPECT_EQ(trainer_error("[]"), t + ": expected a JSON object, found a JSON array");
  EXPECT_EQ(trainer_error(R"({"format": "other"})"),
            t + ": format: expected \"aspen-train-checkpoint\", found \"other\"");
  EXPECT_EQ(trainer_error(R"({"format": "aspen-train-checkpoint", "version": 3})"),
            t + ": version: expected 1 or 2 (what this build reads), found 3");
  EXPECT_EQ(trainer_error(R"({"format": "aspen-train-checkpoint", "version": 1, "step": -2})"),
            t + ": step: expected an integer >= 0, found -2");
  EXPECT_EQ(trainer_error(R"({"format": "aspen-train-checkpoint", "version": 1, "step": 2, "trainer": 5})"),
            t + ": trainer: expected the trainer's JSON object, found 5");
  EXPECT_EQ(trainer_error(R"({"format": "aspen-train-checkpoint", "version": 1, "step": 3, "trainer": {}})"),
            t + ": step: expected 2 (the directory's name), found 3");

  // `latest`: naming a missing directory, holding a path, missing.
  restore();
  write_bytes(root + "/latest", "step-00000099\n");
  Status s = error();
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(), root +
                             "/latest: expected the name of a checkpoint directory beside it, found "
                             "'step-00000099', and there is no directory " +
                             root + "/step-00000099");
  write_bytes(root + "/latest", "../elsewhere\n");
  EXPECT_EQ(error().message(), root +
                                   "/latest: expected one line naming a checkpoint directory beside it (like "
                                   "step-00001200), found \"../elsewhere\\x0a\"");
  fs::remove(root + "/latest");
  s = error();
  EXPECT_EQ(s.code(), Code::kNotFound);
  EXPECT_EQ(s.message(),
            root + "/latest: expected a file naming the checkpoint to load (or, for a step directory, " + root +
                "/trainer.json), found neither (hint: load a step directory, e.g. the newest: " + dir + ")");
  expect_same(*load_checkpoint(dir), step_checkpoint(2));  // the step directory itself still loads
  s = load_checkpoint(d / "nowhere").status();
  EXPECT_EQ(s.code(), Code::kIoError);
  EXPECT_EQ(s.message(),
            d / "nowhere" + ": expected a checkpoint root or step directory, found No such file or directory");
  EXPECT_EQ(list_checkpoints(d / "nowhere").status().code(), Code::kIoError);
}

TEST(Checkpoint, CheckCompatibleListsTheDifferences) {
  const Checkpoint c = step_checkpoint(1);
  TensorTypes weights, optimizer;
  for (const auto& [name, t] : c.weights) weights[name] = {t.dtype(), t.shape()};
  for (const auto& [name, t] : c.optimizer) optimizer[name] = {t.dtype(), t.shape()};
  EXPECT_TRUE(check_compatible(c, weights, optimizer, "runs/a").is_ok());

  TensorTypes w = weights;
  w["transformer.wte.weight"].second = Shape{16, 255};
  Status s = check_compatible(c, w, optimizer, "runs/a");
  EXPECT_EQ(s.code(), Code::kInvalidArgument);
  EXPECT_EQ(s.message(),
            "checkpoint runs/a: parameter 'transformer.wte.weight': expected f32[16, 255], found f32[16, 256]");
  w = weights;
  w["transformer.ln_f.weight"].first = DType::f32;
  EXPECT_EQ(check_compatible(c, w, optimizer, "runs/a").message(),
            "checkpoint runs/a: parameter 'transformer.ln_f.weight': expected f32[1000], found bf16[1000]");
  w = weights;
  w["transformer.h.0.ln_1.bias"] = {DType::f32, Shape{48}};
  EXPECT_EQ(check_compatible(c, w, optimizer, "runs/a").message(),
            "checkpoint runs/a: parameter 'transformer.h.0.ln_1.bias': expected f32[48], found nothing (missing)");
  w = weights;
  w.erase("transformer.ln_f.weight");
  EXPECT_EQ(check_compatible(c, w, optimizer, "runs/a").message(),
            "checkpoint runs/a: parameter 'transformer.ln_f.weight': expected nothing (not in this model), found "
            "bf16[1000]");
  // Several: the first, then how many and the next few.
  w["a"] = {DType::f32, Shape{1}};
  TensorTypes o;
  for (int i = 0; i < 6; ++i) o["optimizer.x" + std::to_string(i)] = {DType::f32, Shape{2}};
  EXPECT_EQ(check_compatible(c, w, o, "runs/a").message(),
            "checkpoint runs/a: parameter 'a': expected f32[1], found nothing (missing) (hint: 10 differences; also "
            "parameter 'transformer.ln_f.weight': expected nothing (not in this model), found bf16[1000]; optimizer "
            "state 'optimizer.exp_avg.transformer.wte.weight': expected nothing (not in this model), found f32[16, "
            "256]; optimizer state 'optimizer.step': expected nothing (not in this model), found f32[]; optimizer "
            "state 'optimizer.x0': expected f32[2], found nothing (missing); ...)");
}

// Runs `child` in a forked process and returns what it wrote to the pipe it is given.
std::string in_child(const std::function<std::string()>& child, int* wait_status) {
  int fds[2];
  ASPEN_CHECK(::pipe(fds) == 0) << "pipe";
  const pid_t pid = ::fork();
  ASPEN_CHECK(pid >= 0) << "fork";
  if (pid == 0) {
    ::close(fds[0]);
    const std::string out = child();
    (void)!::write(fds[1], out.data(), out.size());
    ::_exit(0);
  }
  ::close(fds[1]);
  std::string out;
  char buf[4096];
  for (ssize_t n; (n = ::read(fds[0], buf, sizeof buf)) != 0;) {
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) break;
    out.append(buf, size_t(n));
  }
  ::close(fds[0]);
  ::waitpid(pid, wait_status, 0);
  return out;
}

TEST(Checkpoint, ADiskThatFillsUpLeavesThePreviousCheckpoint) {
  TempDir d;
  const std::string root = d / "run";
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(1)).is_ok());
  const std::string latest = read_bytes(root + "/latest");
  for (const std::string file : {"model.safetensors", "optimizer.safetensors"}) {
    SCOPED_TRACE(file);
    int wait_status = 0;
    const std::string message = in_child(
        [&] {
          // Files may grow to 256 KiB: step 2's `file` needs 1 MiB. EFBIG instead of SIGXFSZ.
          ::signal(SIGXFSZ, SIG_IGN);
          const rlimit limit{256 << 10, 256 << 10};
          ::setrlimit(RLIMIT_FSIZE, &limit);
          Checkpoint big = step_checkpoint(2);
          auto& map = file == "model.safetensors" ? big.weights : big.optimizer;
          map.emplace("big", patterned(DType::f32, Shape{1 << 18}, 5));
          Status s = save_checkpoint(root, big);
          return std::string(code_name(s.code())) + "|" + s.message();
        },
        &wait_status);
    ASSERT_TRUE(WIFEXITED(wait_status) && WEXITSTATUS(wait_status) == 0) << wait_status;
    const std::string prefix = std::string(code_name(Code::kIoError)) + "|save_checkpoint " + root +
                               "/step-00000002: " + root + "/.tmp-step-00000002-";
    EXPECT_EQ(message.rfind(prefix, 0), 0u) << message;
    EXPECT_NE(message.find("/" + file + ": expected writing of '"), std::string::npos) << message;
    EXPECT_NE(message.find("' to succeed, found " + std::string(std::strerror(EFBIG))), std::string::npos) << message;
    EXPECT_EQ(read_bytes(root + "/latest"), latest);
    auto back = load_checkpoint(root);
    ASSERT_TRUE(back.is_ok()) << back.status().to_string();
    expect_same(*back, step_checkpoint(1));
    EXPECT_TRUE(temporaries(root).empty());  // the failed save removed its own
    EXPECT_EQ(*list_checkpoints(root), std::vector<std::string>{root + "/step-00000001"});
  }
}

// NOTE [sigkill test]: a child saves steps k, k+1, ... (every other one twice, to
// kill re-saves too) until the parent kills it after a random delay of up to
// four save times; after each kill `latest` must name a whole checkpoint
// whose every byte is that of its step, and the next child resumes from it.
TEST(Checkpoint, SurvivesSigkillAtAnyMoment) {
  TempDir d;
  const std::string root = d / "run";
  constexpr int64_t kFloats = int64_t(1) << 18;  // 1 MiB of weights, 1 MiB of optimizer state
  const auto t0 = std::chrono::steady_clock::now();
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(0, kFloats)).is_ok());
  const auto save_time = std::chrono::steady_clock::now() - t0;
  std::mt19937 rng(20240611);
  std::uniform_int_distribution<int64_t> delay_us(
      0, std::max<int64_t>(4000, 4 * std::chrono::duration_cast<std::chrono::microseconds>(save_time).count()));
  int64_t last = 0;
  int advanced = 0;
  constexpr int kRounds = 20;
  for (int round = 0; round < kRounds; ++round) {
    const pid_t pid = ::fork();
    ASSERT_GE(pid, 0);
    if (pid == 0) {
      for (int64_t k = last + 1;; ++k) {
        const Checkpoint c = step_checkpoint(k, kFloats);
        if (!save_checkpoint(root, c).is_ok()) ::_exit(3);
        if (k % 2 == 0 && !save_checkpoint(root, c).is_ok()) ::_exit(4);
      }
    }
    std::this_thread::sleep_for(std::chrono::microseconds(delay_us(rng)));
    ::kill(pid, SIGKILL);
    int status = 0;
    ::waitpid(pid, &status, 0);
    ASSERT_TRUE(WIFSIGNALED(status)) << "round " << round << ": the writer exited with " << WEXITSTATUS(status);
    auto c = load_checkpoint(root);
    ASSERT_TRUE(c.is_ok()) << "round " << round << ": " << c.status().to_string();
    ASSERT_GE(c->step, last) << "round " << round;
    expect_same(*c, step_checkpoint(c->step, kFloats));
    if (c->step > last) ++advanced;
    last = c->step;
  }
  EXPECT_GE(advanced, 3) << "too few rounds got a save done before the kill to test much";
  // The next save clears what the killed writers left half done.
  ASSERT_TRUE(save_checkpoint(root, step_checkpoint(last + 1, 16)).is_ok());
  EXPECT_TRUE(temporaries(root).empty());
  EXPECT_EQ(list_checkpoints(root)->size(), 2u);
  std::printf("[          ] %d of %d rounds advanced (to step %lld), save time %.1f ms\n", advanced, kRounds,
              static_cast<long long>(last), std::chrono::duration<double, std::milli>(save_time).count());
}

}  // namespace
}  // namespace aspen::train
