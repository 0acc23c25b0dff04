#!/usr/bin/env bash
# Runs every libFuzzer target of the fuzz preset for a bounded time, in
# parallel, each from a scratch copy of its committed seed corpus (so the
# commit is not modified). Fails if any fuzzer finds a crash, leak, timeout
# or out-of-memory; the reproducer is left under $ASPEN_FUZZ_OUT (default
# build/fuzz/findings). See docs/fuzzing.md.
#
# Usage: scripts/fuzz.sh [seconds per target, default 60]   (after
#   cmake --preset fuzz && cmake --build --preset fuzz)
set -euo pipefail
cd "$(dirname "$0")/.."
seconds="${1:-60}"
out="${ASPEN_FUZZ_OUT:-build/fuzz/findings}"
work="$(mktemp -d)"
trap 'rm -rf "$work"' EXIT
mkdir -p "$out"

pids=()
for corpus in fuzz/corpus/*/; do
  name="$(basename "$corpus")"
  bin="build/fuzz/fuzz/${name}_fuzz"
  [ -x "$bin" ] || { echo "fuzz.sh: $bin missing (build the fuzz preset)" >&2; exit 1; }
  mkdir -p "$work/$name"
  cp "$corpus"* "$work/$name/"
  "$bin" -max_total_time="$seconds" -rss_limit_mb=2048 -timeout=10 -print_final_stats=1 \
    -artifact_prefix="$out/$name-" "$work/$name" > "$out/$name.log" 2>&1 &
  pids+=("$!:$name")
done

failed=0
for entry in "${pids[@]}"; do
  pid="${entry%%:*}" name="${entry#*:}"
  if wait "$pid"; then
    echo "fuzz: $name: $(grep -E '^stat::number_of_executed_units' "$out/$name.log" | awk '{print $2}') runs, no findings"
  else
    echo "fuzz: $name FAILED; log $out/$name.log, reproducer:" >&2
    ls "$out/$name-"* >&2 2>/dev/null || true
    tail -n 40 "$out/$name.log" >&2
    failed=1
  fi
done
exit "$failed"
