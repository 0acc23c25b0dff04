# `aspen monitor RUN_DIR` names the slow device itself: `aspen train --demo` in 2 pipeline stages with device
# DEVICE slowed (the test hook ASPEN_TEST_SLOW_DEVICE, NOTE [slowed device]: every pass of it takes twice its
# time, the losses unchanged), then `aspen monitor --once --json` must name cpu<DEVICE>, not the device
# waiting for it.
file(REMOVE_RECURSE "${WORK}")
execute_process(COMMAND ${CMAKE_COMMAND} -E env "ASPEN_TEST_SLOW_DEVICE=${DEVICE}:1.0"
                        "${ASPEN}" train --demo --steps 20 --threads 1 --stages 2 --set batch.accumulation=2
                        --run-dir "${WORK}"
                OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "loss: 5.5[0-9]* at the first step of this run")
  message(FATAL_ERROR "aspen train (${rc}): ${out}${err}")
endif()
execute_process(COMMAND "${ASPEN}" monitor "${WORK}" --once --json OUTPUT_VARIABLE json RESULT_VARIABLE rc)
string(JSON slow GET "${json}" slow_device)
if(NOT rc EQUAL 0 OR NOT slow STREQUAL "cpu${DEVICE}")
  message(FATAL_ERROR "aspen monitor (${rc}) named '${slow}', expected cpu${DEVICE}: ${json}")
endif()
execute_process(COMMAND "${ASPEN}" monitor "${WORK}/none" --once OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "metrics.jsonl: expected a run directory's metrics")
  message(FATAL_ERROR "aspen monitor on a directory without metrics: (${rc}) ${err}")
endif()
message(STATUS "aspen monitor named cpu${DEVICE}")
