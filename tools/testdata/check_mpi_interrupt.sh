#!/usr/bin/env bash
# tools/testdata/check_mpi_interrupt.sh ASPEN MPIRUN...: Ctrl-C on `mpirun -np 2 aspen train` saves the run
# (NOTE [launcher stop] in tools/train_command.cc). The terminal sends SIGINT to its foreground process
# group, which holds mpirun alone (it puts each rank in a group of its own); mpirun relays SIGTERM to the
# ranks and kills them about a second later. The ranks agree to stop after the step in flight, process 0
# writes the checkpoint, and --resume then ends on the same weights, bit for bit, as a run never
# interrupted.
set -u
aspen=$1
shift
mpirun=("$@")
tmp=$(mktemp -d)
pid=
trap '[ -n "$pid" ] && kill -KILL -- -"$pid" 2>/dev/null; rm -rf "$tmp"' EXIT
fail() { echo "FAIL: $*"; for f in "$tmp"/*.txt; do echo "--- $f:"; cat "$f"; done; exit 1; }
steps=400

"${mpirun[@]}" -np 2 "$aspen" train --demo --steps $steps --run-dir "$tmp/whole" > "$tmp/whole.txt" 2>&1 ||
  fail "the uninterrupted run failed"

# A session of its own, as a terminal gives its job: the process group's id is mpirun's pid.
setsid "${mpirun[@]}" -np 2 "$aspen" train --demo --steps $steps --run-dir "$tmp/cut" > "$tmp/cut.txt" 2>&1 &
pid=$!
for _ in $(seq 1200); do  # up to 120 s for step 100
  grep -q "^step  *100/$steps" "$tmp/cut.txt" && break
  kill -0 $pid 2>/dev/null || fail "the run ended before step 100"
  sleep 0.1
done
grep -q "^step  *100/$steps" "$tmp/cut.txt" || fail "no step 100 within 120 s"
kill -INT -- -"$pid"  # what Ctrl-C in the terminal does
wait $pid
pid=
grep -q "SIGTERM from the MPI launcher (Ctrl-C on mpirun, or another rank ended): stopping after the current step" \
  "$tmp/cut.txt" || fail "no notice of the stop"
grep -q "another rank probably died" "$tmp/cut.txt" && fail "the stop was taken for a dead rank"
grep -q "^interrupted at step [0-9]* of $steps; checkpoint of step [0-9]* in $tmp/cut/checkpoints" "$tmp/cut.txt" ||
  fail "no checkpoint line"
step=$(sed -n 's/^interrupted at step \([0-9]*\) of .*/\1/p' "$tmp/cut.txt")
grep -q "step-$(printf %08d "$step")" "$tmp/cut/checkpoints/latest" || fail "latest is not step $step"
echo "ok: Ctrl-C on mpirun at step $step wrote $(cat "$tmp/cut/checkpoints/latest")"

"${mpirun[@]}" -np 2 "$aspen" train --demo --steps $steps --run-dir "$tmp/cut" --resume > "$tmp/resumed.txt" 2>&1 ||
  fail "--resume failed"
grep -q "resuming at step $step" "$tmp/resumed.txt" || fail "the resumed run did not start at step $step"
last="step-$(printf %08d $steps)/model.safetensors"
cmp -s "$tmp/whole/checkpoints/$last" "$tmp/cut/checkpoints/$last" ||
  fail "the resumed run's weights differ from the uninterrupted run's at step $steps"
echo "ok: resumed from step $step, the weights at step $steps are the uninterrupted run's, bit for bit"
