# The example config end to end on tinyshakespeare, shortened: prepare-data
# (bpe1k), 4 steps of configs/gpt2-tinyshakespeare.yaml with validation and
# checkpoints every 2 steps, then --resume to step 6. Fails unless each step
# succeeds and the run directory holds what docs/training.md promises.
# Variables: ASPEN, SOURCE (the repository), CORPUS (tinyshakespeare.txt), WORK (a scratch directory).
file(REMOVE_RECURSE "${WORK}")
function(run)
  execute_process(COMMAND ${ARGN} OUTPUT_VARIABLE out ERROR_VARIABLE err RESULT_VARIABLE rc)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "failed (${rc}): ${ARGN}\n${out}\n${err}")
  endif()
  set(out "${out}${err}" PARENT_SCOPE)
endfunction()
run("${ASPEN}" prepare-data --tokenizer "${SOURCE}/io/testdata/bpe1k" --input "${CORPUS}" --output "${WORK}/data")
set(common "${SOURCE}/configs/gpt2-tinyshakespeare.yaml" --run-dir "${WORK}/run" --threads 2
    --set "data.train=${WORK}/data" --set eval.interval=2 --set checkpoint.interval=2
    --set sample.max_new_tokens=8 --set schedule.warmup_steps=1)
run("${ASPEN}" train ${common} --steps 4)
foreach(want "step 2: val_loss" "checkpoint saved" "trained to step 4" "samples" "ROMEO:")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "aspen train printed no '${want}':\n${out}")
  endif()
endforeach()
run("${ASPEN}" train ${common} --steps 6 --resume)
foreach(want "resuming at step 4" "trained to step 6")
  string(FIND "${out}" "${want}" at)
  if(at EQUAL -1)
    message(FATAL_ERROR "aspen train --resume printed no '${want}':\n${out}")
  endif()
endforeach()
foreach(f run/config.yaml run/metrics.jsonl run/loss.svg run/checkpoints/latest run/checkpoints/step-00000006/model.safetensors
          run/model/config.json run/model/model.safetensors run/model/tokenizer.json)
  if(NOT EXISTS "${WORK}/${f}")
    message(FATAL_ERROR "the run wrote no ${f}")
  endif()
endforeach()
message(STATUS "aspen train: the example config trains, validates, checkpoints, resumes and exports")
