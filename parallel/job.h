// parallel/job.h: the processes of a job, in every build. The one place above
// parallel/mpi/ that knows whether this build has MPI: the trainer, the
// training runtime and the CLI ask here, so nothing above parallel/ carries
// `#ifdef ASPEN_HAVE_MPI`.
//
// A build without MPI answers as a job of one process that was not launched
// by mpirun; asking it for the job's groups gives Unimplemented naming what
// wanted them and how to get MPI (scripts/install-deps.sh installs OpenMPI).
//
// Thread-safety: init and finalize once per process, from one thread; the
// groups as parallel/mpi/mpi_communicator.h's.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "core/status.h"
#include "parallel/communicator.h"
#include "parallel/transport.h"

namespace aspen::parallel::job {

// This build can run a job of several processes (it was built with MPI).
bool available();
// This process was started by mpirun/mpiexec (false without MPI).
bool launched();
// Joins the job (MPI_Init once, MPI_THREAD_MULTIPLE; safe to call again).
// `what` names the work that needs it in the error of a build without MPI.
Status init(const std::string& what);
// Leaves the job if init joined it (after every group is destroyed).
void finalize();
// This process's rank and the job's processes (after init; 0 and 1 without MPI).
int rank();
int size();
// The job's processes on this machine, as the launcher says (1 without MPI; no init needed).
int local_size();
// What this process last waited for in the job's collectives, or "" (async-signal-safe to read: a signal
// handler may print it).
const char* activity();

// The whole job (collective over it).
Result<std::unique_ptr<Communicator>> world(const std::string& what, CommOptions options = {});
// The processes that pass the same `color`, ordered by `key` (collective over the job).
Result<std::unique_ptr<Communicator>> split(const std::string& what, int color, int key, CommOptions options = {});

// Tagged messages between the members of `group` (made by world or split), the endpoint being the rank in
// it: parallel/mpi/mpi_transport.h, for `micros` micro-batches and evaluation's.
Result<std::unique_ptr<Transport>> transport(Communicator& group, int micros);
// Unimplemented naming the counts when `edges` edges of `micros` micro-batches need message tags past
// what `group` allows (MPI_TAG_UB).
Status check_tags(const Communicator& group, int64_t edges, int64_t micros);

}  // namespace aspen::parallel::job
