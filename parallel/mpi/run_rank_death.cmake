# Runs parallel_mpi_test --die-at 3 under mpirun -np 2: rank 1 calls _exit(3)
# inside all_reduce #3. Passes when the job ends non-zero within the CTest
# timeout and the output says which rank died or what the survivor waited
# for (docs/parallel.md: what OpenMPI does).
# odls_base_sigkill_timeout: mpirun waits 3 s between SIGTERM and SIGKILL, so
# the survivors can say where they were (NOTE [launcher kill]).
set(_mpirun ${MPIRUN} --allow-run-as-root --oversubscribe --mca odls_base_sigkill_timeout 3)
execute_process(COMMAND ${_mpirun} -np 2 ${EXE} --die-at 3
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 50)
set(all "${out}${err}")
message("exit: ${rc}\n${all}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0 although rank 1 died")
endif()
if(NOT all MATCHES "rank 1: exiting inside all_reduce #3")
  message(FATAL_ERROR "rank 1 did not reach the collective it was to die in")
endif()
# The survivor either times out itself or is ended by mpirun (SIGTERM); both
# name the collective it was in.
if(NOT all MATCHES "aspen: rank 0: (DeadlineExceeded|IoError|Aborted): all_reduce #3|aspen: terminated by the MPI launcher [^\n]* on world rank 0, in all_reduce #3")
  message(FATAL_ERROR "the survivor (rank 0) did not say which collective it was in")
endif()
if(NOT all MATCHES "Exit code: +3")
  message(FATAL_ERROR "mpirun did not name the rank that exited")
endif()
