# Runs `aspen generate` greedily on MODEL's generate_text.json prompt and
# fails unless stdout is exactly the golden text plus a newline.
file(READ "${MODEL}/generate_text.json" golden)
string(JSON prompt GET "${golden}" prompt)
string(JSON text GET "${golden}" text)
string(JSON tokens GET "${golden}" max_new_tokens)
execute_process(
  COMMAND "${ASPEN}" generate --model "${MODEL}" --prompt "${prompt}" --max-new-tokens ${tokens} --temperature 0
  OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
if(NOT rc EQUAL 0)
  message(FATAL_ERROR "aspen generate failed (${rc}): ${err}")
endif()
if(NOT out STREQUAL "${text}\n")
  message(FATAL_ERROR "aspen generate printed\n[${out}]\nexpected\n[${text}\n]")
endif()
message(STATUS "aspen generate printed the golden text")
