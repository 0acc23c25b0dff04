# `aspen profile diff A B` on two profiles of the same decode (ASPEN generate on MODEL, --profile): it aligns
# every instruction (none only in one), prints the run's factor, the spread and both lists, and its JSON names
# the same count; a directory without trace.json is named as the error.
file(REMOVE_RECURSE "${WORK}")
foreach(run a b)
  execute_process(COMMAND "${ASPEN}" generate --model "${MODEL}" --prompt "Hello" --max-new-tokens 20 --temperature 0
                          --profile "${WORK}/${run}" OUTPUT_QUIET ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "generate --profile ${WORK}/${run} failed (${rc}): ${err}")
  endif()
endforeach()
execute_process(COMMAND "${ASPEN}" profile diff "${WORK}/a" "${WORK}/b" OUTPUT_VARIABLE out ERROR_VARIABLE err
                RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT out MATCHES "instructions compared: [1-9][0-9]* \\(only in A: 0, only in B: 0\\); the whole run: B at [0-9.]+x A"
   OR NOT out MATCHES "run-to-run spread of the instructions that carry the time: [0-9.]+ %" OR NOT out MATCHES "slower in B" OR NOT out MATCHES "faster in B")
  message(FATAL_ERROR "aspen profile diff (${rc}):\n${out}${err}")
endif()
execute_process(COMMAND "${ASPEN}" profile diff "${WORK}/a" "${WORK}/b/trace.json" --json OUTPUT_VARIABLE json
                RESULT_VARIABLE rc)
string(JSON compared GET "${json}" compared)
string(JSON only_a GET "${json}" only_a)
if(NOT rc EQUAL 0 OR compared LESS 10 OR NOT only_a EQUAL 0)
  message(FATAL_ERROR "aspen profile diff --json (${rc}): ${json}")
endif()
# --report: B's report.html with the Compare view, drawn by headless Chromium.
execute_process(COMMAND "${ASPEN}" profile diff "${WORK}/a" "${WORK}/b" --report "${WORK}/compare.html"
                OUTPUT_QUIET ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${WORK}/compare.html")
  message(FATAL_ERROR "aspen profile diff --report (${rc}): ${err}")
endif()
if(NOT CHROMIUM)
  message(FATAL_ERROR "chromium not found: install Debian's chromium (scripts/install-deps.sh) and re-run cmake")
endif()
execute_process(COMMAND "${CHROMIUM}" --headless --disable-gpu --no-sandbox --no-first-run --disable-extensions
                        --user-data-dir=${WORK}/chromium --dump-dom "file://${WORK}/compare.html"
                OUTPUT_VARIABLE dom ERROR_QUIET RESULT_VARIABLE crc TIMEOUT 120)
string(REGEX MATCH "id=\"status\">[^<]*" status "${dom}")
if(NOT crc EQUAL 0 OR NOT status STREQUAL "id=\"status\">drawn" OR NOT dom MATCHES "<h2>Compare</h2>"
   OR NOT dom MATCHES "instructions compared" OR NOT dom MATCHES "<h3>slower in B: [0-9]+</h3>")
  message(FATAL_ERROR "compare.html in Chromium (${crc}): ${status}")
endif()
file(MAKE_DIRECTORY "${WORK}/empty")
execute_process(COMMAND "${ASPEN}" profile diff "${WORK}/a" "${WORK}/empty" OUTPUT_VARIABLE out ERROR_VARIABLE err
                RESULT_VARIABLE rc)
if(rc EQUAL 0 OR NOT err MATCHES "aspen: error: .*empty/trace.json: expected a readable trace.json")
  message(FATAL_ERROR "a directory without trace.json: (${rc}) ${err}")
endif()
message(STATUS "aspen profile diff: ${compared} instructions compared")
