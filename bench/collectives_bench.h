// bench/collectives_bench.h: `aspen bench collectives`.
//
// All-reduce (f32 sum, in place) of 1, 16 and 64 MiB among 2 and 4 devices:
// the threads backend (one thread per device in this process), the mpi
// backend (one process per device), and plain MPI_Allreduce on the same
// buffers in the same processes (backend "mpi_reference"). Reports algbw =
// bytes / time and busbw = algbw · 2(n-1)/n (the bytes each device must move
// in and out of an optimal all-reduce, per second), and each backend's ratio
// to mpi_reference at the same size and device count.
//
// MPI: run outside mpirun, the bench re-launches itself as
// `mpirun [--allow-run-as-root] --oversubscribe -np N aspen bench collectives
// --mpi-child ...` for each N and reads the child's JSON lines; run under
// mpirun (`mpirun -np 4 aspen bench collectives`), it measures the MPI
// backends on the job it is in (threads too, on rank 0). docs/bench.md.
#pragma once

#include <cstdint>
#include <ostream>
#include <string>
#include <vector>

#include "core/status.h"

namespace aspen::bench {

struct CollectivesBenchOptions {
  std::vector<int> devices = {2, 4};
  std::vector<int64_t> mib = {1, 16, 64};
  bool json = false;
  bool quick = false;       // 1 MiB, 2 devices, few repetitions: a smoke test
  bool mpi = true;          // measure the MPI backends (when built with MPI)
  std::string mpirun = "mpirun";
  bool mpi_child = false;   // internal: this process is one rank of the re-launched job
};

Status run_collectives_bench(const CollectivesBenchOptions& options, std::ostream& out);

}  // namespace aspen::bench
