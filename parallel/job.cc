#include "parallel/job.h"

#ifdef ASPEN_HAVE_MPI
#include "parallel/mpi/mpi_communicator.h"
#include "parallel/mpi/mpi_transport.h"
#endif

namespace aspen::parallel::job {

#ifdef ASPEN_HAVE_MPI

bool available() { return true; }
bool launched() { return mpi_launched(); }
Status init(const std::string& what) { return Status(mpi_init(nullptr, nullptr)).with_context(what); }
void finalize() { mpi_finalize(); }
int rank() { return mpi_world_rank(); }
int size() { return mpi_world_size(); }
int local_size() { return mpi_local_size(); }
const char* activity() { return mpi_activity(); }

Result<std::unique_ptr<Communicator>> world(const std::string& what, CommOptions options) {
  ASPEN_RETURN_IF_ERROR(init(what));
  ASPEN_ASSIGN_OR_RETURN(auto comm, MpiCommunicator::world(std::move(options)));
  return std::unique_ptr<Communicator>(std::move(comm));
}

Result<std::unique_ptr<Communicator>> split(const std::string& what, int color, int key, CommOptions options) {
  ASPEN_RETURN_IF_ERROR(init(what));
  ASPEN_ASSIGN_OR_RETURN(auto comm, MpiCommunicator::split(color, key, std::move(options)));
  return std::unique_ptr<Communicator>(std::move(comm));
}

namespace {
Result<MpiCommunicator*> mpi_group(const Communicator& group) {
  auto* mpi = dynamic_cast<MpiCommunicator*>(const_cast<Communicator*>(&group));
  if (!mpi)
    return Status::error(Code::kInternal, "job transport", "a group of the job (mpi)",
                         "a " + std::string(group.backend()) + " group");
  return mpi;
}
}  // namespace

Result<std::unique_ptr<Transport>> transport(Communicator& group, int micros) {
  ASPEN_ASSIGN_OR_RETURN(MpiCommunicator * mpi, mpi_group(group));
  return std::unique_ptr<Transport>(std::make_unique<MpiTransport>(*mpi, micros));
}

Status check_tags(const Communicator& group, int64_t edges, int64_t micros) {
  ASPEN_ASSIGN_OR_RETURN(MpiCommunicator * mpi, mpi_group(group));
  return MpiTransport::check_tags(*mpi, edges, micros);
}

#else  // a build without MPI: a job of one process

namespace {
Status no_mpi(const std::string& what) {
  return Status::unimplemented(what, "build (this one was built without MPI; install OpenMPI with "
                                     "scripts/install-deps.sh and rebuild)");
}
}  // namespace

bool available() { return false; }
bool launched() { return false; }
Status init(const std::string& what) { return no_mpi(what); }
void finalize() {}
int rank() { return 0; }
int size() { return 1; }
int local_size() { return 1; }
const char* activity() { return ""; }
Result<std::unique_ptr<Communicator>> world(const std::string& what, CommOptions) { return no_mpi(what); }
Result<std::unique_ptr<Communicator>> split(const std::string& what, int, int, CommOptions) { return no_mpi(what); }
Result<std::unique_ptr<Transport>> transport(Communicator&, int) { return no_mpi("a transport between processes"); }
Status check_tags(const Communicator&, int64_t, int64_t) { return no_mpi("a transport between processes"); }

#endif

}  // namespace aspen::parallel::job
