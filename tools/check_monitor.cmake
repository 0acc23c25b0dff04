# `aspen monitor RUN_DIR` names the slow device itself: `aspen train --demo` in 2 pipeline stages with device
# DEVICE slowed (the test hook ASPEN_TEST_SLOW_DEVICE, NOTE [slowed device]: every pass of it takes twice its
# time, the losses unchanged), then `aspen monitor --once --json` must name cpu<DEVICE>, not the device
# waiting for it.
# With MPIRUN (a list: the launcher and its flags): 2 processes of one replica each, process 1's device slowed
# (ASPEN_TEST_SLOW_DEVICE=p1/0:1.0), with the gradient exchange overlapped with the backward pass (OVERLAP
# true) or not: the monitor must name p1/cpu0 from process 0's metrics, and see process 0's device waiting in
# the exchange for it (its comm share above 30 %).
file(REMOVE_RECURSE "${WORK}")
if(DEFINED MPIRUN)
  set(expected "p1/cpu0")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "ASPEN_TEST_SLOW_DEVICE=p1/0:1.0"
                          ${MPIRUN} -x ASPEN_TEST_SLOW_DEVICE -np 2 "${ASPEN}" train --demo --steps 20 --threads 1
                          --set parallel.overlap=${OVERLAP} --run-dir "${WORK}"
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
else()
  set(expected "cpu${DEVICE}")
  execute_process(COMMAND ${CMAKE_COMMAND} -E env "ASPEN_TEST_SLOW_DEVICE=${DEVICE}:1.0"
                          "${ASPEN}" train --demo --steps 20 --threads 1 --stages 2 --set batch.accumulation=2
                          --run-dir "${WORK}"
                  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
endif()
if(NOT rc EQUAL 0 OR NOT out MATCHES "loss: 5.5[0-9]* at the first step of this run")
  message(FATAL_ERROR "aspen train (${rc}): ${out}${err}")
endif()
execute_process(COMMAND "${ASPEN}" monitor "${WORK}" --once --json OUTPUT_VARIABLE json RESULT_VARIABLE rc)
string(JSON slow GET "${json}" slow_device)
if(NOT rc EQUAL 0 OR NOT slow STREQUAL "${expected}")
  message(FATAL_ERROR "aspen monitor (${rc}) named '${slow}', expected ${expected}: ${json}")
endif()
# Every device's shares are shares: busy, waits and idle in [0, 1] (a mean once started from busy's "no
# line" -1 and showed -23 %).
if(DEFINED MPIRUN)
  set(devices "p0/cpu0;p1/cpu0")
else()
  set(devices "cpu0;cpu1")
endif()
foreach(d ${devices})
  string(JSON busy GET "${json}" devices "${d}" busy)
  string(JSON wait GET "${json}" devices "${d}" wait)
  string(JSON comm GET "${json}" devices "${d}" comm)
  if(busy LESS 0 OR busy GREATER 1 OR wait LESS 0 OR comm LESS 0)
    message(FATAL_ERROR "aspen monitor: ${d} busy ${busy}, peer wait ${wait}, exchange ${comm}: ${json}")
  endif()
endforeach()
if(DEFINED MPIRUN)
  # NOTE [data per replica]: both processes' replicas drew the same number of examples, none twice.
  string(JSON r0 GET "${json}" data r0)
  string(JSON r1 GET "${json}" data r1)
  string(JSON dup GET "${json}" duplicates)
  if(r0 LESS 1 OR NOT r0 EQUAL r1 OR NOT dup EQUAL 0)
    message(FATAL_ERROR "aspen monitor: examples per replica r0 ${r0}, r1 ${r1}, duplicates ${dup}: ${json}")
  endif()
  string(JSON comm GET "${json}" devices "p0/cpu0" comm)
  string(JSON gbps GET "${json}" devices "p0/cpu0" gbps)
  if(comm LESS 0.3 OR NOT gbps GREATER 0)
    message(FATAL_ERROR "aspen monitor: p0/cpu0 waits in the exchange ${comm} of each step at ${gbps} GB/s, "
                        "expected above 0.3 and some: ${json}")
  endif()
else()
  # The device waiting for the slow one waits on its pipeline peer.
  math(EXPR other "1 - ${DEVICE}")
  string(JSON wait GET "${json}" devices "cpu${other}" wait)
  if(wait LESS 0.05)
    message(FATAL_ERROR "aspen monitor: cpu${other} waits ${wait} of each step on its peer, expected some: ${json}")
  endif()
endif()
execute_process(COMMAND "${ASPEN}" monitor "${WORK}/none" --once OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "metrics.jsonl: expected a run directory's metrics")
  message(FATAL_ERROR "aspen monitor on a directory without metrics: (${rc}) ${err}")
endif()
message(STATUS "aspen monitor named ${expected}")
