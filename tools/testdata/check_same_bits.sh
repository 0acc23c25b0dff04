#!/usr/bin/env bash
# tools/testdata/check_same_bits.sh ASPEN: the same bits wherever the demo is compiled (NOTE [matmul choice]
# in kernels/matmul_choice.cc). Each run trains the demo for a few steps and the checkpoints' weights are
# compared byte for byte:
# - two runs, each with a fresh kernel-choice cache (each measures every product afresh);
# - 1 thread against 2 threads;
# - 2 replicas against accumulation 2 on one device (docs/parallel.md: the same checkpoint, bit for bit);
# - a run resumed from its step-10 checkpoint with a cache that holds other choices for every product (as
#   another machine's, or a cache measured at another moment, would): it adopts the checkpoint's and ends
#   where the uninterrupted run ends;
# and `aspen train` prints where its choices came from.
set -u
aspen=$1
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.txt; do echo "--- $f:"; cat "$f"; done; exit 1; }
steps=20

# demo NAME CACHE ARGS...: trains into $tmp/NAME with ASPEN_CACHE_DIR=$tmp/CACHE.
demo() {
  local name=$1 cache=$2
  shift 2
  ASPEN_CACHE_DIR="$tmp/$cache" "$aspen" train --demo --steps $steps --run-dir "$tmp/$name" "$@" \
    > "$tmp/$name.txt" 2>&1 || fail "$name: exit code $?"
}
weights() { echo "$tmp/$1/checkpoints/step-$(printf %08d "$2")/model.safetensors"; }
same() {  # same NAME1 NAME2 STEP WHAT
  cmp -s "$(weights "$1" "$3")" "$(weights "$2" "$3")" || fail "$4: the weights of $1 and $2 differ at step $3"
  echo "ok: $4"
}

demo fresh1 cache1 --threads 2 --set checkpoint.interval=10
grep -q "^kernels: [0-9]* matrix product shapes ([^;]*; [0-9]* measured now)" "$tmp/fresh1.txt" ||
  fail "fresh1 does not say its kernel choices were measured"
demo fresh2 cache2 --threads 2
same fresh1 fresh2 $steps "two fresh kernel-choice caches train to the same weights"
grep -q "^kernels: [0-9]* matrix product shapes ([^;]*; [0-9]* from $tmp/cache2/matmul-choices-" \
  <(ASPEN_CACHE_DIR="$tmp/cache2" "$aspen" train --demo --steps 2 --run-dir "$tmp/again" 2>&1) ||
  fail "a second run does not say its choices came from the cache's file"
echo "ok: a second run takes its choices from the cache's file and says so"

demo one_thread cache3 --threads 1
same fresh1 one_thread $steps "1 thread and 2 threads train to the same weights"

demo replicas cache1 --threads 1 --replicas 2
demo accumulation cache1 --threads 2 --set batch.micro=8 --set batch.accumulation=2
same replicas accumulation $steps "2 replicas and accumulation 2 write the same checkpoint"

# A cache whose every choice is another backend than the run's (aspen <-> oneDNN).
mkdir -p "$tmp/other"
for f in "$tmp"/cache1/matmul-choices-*.txt; do
  sed -e 's/ aspen$/ XX/' -e 's/ oneDNN$/ aspen/' -e 's/ OpenBLAS$/ aspen/' -e 's/ XX$/ oneDNN/' "$f" \
    > "$tmp/other/$(basename "$f")"
done
cmp -s "$tmp"/cache1/matmul-choices-*.txt "$tmp"/other/matmul-choices-*.txt && fail "the other cache is not other"
demo other_only other --threads 2
if cmp -s "$(weights fresh1 $steps)" "$(weights other_only $steps)"; then
  fail "the other choices give the same bits: this test could not tell an adopted choice from a measured one"
fi
demo resumed other --threads 2 --resume-from "$tmp/fresh1/checkpoints/step-00000010"
grep -q "^kernels: [0-9]* matrix product shapes ([^;]*; [0-9]* from the checkpoint $tmp/fresh1/checkpoints/step-00000010)" \
  "$tmp/resumed.txt" || fail "the resumed run does not say it took the checkpoint's choices"
grep -q "resuming at step 10" "$tmp/resumed.txt" || fail "the resumed run did not start at step 10"
same fresh1 resumed $steps "a run resumed with another cache's choices ends where the uninterrupted one does"
