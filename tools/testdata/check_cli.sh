#!/usr/bin/env bash
# tools/testdata/check_cli.sh ASPEN SOURCE_DIR: the command line a careful user
# expects. Each case runs aspen and checks the exit code (0 done, 1 a failure,
# 2 bad usage) and a piece of what it printed; every failure is listed and the
# script exits 1 if there was any.
set -u
aspen=$1
src=$2
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
failures=0
gpt2="$src/models/testdata/gpt2-tiny"

# expect RC TEXT -- COMMAND...: the command exits RC and its stdout+stderr contain TEXT.
expect() {
  local rc=$1 text=$2
  shift 3
  local out got
  out=$("$@" 2>&1)
  got=$?
  if [ "$got" != "$rc" ] || [[ "$out" != *"$text"* ]]; then
    echo "FAIL: $* -> exit $got (want $rc); output:"
    echo "$out" | head -20 | sed 's/^/    /'
    echo "  wanted it to contain: $text"
    failures=$((failures + 1))
  else
    echo "ok: $*"
  fi
}

# Typos get a suggestion; usage errors exit 2 and begin "aspen: error:".
expect 2 "aspen: error: The following arguments were not expected: trian (did you mean 'train'?)" -- "$aspen" trian
expect 2 "(did you mean '--prompt'?)" -- "$aspen" generate --model "$gpt2" --promt hi
expect 2 "(did you mean 'gemm'?)" -- "$aspen" bench gemmm
expect 2 "Run 'aspen generate --help' for the options." -- "$aspen" generate --model "$gpt2" --promt hi

# Counts must be positive (a seed and thread count non-negative), named by their flag.
expect 2 "aspen: error: --steps: expected an integer >= 1, found -5" -- "$aspen" train --demo --steps -5
expect 2 "--steps: expected an integer >= 1, found 0" -- "$aspen" train --demo --steps 0
expect 2 "--threads: expected an integer >= 0, found -1" -- "$aspen" train --demo --threads -1
expect 2 "--replicas: expected an integer >= 1, found 0" -- "$aspen" train --demo --replicas 0
expect 2 "--stages: expected an integer >= 1, found 0" -- "$aspen" train --demo --stages 0
expect 2 "--seed: expected an integer >= 0, found -1" -- "$aspen" train --demo --seed -1
expect 2 "--seed: expected an integer >= 0, found -1" -- "$aspen" generate --model "$gpt2" --prompt hi --seed -1
expect 2 "--max-new-tokens: expected an integer >= 1, found 0" -- "$aspen" generate --model "$gpt2" --prompt hi --max-new-tokens 0
expect 2 "exclude each other" -- "$aspen" train --demo --resume --overwrite

# --version; global flags after the subcommand too.
expect 0 "aspen 0." -- "$aspen" --version
expect 0 "kernel isa: scalar" -- "$aspen" info --isa scalar

# A directory where a file is expected.
expect 1 "aspen: error: NotFound: $tmp/none.yaml" -- "$aspen" train "$tmp/none.yaml"
expect 1 "$tmp: expected a regular file, found a directory" -- "$aspen" train "$tmp"
mkdir -p "$tmp/in"
expect 1 "$tmp/in: expected a regular file, found a directory" -- \
  "$aspen" prepare-data --tokenizer "$src/io/testdata/bpe1k" --input "$tmp/in" --output "$tmp/out"
[ -e "$tmp/out/index.json" ] && { echo "FAIL: prepare-data wrote a dataset from a directory"; failures=$((failures + 1)); }

# /dev/zero as an input would be read until memory runs out: refused at once.
expect 1 "/dev/zero: expected a regular file, found a character device" -- \
  "$aspen" prepare-data --tokenizer "$src/io/testdata/bpe1k" --input /dev/zero --output "$tmp/zero"

# A warm-up longer than the run is clamped, with a warning naming the key.
expect 0 "aspen: warning: schedule.warmup_steps (50) is more than train.steps (4); warming up over all 4 steps" -- \
  "$aspen" train --demo --run-dir "$tmp/demo" --steps 4 --threads 1 --set schedule.warmup_steps=50

# --set takes one value: the config after it is the positional, wherever it stands.
printf 'name: cli\ndata:\n  train: %s/no-data\n' "$tmp" > "$tmp/c.yaml"
expect 1 "$tmp/no-data" -- "$aspen" train --set optimizer.lr=1e-3 "$tmp/c.yaml"
expect 1 "$tmp/no-data" -- "$aspen" train "$tmp/c.yaml" --set optimizer.lr=1e-3

# generate: sampling flags are checked before the model loads (this model does not exist).
expect 2 "--temperature: expected a finite number >= 0 (0: greedy), found -1" -- \
  "$aspen" generate --model "$tmp/no-model" --prompt hi --temperature -1
expect 2 "--top-p: expected a number in (0, 1] (1: off), found 1.5" -- \
  "$aspen" generate --model "$tmp/no-model" --prompt hi --top-p 1.5
long=$(printf 'ROMEO: But soft, what light through yonder window breaks? %.0s' 1 2 3 4 5 6 7 8)
expect 1 "tokens; this model's context is 64" -- "$aspen" generate --model "$gpt2" --prompt "$long"
# A tiny temperature samples (greedily), never an id from NaN weights; a timings line at the end.
greedy=$("$aspen" generate --model "$gpt2" --prompt "ROMEO:" --max-new-tokens 8 --temperature 0 2>/dev/null)
tiny=$("$aspen" generate --model "$gpt2" --prompt "ROMEO:" --max-new-tokens 8 --temperature 1e-45 2>/dev/null)
if [ "$greedy" != "$tiny" ]; then
  echo "FAIL: --temperature 1e-45 printed [$tiny], greedy printed [$greedy]"
  failures=$((failures + 1))
else
  echo "ok: --temperature 1e-45 is greedy"
fi
expect 0 "timings: prompt " -- "$aspen" generate --model "$gpt2" --prompt "ROMEO:" --max-new-tokens 4 --dtype bf16
expect 0 "generated 4 tokens" -- "$aspen" generate --model "$gpt2" --prompt "ROMEO:" --max-new-tokens 4 --temperature 0

# Error messages escape control bytes from hostile files (a tensor name holding ESC).
python3 - "$tmp/ctl.safetensors" <<'PY'
import struct, sys
header = b'{"a\\u001b[2J":{"dtype":"Q7","shape":[1],"data_offsets":[0,1]}}'  # JSON's escape of ESC
open(sys.argv[1], "wb").write(struct.pack("<Q", len(header)) + header + b"x")
PY
out=$("$aspen" inspect "$tmp/ctl.safetensors" 2>&1)
if [[ "$out" == *$'\x1b'* ]] || [[ "$out" != *'a\x1b[2J'* ]]; then
  echo "FAIL: inspect printed a raw control byte or lost the name: $(printf '%q' "$out")"
  failures=$((failures + 1))
else
  echo "ok: control bytes escaped"
fi

echo "$failures failure(s)"
# aspen onnx: 0 on success, 1 naming the node of a model it does not import, 2 on a usage error.
mlp="$src/models/testdata/onnx/mlp_ts/model.onnx"
x="$src/tools/testdata/onnx_mlp_x.npy"
expect 0 "compile: " -- "$aspen" onnx run "$mlp" --input "x=$x" --output-dir "$tmp"
expect 2 "expected NAME=FILE.npy" -- "$aspen" onnx run "$mlp" --input "$x"
expect 2 "graph input 'x': expected --input x=FILE.npy, found none" -- "$aspen" onnx run "$mlp"
expect 2 "--dim 'batch': expected NAME=EXTENT" -- "$aspen" onnx run "$mlp" --input "x=$x" --dim batch
touch "$tmp/not_a_dir"  # a cache it cannot write is said so, not "stored"
expect 0 "(executable cache: miss, not stored: see the warning above)" -- "$aspen" onnx run "$mlp" --input "x=$x" \
  --output-dir "$tmp" --cache "$tmp/not_a_dir/cache"
expect 0 "(executable cache: miss, not stored: see the warning above)" -- "$aspen" train --demo --steps 2 \
  --run-dir "$tmp/demo-cache" --set train.executable_cache="$tmp/not_a_dir/cache"
expect 0 "(executable cache: miss, stored)" -- "$aspen" train --demo --steps 2 --run-dir "$tmp/demo-cache" \
  --set train.executable_cache="$tmp/exe-cache"
expect 0 "(executable cache: hit)" -- "$aspen" train --demo --steps 2 --run-dir "$tmp/demo-cache" \
  --set train.executable_cache="$tmp/exe-cache"
expect 2 "--dim batch: expected one extent, found 2 and 3" -- "$aspen" onnx run "$mlp" --input "x=$x" --dim batch=2 --dim batch=3
expect 2 "--dtype: expected f32 or bf16, found 'f64'" -- "$aspen" onnx run "$mlp" --input "x=$x" --dtype f64
python3 - "$mlp" "$tmp/unsupported.onnx" <<'PY' || failures=$((failures + 1))
import sys
# The model with its first node's op type renamed (field 4 of NodeProto), byte for byte otherwise.
data = open(sys.argv[1], "rb").read()
at = data.find(b"\x22\x04Gemm")
assert at > 0, "no Gemm op_type in the model"
open(sys.argv[2], "wb").write(data[:at] + b"\x22\x04Gexx" + data[at + 6:])
PY
expect 1 "(Gexx) at opset 17" -- "$aspen" onnx run "$tmp/unsupported.onnx" --input "x=$x"
expect 0 "imports: no (1 op type(s) not supported)" -- "$aspen" onnx inspect "$tmp/unsupported.onnx"

[ "$failures" -eq 0 ]
