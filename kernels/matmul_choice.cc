// kernels/matmul_choice.cc: choosing a product's backend by measuring it.
//
// NOTE [matmul choice]: the candidates are aspen's own kernels
// (matmul_aspen.cc), oneDNN (or, for bf16 on a CPU without AVX-512, the plan
// that widens to f32: NOTE [bf16 without AVX-512]) and OpenBLAS (f32, its
// OpenMP build only). Each is made into a plan for the shape on the calling
// thread's team, run once to warm up (first-touch of its buffers, oneDNN's
// JIT), then all are run in turns, best time of each kept: turns, so that a
// shared host's drift hits every candidate alike. Inputs are in [-1, 1)
// from a hash (the speed of these kernels does not depend on the values).
//
// Large products are timed on a proxy of the same layout: no operand above
// 2^22 elements (a 6B model's 4096 x 50400 head is timed with 1024 columns,
// not with a copy of its 825 MB), then fewer batch entries and rows (not
// below kProxyRows) so that one run costs about kProxyFlops. The candidates'
// speed per flop has flattened out at those sizes, and GPT-2's LM head (79
// GFLOP) is measured in hundredths of a second a run instead of a second.
//
// The choice (NOTE [matmul choice margin]) is aspen's own kernel unless another candidate is at least
// kMargin (1.5x) faster on the proxy; where the ratio falls within kTie of that margin, the two are timed
// again first. The measurement exists for gaps of 2-6x (Debian's OpenBLAS running SSE3 kernels on a CPU
// it does not know, oneDNN 2.6 weak on large f32 products or without bf16 kernels on an AVX2 CPU); between
// good libraries the gaps are 5-33 % (measured on GPT-2's and the demo's shapes on Zen 3 and Zen 4: oneDNN
// 1.17-1.25x aspen on the demo's small products here), which is where a busy host's noise moves a
// measurement, so a margin there made two fresh caches train to different weights. At 1.5x no product
// seen sits near the margin: the choice is the same on every measurement of one machine, and the run's
// bits stop depending on which backend won a timing race. aspen's kernel is the preferred one because its
// results do not depend on the team size (NOTE [whole k]): a layout that runs a product on 1 thread per
// device and another on 2 threads get the same bits. It is remembered per shape (not per team size: a
// product runs on one backend whatever team runs it, for the same reason) for the process and saved
// beside the executable cache in a file named after this CPU's identity, so the same machine keeps
// running the same code across compiles and runs; a training run also keeps its choices in its
// checkpoints (api/trainer.cc), so a resumed run takes them whatever the cache holds. Measuring costs,
// for GPT-2 124M's training step (about 20 distinct products), about a second once per machine.
#include "kernels/matmul_choice.h"

#include <cblas.h>
#include <omp.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>
#include <mutex>
#include <optional>
#include <set>
#include <sstream>
#include <tuple>

#include <dnnl.hpp>

#include "core/atomic_file.h"
#include "core/check.h"
#include "core/checksum.h"
#include "core/file.h"
#include "core/log.h"
#include "kernels/convert.h"
#include "kernels/cpu.h"
#include "kernels/matmul_backend.h"

namespace aspen::kernels {

namespace {

// NOTE [matmul choice cost]: the margin (1.5x) needs no fine timing, so a proxy of about 1 GFLOP timed for
// about 30 ms per candidate decides; the first compile of GPT-J-6B's training step on a new machine
// (measuring every product, with operands of at most 2^22 elements) went from 4.4 s to 1.0 s with it
// (2-core Zen 4; `aspen bench compile` with a fresh ASPEN_CACHE_DIR).
constexpr double kProxyFlops = 1e9;
constexpr int64_t kProxyRows = 256;
constexpr double kMaxOperand = double(1 << 22);  // elements: 16 MiB of f32 (NOTE [matmul choice cost])
constexpr int64_t kMinExtent = 1024;
constexpr int kMinRounds = 2, kMaxRounds = 20;
constexpr double kMargin = 1.5;  // NOTE [matmul choice margin]: how much faster than aspen's kernel a library must be
constexpr double kTie = 0.05;     // a ratio this close to the margin is timed again
constexpr double kRoundsSeconds = 0.03;  // aim for this long per candidate once warm (NOTE [matmul choice cost])

std::atomic<int> g_choice{int(MatmulChoice::measured)};

using Key = std::tuple<int64_t, int64_t, int64_t, int64_t, bool, bool, bool, bool, bool, bool, int>;
Key key_of(const MatmulShape& s) {
  return {s.batch,     s.M,         s.N,           s.K,           s.trans_a, s.trans_b, s.broadcast_b,
          s.b_fixed, s.has_bias, s.beta != 0.0f, int(s.input)};
}

struct Choice {
  MatmulBackend backend;
  std::string origin;  // where it came from: "measured", a file's path, or what adopt_matmul_choices was told
};

struct Store {
  std::mutex mu;              // guards choices, used and changed
  std::mutex measuring;       // one measurement at a time
  std::map<Key, Choice> choices;
  std::set<Key> used;  // the products planned since the last clear_matmul_choices_used (their choices above)
  bool changed = false;
  std::string autosave;       // use_matmul_choices_file's path, or empty
  bool autosave_failed = false;
};
Store& store() {
  static Store* s = new Store;  // leaked: plans may be made from threads still running at exit
  return *s;
}

double now() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

// The proxy timed for `s` (NOTE [matmul choice]): no operand above
// kMaxOperand elements (the larger of N and K halved first, not below
// kMinExtent; then the batch, then the rows), and about kProxyFlops of work.
MatmulShape proxy_of(MatmulShape s) {
  const auto b_elements = [&] { return double(s.K) * double(s.N); };
  while (b_elements() > kMaxOperand && std::max(s.N, s.K) > kMinExtent) {
    int64_t& e = s.N >= s.K ? s.N : s.K;
    e = std::max(kMinExtent, e / 2);
  }
  const auto rows_elements = [&] { return double(s.batch) * double(s.M) * double(std::max(s.K, s.N)); };
  while (rows_elements() > kMaxOperand && (s.batch > 1 || s.M > kProxyRows)) {
    if (s.batch > 1) {
      s.batch = (s.batch + 1) / 2;
    } else {
      s.M = std::max(kProxyRows, s.M / 2);
    }
  }
  if (s.flops() <= kProxyFlops) return s;
  s.batch = std::max<int64_t>(1, int64_t(double(s.batch) * kProxyFlops / s.flops()));
  if (s.flops() > kProxyFlops && s.M > kProxyRows)
    s.M = std::max(kProxyRows, int64_t(double(s.M) * kProxyFlops / s.flops()));
  return s;
}

// Values in [-1, 1) from a multiplicative hash: the kernels' speed does not
// depend on them (no denormals), and filling a proxy's operands costs
// nothing next to timing it.
void fill(std::vector<float>& v, uint32_t seed) {
  for (size_t i = 0; i < v.size(); ++i)
    v[i] = float(int32_t((uint32_t(i) + seed) * 2654435761u)) * (1.0f / 2147483648.0f);
}

// NOTE [matmul choice margin]: the backend kept unless another is kMargin faster.
constexpr MatmulBackend kPreferred = MatmulBackend::aspen;

std::vector<MatmulBackend> candidates(const MatmulShape& s) {
  std::vector<MatmulBackend> out = {kPreferred, MatmulBackend::onednn};  // the preferred one first
  if (s.input == DType::f32 && openblas_is_openmp_build()) out.push_back(MatmulBackend::openblas);
  return out;
}

const char* const kFileMagic = "aspen matmul choices 3";  // 3: no team size (a choice holds for every team)
const char* const kOldFileMagic = "aspen matmul choices 2";  // per team size: measured again

}  // namespace

const char* matmul_choice_name(MatmulChoice c) { return c == MatmulChoice::rule ? "rule" : "measured"; }
MatmulChoice matmul_choice() { return MatmulChoice(g_choice.load(std::memory_order_relaxed)); }
MatmulChoice set_matmul_choice(MatmulChoice c) { return MatmulChoice(g_choice.exchange(int(c))); }

Result<std::vector<MatmulTiming>> measure_matmul_backends(const MatmulShape& shape) {
  const MatmulShape s = proxy_of(shape);
  std::vector<MatmulBackend> backends;
  std::vector<MatmulPlan> plans;
  for (MatmulBackend be : candidates(s)) {
    auto plan = MatmulPlan::create(s, be);
    if (!plan.is_ok()) continue;  // this backend cannot run the shape (e.g. cblas' int extents)
    backends.push_back(be);
    plans.push_back(std::move(plan).value());
  }
  if (plans.empty()) return Status::error(Code::kUnimplemented, "matmul " + shape.to_string(), "a backend that runs it", "none");
  std::vector<float> af(size_t(s.a_elements())), bf(size_t(s.b_elements())), bias(size_t(s.N)),
      c(size_t(s.c_elements()), 0.0f);
  fill(af, 11);
  fill(bf, 12);
  fill(bias, 13);
  std::vector<bf16> ab, bb;
  const void *a = af.data(), *b = bf.data();
  if (s.input == DType::bf16) {
    ab.resize(af.size());
    bb.resize(bf.size());
    ASPEN_RETURN_IF_ERROR(convert_f32_to_bf16(af, ab, int64_t(af.size())));
    ASPEN_RETURN_IF_ERROR(convert_f32_to_bf16(bf, bb, int64_t(bf.size())));
    a = ab.data();
    b = bb.data();
  }
  std::vector<double> best(plans.size(), 1e30);
  double slowest = 0;
  for (size_t i = 0; i < plans.size(); ++i) {
    const double t0 = now();
    plans[i].run(a, b, bias.data(), c.data());
    slowest = std::max(slowest, now() - t0);
  }
  const int rounds = std::clamp(int(kRoundsSeconds / std::max(slowest, 1e-7)), kMinRounds, kMaxRounds);
  const auto time_rounds = [&](const std::vector<size_t>& which, int n) {
    for (int r = 0; r < n; ++r)
      for (size_t i : which) {
        const double t0 = now();
        plans[i].run(a, b, bias.data(), c.data());
        best[i] = std::min(best[i], now() - t0);
      }
  };
  std::vector<size_t> all(plans.size());
  for (size_t i = 0; i < all.size(); ++i) all[i] = i;
  time_rounds(all, rounds);
  // A ratio near the margin (NOTE [matmul choice margin]) is what a noisy moment decides: the preferred
  // candidate (the first) and the fastest other run as many rounds again, and the choice, which this
  // machine then keeps, is made on both sets.
  if (all.size() >= 2) {
    size_t other = 1;  // (candidates() lists the preferred backend first)
    for (size_t i = 2; i < all.size(); ++i)
      if (best[i] < best[other]) other = i;
    const double ratio = best[0] / best[other];
    if (std::fabs(ratio / kMargin - 1.0) < kTie) time_rounds({0, other}, rounds);
  }
  std::vector<MatmulTiming> out;
  for (size_t i = 0; i < plans.size(); ++i) out.push_back({backends[i], s.flops() / best[i] / 1e9});
  std::stable_sort(out.begin(), out.end(), [](const MatmulTiming& x, const MatmulTiming& y) { return x.gflops > y.gflops; });
  return out;
}

MatmulBackend decide_matmul_backend(const std::vector<MatmulTiming>& timings) {
  ASPEN_CHECK(!timings.empty());
  const MatmulTiming* preferred = &timings.front();
  for (const MatmulTiming& t : timings)
    if (t.backend == kPreferred) preferred = &t;
  const MatmulTiming& fastest = timings.front();  // measure_matmul_backends sorts them
  return fastest.gflops >= preferred->gflops * kMargin ? fastest.backend : preferred->backend;
}

Result<MatmulBackend> choose_matmul_backend(const MatmulShape& s, int team) {
  // The rule first: remembered choices (loaded from this machine's file, or adopted from process 0)
  // are measurements, which --kernel-choice rule turns off.
  if (matmul_choice() == MatmulChoice::rule) return matmul_backend_for(s, team);
  Store& st = store();
  const Key key = key_of(s);
  const auto remembered = [&]() -> std::optional<MatmulBackend> {
    std::lock_guard<std::mutex> lock(st.mu);
    auto it = st.choices.find(key);
    if (it == st.choices.end()) return std::nullopt;
    st.used.insert(key);
    return it->second.backend;
  };
  if (auto b = remembered()) return *b;
  std::lock_guard<std::mutex> measuring(st.measuring);
  if (auto b = remembered()) return *b;  // another thread may have measured it meanwhile
  ASPEN_ASSIGN_OR_RETURN(std::vector<MatmulTiming> timings, measure_matmul_backends(s));
  const MatmulBackend chosen = decide_matmul_backend(timings);
  std::string autosave;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    st.choices[key] = {chosen, "measured"};
    st.used.insert(key);
    st.changed = true;
    autosave = st.autosave;
  }
  ASPEN_LOG(info) << "matmul " << s.to_string() << " on " << team << " thread(s): " << [&] {
    std::string t;
    for (const MatmulTiming& m : timings)
      t += std::string(t.empty() ? "" : ", ") + matmul_backend_name(m.backend) + " " +
           std::to_string(int64_t(m.gflops)) + " GFLOP/s";
    return t + " -> " + matmul_backend_name(chosen);
  }();
  if (!autosave.empty()) {
    std::error_code ec;
    std::filesystem::create_directories(std::filesystem::path(autosave).parent_path(), ec);
    if (Status w = save_matmul_choices(autosave); !w.is_ok()) {
      std::lock_guard<std::mutex> lock(st.mu);
      if (!st.autosave_failed) ASPEN_LOG(warning) << "matmul choices not kept: " << w.message();
      st.autosave_failed = true;
    }
  }
  return chosen;
}

namespace {
std::string onednn_version() {
  const dnnl_version_t* dv = dnnl_version();
  return std::to_string(dv->major) + "." + std::to_string(dv->minor) + "." + std::to_string(dv->patch);
}

// Raised whenever aspen's own kernels change speed (a new variant, another
// split among threads): remembered choices measured against the old ones are
// then measured again, since the identity names the choices file.
constexpr int kAspenGemmRevision = 5;  // 4: the next fixed-B panel prefetched; 5: NOTE [whole k]

std::string detect_cpu_identity() {
  unsigned regs[2][4] = {};
  for (unsigned leaf = 0; leaf < 2; ++leaf)
    __asm__("cpuid" : "=a"(regs[leaf][0]), "=b"(regs[leaf][1]), "=c"(regs[leaf][2]), "=d"(regs[leaf][3])
            : "a"(leaf), "c"(0));
  char vendor[13] = {};
  std::memcpy(vendor, &regs[0][1], 4);
  std::memcpy(vendor + 4, &regs[0][3], 4);
  std::memcpy(vendor + 8, &regs[0][2], 4);
  const unsigned eax = regs[1][0];
  const unsigned base_family = (eax >> 8) & 0xf, ext_family = (eax >> 20) & 0xff;
  const unsigned family = base_family == 0xf ? base_family + ext_family : base_family;
  const unsigned model = (base_family == 0x6 || base_family == 0xf) ? (((eax >> 16) & 0xf) << 4 | ((eax >> 4) & 0xf))
                                                                     : ((eax >> 4) & 0xf);
  std::ostringstream o;
  o << vendor << " family " << family << " model " << model << " stepping " << (eax & 0xf) << "; "
    << cpu_features().to_string() << "; " << cpu_caches().to_string() << "; OpenBLAS " << openblas_get_corename()
    << "; oneDNN " << onednn_version() << "; aspen gemm " << kAspenGemmRevision;
  return o.str();
}
}  // namespace

// Fixed for the process: every input is read once (the ISA cap does not enter it).
std::string cpu_identity() {
  static const std::string id = detect_cpu_identity();
  return id;
}

std::string onednn_description() {
  const char* isa = "?";
  switch (dnnl::get_effective_cpu_isa()) {
    case dnnl::cpu_isa::sse41: isa = "sse41"; break;
    case dnnl::cpu_isa::avx: isa = "avx"; break;
    case dnnl::cpu_isa::avx2: isa = "avx2"; break;
    case dnnl::cpu_isa::avx512_core: isa = "avx512_core"; break;
    case dnnl::cpu_isa::avx512_core_vnni: isa = "avx512_core_vnni"; break;
    case dnnl::cpu_isa::avx512_core_bf16: isa = "avx512_core_bf16"; break;
    case dnnl::cpu_isa::avx512_core_amx: isa = "avx512_core_amx"; break;
    default: break;
  }
  return "oneDNN " + onednn_version() + " (kernels for " + isa + ")";
}

namespace {
// OpenBLAS cores older than AVX2 (their sgemm is SSE or AVX at best).
constexpr const char* kOldCores[] = {"Prescott", "Core2",      "Penryn",   "Dunnington", "Nehalem",
                                     "Atom",     "Katmai",     "Coppermine", "Northwood", "Banias",
                                     "Opteron",  "Barcelona",  "Bobcat",   "Sandybridge", "Bulldozer",
                                     "Piledriver", "Steamroller", "Excavator"};
}  // namespace

const char* openblas_core_override(const std::string& corename, const CpuFeatures& f) {
  const bool old = std::any_of(std::begin(kOldCores), std::end(kOldCores), [&](const char* c) { return corename == c; });
  const bool avx2_era = corename == "Haswell" || corename == "Zen";
  const bool avx512 = f.avx512f && f.avx512bw && f.avx512vl && f.avx512dq;
  if (avx512 && (old || avx2_era)) return f.avx512_bf16 ? "Cooperlake" : "SkylakeX";
  if (old && f.avx2 && f.fma) return "Haswell";
  return nullptr;
}

const char* openblas_core_override() { return openblas_core_override(openblas_get_corename(), cpu_features()); }

std::string library_kernels_warning() {
  const std::string core = openblas_get_corename();
  if (const char* better = openblas_core_override(core, cpu_features()))
    return "OpenBLAS runs its " + core + " kernels, older than this CPU (best ISA " + isa_name(cpu_features().best) +
           "): it does not recognise the model, and its products run several times slower than they could. The "
           "aspen command sets OPENBLAS_CORETYPE=" + better + " for itself (unless it is set); a program using the "
           "library can set it before OpenBLAS loads. aspen measures every product and avoids slow ones either way.";
  return "";
}

std::string cpu_identity_digest() {
  const std::string id = cpu_identity();
  return hex_digits(uint64_t(crc32c(id)) << 32 | crc32c(id, 0x9e3779b9u), 16);
}

std::string matmul_choices_path(const std::string& dir) {
  return dir + "/matmul-choices-" + cpu_identity_digest() + ".txt";
}

namespace {

// The file's text of the choices of `keys` (all when null); st.mu held.
std::string text_of(const Store& st, const std::set<Key>* keys) {
  std::ostringstream o;
  o << kFileMagic << "\ncpu " << cpu_identity() << "\n";
  for (const auto& [k, choice] : st.choices) {
    if (keys && !keys->count(k)) continue;
    const auto& [batch, M, N, K, ta, tb, bcast, fixed, bias, beta, input] = k;
    o << batch << " " << M << " " << N << " " << K << " " << ta << " " << tb << " " << bcast << " " << fixed << " "
      << bias << " " << beta << " " << dtype_name(DType(input)) << " " << matmul_backend_name(choice.backend) << "\n";
  }
  return o.str();
}

std::string choices_text(Store& st, bool mark_saved) {
  std::lock_guard<std::mutex> lock(st.mu);
  if (mark_saved) st.changed = false;
  return text_of(st, nullptr);
}

// Parses a choices file's text; with `check_cpu`, one written for another CPU identity is refused.
Result<std::map<Key, MatmulBackend>> parse_choices(const std::string& text, const std::string& subject, bool check_cpu) {
  std::istringstream in(text);
  std::string line;
  const auto bad = [&](const std::string& expected, const std::string& found) {
    return Status::invalid_argument(subject, expected, found);
  };
  const bool got_line = bool(std::getline(in, line));
  if (got_line && line == kOldFileMagic) return std::map<Key, MatmulBackend>{};  // per team size: measured again
  if (!got_line || line != kFileMagic) return bad(std::string("first line '") + kFileMagic + "'", "'" + line + "'");
  const std::string id = cpu_identity();
  if (!std::getline(in, line) || line.rfind("cpu ", 0) != 0 || (check_cpu && line != "cpu " + id))
    return bad("choices for this CPU (" + id + ")", "'" + line + "' (measuring again)");
  std::map<Key, MatmulBackend> read;
  for (int n = 3; std::getline(in, line); ++n) {
    if (line.empty()) continue;  // a blank line (a handed-over text is padded to an even length)
    std::istringstream f(line);
    int64_t batch, M, N, K;
    int ta, tb, bcast, fixed, bias, beta;
    std::string dtype, backend, extra;
    if (!(f >> batch >> M >> N >> K >> ta >> tb >> bcast >> fixed >> bias >> beta >> dtype >> backend) ||
        (f >> extra))
      return bad("line " + std::to_string(n) + ": batch M N K trans_a trans_b broadcast_b fixed_b bias beta dtype backend",
                 "'" + line + "'");
    const DType dt = dtype == "bf16" ? DType::bf16 : DType::f32;
    if ((dtype != "f32" && dtype != "bf16") || batch < 1 || M < 1 || N < 1 || K < 1)
      return bad("line " + std::to_string(n) + ": positive extents, dtype f32 or bf16", "'" + line + "'");
    bool known = false;
    MatmulBackend be = MatmulBackend::onednn;
    for (MatmulBackend b : {MatmulBackend::onednn, MatmulBackend::openblas, MatmulBackend::aspen})
      if (backend == matmul_backend_name(b)) be = b, known = true;
    if (!known) return bad("line " + std::to_string(n) + ": backend oneDNN, OpenBLAS or aspen", "'" + backend + "'");
    const MatmulShape s{.batch = batch,
                        .M = M,
                        .N = N,
                        .K = K,
                        .trans_a = ta != 0,
                        .trans_b = tb != 0,
                        .broadcast_b = bcast != 0,
                        .has_bias = bias != 0,
                        .beta = beta ? 1.0f : 0.0f,
                        .input = dt,
                        .b_fixed = fixed != 0};
    read[key_of(s)] = be;
  }
  return read;
}

}  // namespace

Status save_matmul_choices(const std::string& path) { return write_file_atomic(path, choices_text(store(), true)); }

Status load_matmul_choices(const std::string& path) {
  auto text = read_regular_file(path, 1 << 24);
  if (!text.is_ok()) return text.status().code() == Code::kNotFound ? Status() : text.status();
  ASPEN_ASSIGN_OR_RETURN(auto read, parse_choices(*text, "matmul choices " + path, true));
  Store& st = store();
  std::lock_guard<std::mutex> lock(st.mu);
  for (const auto& [k, be] : read) st.choices.emplace(k, Choice{be, path});  // a choice made in this process stays
  return Status();
}

std::string matmul_choices_text() { return choices_text(store(), false); }

Result<bool> adopt_matmul_choices(const std::string& text, const std::string& origin) {
  ASPEN_ASSIGN_OR_RETURN(auto read, parse_choices(text, "matmul choices from " + origin, false));
  Store& st = store();
  bool changed = false;
  {
    std::lock_guard<std::mutex> lock(st.mu);
    for (const auto& [k, be] : read) {
      auto [it, added] = st.choices.emplace(k, Choice{be, origin});
      if (!added && it->second.backend != be) {
        it->second = {be, origin};
        changed = true;
      }
      if (added) st.changed = true;
    }
    if (changed) st.changed = true;
  }
  return changed;
}

Status use_matmul_choices_file(const std::string& path) {
  {
    std::lock_guard<std::mutex> lock(store().mu);
    store().autosave = path;
    store().autosave_failed = false;
  }
  return load_matmul_choices(path);
}

size_t matmul_choices_count() {
  std::lock_guard<std::mutex> lock(store().mu);
  return store().choices.size();
}

bool matmul_choices_changed() {
  std::lock_guard<std::mutex> lock(store().mu);
  return store().changed;
}

void clear_matmul_choices() {
  std::lock_guard<std::mutex> lock(store().mu);
  store().choices.clear();
  store().used.clear();
  store().changed = false;
}

void clear_matmul_choices_used() {
  std::lock_guard<std::mutex> lock(store().mu);
  store().used.clear();
}

std::string matmul_choices_used_text() {
  Store& st = store();
  std::lock_guard<std::mutex> lock(st.mu);
  return text_of(st, &st.used);
}

std::string matmul_choices_used_summary() {
  Store& st = store();
  std::lock_guard<std::mutex> lock(st.mu);
  if (st.used.empty()) return "no matrix products";
  std::map<std::string, int> by_backend, by_origin;
  for (const Key& k : st.used) {  // every used key has its choice (both are cleared together)
    const Choice& c = st.choices.at(k);
    ++by_backend[matmul_backend_name(c.backend)];
    ++by_origin[c.origin];
  }
  std::string out = std::to_string(st.used.size()) + " matrix product shape" + (st.used.size() > 1 ? "s" : "") + " (";
  bool first = true;
  for (const auto& [name, n] : by_backend) out += (first ? "" : ", ") + std::to_string(n) + " on " + name, first = false;
  out += "; ";
  first = true;
  for (const auto& [origin, n] : by_origin) {
    out += (first ? "" : ", ") + std::to_string(n) + (origin == "measured" ? " measured now" : " from " + origin);
    first = false;
  }
  return out + ")";
}

}  // namespace aspen::kernels
