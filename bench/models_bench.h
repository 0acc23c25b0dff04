// bench/models_bench.h: `aspen bench models`.
//
// Runs bench/models.py (models as users hold them: torchvision resnet18, the MNIST tutorial's CNN, an LSTM
// classifier, a small ViT, each passed to the aspen package as the torch module) with `--python`'s
// interpreter, the build tree's aspen package first on its path, and passes its lines through. The
// script is Python because its peer and its inputs are PyTorch modules; docs/bench.md describes the rows.
#pragma once

#include <ostream>
#include <string>

#include "core/status.h"

namespace aspen::bench {

struct ModelsBenchOptions {
  std::string python = "python3";  // an interpreter with torch, torchvision and transformers
  int threads = 2;
  int rounds = 5;
  bool json = false;
  bool quick = false;     // one round of the MNIST CNN (a smoke test)
  bool compile = false;   // also torch.compile (minutes of first calls)
  bool batch_norm = false;  // also resnet18 with its batch norms training
};

Status run_models_bench(const ModelsBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
