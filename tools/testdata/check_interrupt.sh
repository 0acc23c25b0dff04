#!/usr/bin/env bash
# tools/testdata/check_interrupt.sh ASPEN: Ctrl-C during `aspen train` finishes
# the step in flight, writes a checkpoint, prints how to resume and exits 130;
# --resume then finishes the run. A second run on the same directory while the
# first holds it is refused naming the first one's pid.
set -u
aspen=$1
tmp=$(mktemp -d)
trap 'kill $pid 2>/dev/null; rm -rf "$tmp"' EXIT
run="$tmp/run"
fail() { echo "FAIL: $*"; echo "--- output:"; cat "$tmp/out.txt"; exit 1; }

"$aspen" train --demo --run-dir "$run" --steps 2000 --threads 1 > "$tmp/out.txt" 2>&1 &
pid=$!
for _ in $(seq 600); do  # up to 60 s for step 20
  grep -q "^step  *20/2000" "$tmp/out.txt" && break
  kill -0 $pid 2>/dev/null || fail "the run ended before step 20"
  sleep 0.1
done
grep -q "^step  *20/2000" "$tmp/out.txt" || fail "no step 20 within 60 s"

# A second job on the same run directory is refused while the first runs.
second=$("$aspen" train --demo --run-dir "$run" --steps 2000 2>&1)
rc=$?
[ $rc -eq 1 ] || fail "a second run on $run exited $rc: $second"
[[ "$second" == *"run directory '$run': expected no other job using it, found one running (pid $pid,"* ]] ||
  fail "the second run's message: $second"
echo "ok: a second run is refused while the first holds $run"

kill -INT $pid
wait $pid
rc=$?
[ $rc -eq 130 ] || fail "exit code $rc after Ctrl-C, want 130"
grep -q "stopping after the current step to write a checkpoint" "$tmp/out.txt" || fail "no notice of the stop"
grep -q "^interrupted at step [0-9]* of 2000; checkpoint of step [0-9]* in $run/checkpoints" "$tmp/out.txt" ||
  fail "no checkpoint line"
grep -q "resume with: aspen train --demo --run-dir $run --steps 2000 --threads 1 --resume" "$tmp/out.txt" ||
  fail "no resume line"
step=$(sed -n 's/^interrupted at step \([0-9]*\) of .*/\1/p' "$tmp/out.txt")
[ -f "$run/checkpoints/latest" ] || fail "no checkpoint written"
grep -q "step-$(printf %08d "$step")" "$run/checkpoints/latest" || fail "latest is not step $step"
echo "ok: Ctrl-C at step $step wrote $(cat "$run/checkpoints/latest") and exited 130"

# The resumed run goes 10 steps further (a shorter run than the first asked for: the config differs, with a warning).
end=$((step + 10))
"$aspen" train --demo --run-dir "$run" --steps $end --threads 1 --resume > "$tmp/out.txt" 2>&1 ||
  fail "--resume failed"
grep -q "resuming at step $step" "$tmp/out.txt" || fail "the resumed run did not start at step $step"
grep -q "trained to step $end" "$tmp/out.txt" || fail "the resumed run did not finish"
echo "ok: --resume continued from step $step to $end"
