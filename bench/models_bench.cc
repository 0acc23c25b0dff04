#include "bench/models_bench.h"

#include <sys/stat.h>
#include <sys/wait.h>

#include <fmt/format.h>

#include <cstdio>
#include <memory>
#include <nlohmann/json.hpp>

#include "bench/common.h"

namespace aspen::bench {

Status run_models_bench(const ModelsBenchOptions& o, std::ostream& out) {
  const std::string script = std::string(ASPEN_SOURCE_DIR) + "/bench/" + o.script;
  const std::string what = "aspen bench " + o.script.substr(0, o.script.find('.'));
  struct stat st;
  if (::stat(script.c_str(), &st) != 0)
    return Status::error(Code::kNotFound, "bench/" + o.script, "the script beside aspen's sources", script + " is missing");
  std::string env;
  const std::string package = ASPEN_PYTHON_DIR;  // the build tree's package; an installed one is found anyway
  if (!package.empty() && ::stat((package + "/aspen").c_str(), &st) == 0) {
    const char* old = std::getenv("PYTHONPATH");
    env = "PYTHONPATH='" + package + (old && *old ? std::string(":") + old : std::string()) + "' ";
  }
  std::string cmd = env + o.python + " " + script + " --threads " + std::to_string(o.threads) + " --rounds " +
                    std::to_string(o.rounds);
  if (o.json) cmd += " --json";
  if (o.quick) cmd += " --quick";
  if (o.compile) cmd += " --compile";
  if (o.batch_norm) cmd += " --batch-norm";
  // NOTE [guarded rows]: the script interleaves aspen and PyTorch per row itself; the FMA peak before and after
  // the whole run says whether the host moved under it.
  const double before = o.quick ? 0.0 : measure_f32_fma_peak(o.threads);
  std::unique_ptr<FILE, int (*)(FILE*)> p(::popen((cmd + " 2>&1").c_str(), "r"), ::pclose);
  if (!p) return Status::error(Code::kIoError, what, "to start " + o.python, "popen failed");
  char line[4096];
  while (std::fgets(line, sizeof line, p.get())) out << line << std::flush;
  const int rc = ::pclose(p.release());
  if (rc != 0)
    return Status::error(Code::kFailedPrecondition, what, o.python + " " + script + " to exit 0",
                         "exit status " + std::to_string(WIFEXITED(rc) ? WEXITSTATUS(rc) : -1) +
                             " (its output is above; --python names an interpreter with torch, torchvision and "
                             "transformers)");
  if (o.quick) return Status();
  const double after = measure_f32_fma_peak(o.threads);
  const bool moved = ceiling_moved(before, after);
  if (o.json)
    out << nlohmann::ordered_json({{"bench", o.script.substr(0, o.script.find('.')) + "_guard"},
                                   {"peak_gflops_before", before},
                                   {"peak_gflops_after", after},
                                   {"disturbed", moved}})
               .dump()
        << "\n";
  else
    out << fmt::format("# FMA peak {:.0f} GFLOP/s before the run, {:.0f} after{}\n", before, after,
                       moved ? ": DISTURBED (moved by more than 5 %: run again for figures to quote)" : "");
  return Status();
}

}  // namespace aspen::bench
