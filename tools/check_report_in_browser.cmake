# The profile report in a real browser: `aspen generate --profile WORK/profile` on MODEL (or CMD, a list, with
# `--profile WORK/profile` appended, and EXPECT, the strings its drawn page must hold), then headless
# Chromium loads WORK/profile/report.html from disk and must find it drawn (#status "drawn", no script
# error) with its views: the Summary's facts and measured peaks, an Operations row for matmul with its
# roofline, the Layers view cut at the blocks (depth 3: transformer.h.1) with the head, and the Memory curves of
# the prefill and decode programs. A screenshot is kept beside it
# (WORK/profile/report.png) as the test's artifact. Fails with the reason, or how to install Chromium.
if(NOT CHROMIUM)
  message(FATAL_ERROR "chromium not found: install Debian's chromium (scripts/install-deps.sh) and re-run cmake")
endif()
set(dir "${WORK}/profile")
file(REMOVE_RECURSE "${WORK}")
if(NOT CMD)  # the default run: generate on MODEL
  set(CMD "${ASPEN}" generate --model "${MODEL}" --prompt "Hello" --max-new-tokens 4 --temperature 0)
endif()
execute_process(COMMAND ${CMD} --profile "${dir}" OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0 OR NOT EXISTS "${dir}/report.html")
  message(FATAL_ERROR "${CMD} --profile failed (${rc}) or wrote no report.html: ${err}")
endif()
set(flags --headless --disable-gpu --no-sandbox --no-first-run --disable-extensions --user-data-dir=${WORK}/chromium)
execute_process(COMMAND "${CHROMIUM}" ${flags} --dump-dom "file://${dir}/report.html"
                OUTPUT_VARIABLE dom ERROR_VARIABLE cerr RESULT_VARIABLE crc TIMEOUT 120)
if(NOT crc EQUAL 0)
  message(FATAL_ERROR "chromium failed (${crc}): ${cerr}")
endif()
string(REGEX MATCH "id=\"status\">[^<]*" status "${dom}")
if(NOT status STREQUAL "id=\"status\">drawn")
  message(FATAL_ERROR "report.html was not drawn: ${status}")
endif()
if(NOT EXPECT)
  set(EXPECT "data-v=\"generate\">generate</td>" "data-v=\"matmul\">matmul</td>" "<h3>prefill: transient bytes"
             "<h3>decode: transient bytes" "layers at depth 3</h3>" "data-v=\"transformer.h.1\">transformer.h.1</td>"
             "data-v=\"lm_head\">lm_head</td>" "% of read</td>")
endif()
foreach(expected "data-v=\"command\">command</td>" "<h3>cpu0: " "<polyline" "peak f32 FMA (measured in the run)"
                 ">measured peak RSS</td>" ">planned: arenas</td>"
                 "<th>compute</th>" ${EXPECT})
  string(FIND "${dom}" "${expected}" at)
  if(at LESS 0)
    message(FATAL_ERROR "report.html drawn without '${expected}'")
  endif()
endforeach()
execute_process(COMMAND "${CHROMIUM}" ${flags} --window-size=1200,1400 "--screenshot=${dir}/report.png"
                        "file://${dir}/report.html"
                OUTPUT_QUIET ERROR_QUIET TIMEOUT 120)
message(STATUS "report.html drawn in Chromium; screenshot ${dir}/report.png")
