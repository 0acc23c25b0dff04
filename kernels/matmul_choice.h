// kernels/matmul_choice.h: which backend runs a product, chosen by measuring
// the candidates on the machine that runs them (NOTE [matmul choice] in
// matmul_choice.cc).
//
// A library that is fastest on one CPU was 3-6x slower on the next (Debian's
// OpenBLAS runs SSE3 kernels on a Xeon it does not recognise; oneDNN 2.6 is
// weak on large f32 products), so no fixed rule can pick: the first plan of
// each distinct product (shape, layout, dtype) times aspen's own kernels,
// oneDNN and OpenBLAS on that shape and keeps aspen's unless another is at
// least 1.5x faster (NOTE [matmul choice margin]: the 5-33 % differences
// between good libraries are left to no noisy moment, and aspen's results do
// not depend on the team size). The choice holds for every team size, is
// remembered for the process, and in a file keyed by this CPU's identity (save/load below; the compiler's
// executable cache and the CLI keep one), so a second compile measures
// nothing and, on the same machine, runs the same code: the same bits. A
// training run keeps the choices it used in its checkpoints and adopts them
// on resume (matmul_choices_used_text, adopt_matmul_choices).
//
// set_matmul_choice(MatmulChoice::rule) turns measuring off: every plan then
// takes matmul_backend_for's fixed rule, the same on every machine (for
// results that must not depend on which machine compiled them).
//
// Thread-safety: every function may be called from any thread; measurements
// run one at a time (a second thread asking for a product being measured
// waits for it, and two measurements never share the cores).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "core/status.h"
#include "kernels/cpu.h"
#include "kernels/matmul.h"

namespace aspen::kernels {

enum class MatmulChoice : uint8_t { measured, rule };
const char* matmul_choice_name(MatmulChoice choice);  // "measured", "rule"
MatmulChoice matmul_choice();
// Returns the previous setting.
MatmulChoice set_matmul_choice(MatmulChoice choice);

// One candidate's measured rate on a product.
struct MatmulTiming {
  MatmulBackend backend;
  double gflops = 0;
};

// The backend MatmulPlan::create(shape) uses on a team of `team_size`
// threads (the calling thread's OpenMP team when measuring): with the rule,
// the rule's (remembered choices ignored); measured, the remembered choice,
// else decide_matmul_backend of the candidates measured now, remembered.
Result<MatmulBackend> choose_matmul_backend(const MatmulShape& shape, int team_size);
// The choice among measured candidates (fastest first, as measured below):
// aspen's own kernel unless the fastest is at least 1.5x faster than it.
MatmulBackend decide_matmul_backend(const std::vector<MatmulTiming>& timings);

// Times every backend that can run `shape` on the calling thread's team, best
// of several interleaved runs on random inputs; fastest first. Products above
// a few GFLOP are timed on a proxy with fewer rows (NOTE [matmul choice]).
Result<std::vector<MatmulTiming>> measure_matmul_backends(const MatmulShape& shape);

// What names this machine for the choices: CPU vendor, family, model,
// stepping and features, its caches, and the kernels each library runs.
std::string cpu_identity();
// What `aspen info` prints: oneDNN's version and the ISA it dispatches to;
// aspen's GEMM variant and blocking here; and a warning (empty when none) when
// a library runs kernels older than this CPU supports (Debian's OpenBLAS on a
// CPU model it does not know falls back to its SSE3 "Prescott" kernels).
std::string onednn_description();
std::string aspen_gemm_description();
std::string library_kernels_warning();
// NOTE [openblas core]: the OPENBLAS_CORETYPE that makes an OpenBLAS which
// detected `corename` run the newest kernels `features` allow, when that
// detection fell back to kernels older than the CPU (Debian's 0.3.21 runs its
// SSE3 "Prescott" kernels on the Xeon model 207: 3-4x slower products);
// null when the detection is right. OpenBLAS reads the variable once, when it
// is loaded, so the CLI sets it and re-executes itself (tools/aspen.cc).
const char* openblas_core_override(const std::string& corename, const CpuFeatures& features);
const char* openblas_core_override();  // this process' OpenBLAS and CPU
// 16 hex digits of a hash of cpu_identity(): the choices file's name.
std::string cpu_identity_digest();

// The remembered choices. load merges a file written by save on this machine
// (a missing file is fine; one written for another CPU identity is skipped
// and says so in the status' message); save writes them atomically.
[[nodiscard]] Status load_matmul_choices(const std::string& path);
[[nodiscard]] Status save_matmul_choices(const std::string& path);
// The remembered choices as save writes them; and adopting another
// process' (any CPU identity), replacing this one's where they differ.
// Returns whether any choice this process had was replaced (plans made with
// the old ones are then stale). The processes of one MPI job take process
// 0's this way, so that they all run the same kernels (train/runner.cc), and
// a resumed training run its checkpoint's (api/trainer.cc). `origin` names
// the source in errors and in matmul_choices_used_summary.
std::string matmul_choices_text();
Result<bool> adopt_matmul_choices(const std::string& text, const std::string& origin);
// The choices plans took since the last clear_matmul_choices_used (or
// clear_matmul_choices), in save's format: what a run used, to keep with it.
std::string matmul_choices_used_text();
// The same in words: "14 matrix product shapes (12 on aspen, 2 on oneDNN;
// 3 measured now, 11 from ~/.cache/aspen/matmul-choices-....txt)".
std::string matmul_choices_used_summary();
void clear_matmul_choices_used();
// Loads `path` (as load_matmul_choices) and from then on saves every new
// choice to it as soon as it is made, so a run killed after compiling still
// leaves them for the next (a resumed training run must take the same
// kernels to continue bit for bit). A failure to save is logged once.
[[nodiscard]] Status use_matmul_choices_file(const std::string& path);
// "matmul-choices-<cpu_identity_digest()>.txt" inside `dir`.
std::string matmul_choices_path(const std::string& dir);
size_t matmul_choices_count();
// Choices made (measured) since the last load or save: whether saving has anything new.
bool matmul_choices_changed();
void clear_matmul_choices();  // tests

}  // namespace aspen::kernels
