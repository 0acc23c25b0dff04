# Runs api_mpi_test --die-at-step 3 under mpirun -np 2: rank 1 exits before
# data-parallel training step 3. Passes when the job ends non-zero well
# within 30 s and says which rank died and where the survivor was waiting.
# odls_base_sigkill_timeout: mpirun waits 3 s between SIGTERM and SIGKILL, so
# the survivor can say where it was (parallel/mpi/run_rank_death.cmake).
set(_mpirun ${MPIRUN} --allow-run-as-root --oversubscribe --mca odls_base_sigkill_timeout 3)
string(TIMESTAMP t0 "%s")
execute_process(COMMAND ${_mpirun} -np 2 ${EXE} --die-at-step 3
  RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE err TIMEOUT 50)
string(TIMESTAMP t1 "%s")
math(EXPR seconds "${t1} - ${t0}")
set(all "${out}${err}")
message("exit: ${rc} after ${seconds} s\n${all}")
if(rc EQUAL 0)
  message(FATAL_ERROR "the job exited 0 although rank 1 died")
endif()
if(seconds GREATER 30)
  message(FATAL_ERROR "the job took ${seconds} s to end (expected under 30)")
endif()
if(NOT all MATCHES "rank 1: exiting at training step 3")
  message(FATAL_ERROR "rank 1 did not reach the step it was to die at")
endif()
# The survivor is ended by mpirun (SIGTERM) or gives up itself; both name the collective.
if(NOT all MATCHES "aspen: terminated by the MPI launcher [^\n]* on world rank 0, in [a-z_]+ #[0-9]+|aspen: rank 0: (DeadlineExceeded|IoError|Aborted): ")
  message(FATAL_ERROR "the survivor (rank 0) did not say where it was waiting")
endif()
if(NOT all MATCHES "Exit code: +3")
  message(FATAL_ERROR "mpirun did not name the rank that exited")
endif()
