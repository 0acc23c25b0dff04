// bench/models_bench.h: `aspen bench models` and `aspen bench poptorch`.
//
// Runs bench/models.py (models as users hold them: torchvision resnet18, the MNIST tutorial's CNN, an LSTM
// classifier, a small ViT, each passed to the aspen package as the torch module) or bench/poptorch.py
// (training loops shaped like PopTorch's tutorials, data loader included, through aspen.poptorch) with
// `--python`'s interpreter, the build tree's aspen package first on its path, and passes its lines through.
// The scripts are Python because their peers and inputs are PyTorch's; docs/bench.md describes the rows.
#pragma once

#include <ostream>
#include <string>

#include "core/status.h"

namespace aspen::bench {

struct ModelsBenchOptions {
  std::string script = "models.py";  // in bench/: models.py or poptorch.py
  std::string python = "python3";  // an interpreter with torch, torchvision and transformers
  int threads = 2;
  int rounds = 5;
  bool json = false;
  bool quick = false;     // one round of the MNIST CNN (a smoke test)
  bool compile = false;   // also torch.compile (minutes of first calls)
  bool batch_norm = false;  // also resnet18 with its batch norms training (models.py only)
};

Status run_models_bench(const ModelsBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
