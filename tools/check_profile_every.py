#!/usr/bin/env python3
"""`aspen train --profile-every K`: every K-th step recorded, each whole.

Usage: check_profile_every.py ASPEN WORKDIR

Trains the demo 8 steps recording 2 steps with --profile-every 3 (steps 2 and 5) and with the default
(steps 2 and 3): each profile holds exactly 2 optimizer steps (`step` plan instructions) with as many
host writes of the inputs, and the sampled steps lie 3 steps apart where the default's lie 1 apart (the gap
between their `step` instructions at least 1.6 times the default's).
profile.json's facts say steps_recorded 2 and profile_every. Exits non-zero on any mismatch.
"""
import json
import os
import shutil
import subprocess
import sys


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def run(aspen, work, every):
    d = os.path.join(work, f"every{every}")
    shutil.rmtree(d, ignore_errors=True)
    cmd = [aspen, "train", "--demo", "--steps", "8", "--threads", "1", "--profile-steps", "2", "--profile-every",
           str(every), "--run-dir", os.path.join(d, "run"), "--profile", os.path.join(d, "prof")]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)}: {r.stderr}{r.stdout}")
    facts = json.load(open(os.path.join(d, "prof", "profile.json")))["facts"]
    if facts.get("steps_recorded") != "2" or facts.get("profile_every") != str(every):
        fail(f"every {every}: facts {facts}")
    events = [e for e in json.load(open(os.path.join(d, "prof", "trace.json")))["traceEvents"] if e["ph"] == "X"]
    steps = sorted(e["ts"] + e["dur"] for e in events if e["cat"] == "plan" and e["name"] == "step")
    if len(steps) != 2:
        fail(f"every {every}: {len(steps)} optimizer steps recorded, expected 2")
    writes = [e for e in events if e["name"] == "host_write input_ids"]
    if not writes:
        fail(f"every {every}: no input written")
    return steps[1] - steps[0], len(writes)


def main():
    aspen, work = sys.argv[1], sys.argv[2]
    sampled, writes_sampled = run(aspen, work, 3)
    consecutive, writes_consecutive = run(aspen, work, 1)
    print(f"gap between the recorded steps: every 3: {sampled:.0f} us, every 1: {consecutive:.0f} us "
          f"({sampled / consecutive:.2f}x)")
    if writes_sampled != writes_consecutive:
        fail(f"a sampled step is not whole: {writes_sampled} input writes against {writes_consecutive}")
    if sampled < 1.6 * consecutive:  # 3 steps against 1 (recorded steps run slower than the rest)
        fail("the sampled steps are not 3 apart, or the consecutive ones not 1")


if __name__ == "__main__":
    main()
