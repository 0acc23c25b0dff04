#!/usr/bin/env python3
"""trace.pftrace read with Perfetto's own schema (perfetto_trace_pb2 from the PyPI package `perfetto`).

Usage: perfetto_schema_test.py ASPEN WORKDIR

Trains the demo model in a 2-stage pipeline for 3 steps with --profile, then parses WORKDIR/profile/trace.pftrace
as a perfetto.protos.Trace (the compressed blocks inflated as the trace processor does), applies each
sequence's interning, defaults and incremental clock, and checks against trace.json of the same run:
  - every event of trace.json is a slice on its device's track, with its name, category, start, duration
    (to the nanosecond) and arguments; no slice more;
  - every track descends from a process track; slices on one track nest;
  - each pipeline send has an arrow to the receive of the same transfer on the other stage's device;
  - the counters: planned memory per device (non-negative, at most its programs' largest arena), bytes in flight.
Exits non-zero on any mismatch.
"""
import collections
import json
import os
import shutil
import subprocess
import sys
import zlib

from perfetto.protos.perfetto.trace import perfetto_trace_pb2 as pb


def fail(msg):
    print("FAIL:", msg)
    sys.exit(1)


def packets(path):
    trace = pb.Trace()
    trace.ParseFromString(open(path, "rb").read())
    for p in trace.packet:
        if p.HasField("compressed_packets"):
            inner = pb.Trace()
            inner.ParseFromString(zlib.decompress(p.compressed_packets))
            yield from inner.packet
        else:
            yield p


def main():
    aspen, work = sys.argv[1], sys.argv[2]
    shutil.rmtree(work, ignore_errors=True)
    os.makedirs(work)
    prof = os.path.join(work, "profile")
    cmd = [aspen, "train", "--demo", "--steps", "3", "--threads", "1", "--stages", "2", "--set",
           "batch.accumulation=2", "--run-dir", os.path.join(work, "run"), "--profile", prof]
    r = subprocess.run(cmd, capture_output=True, text=True)
    if r.returncode != 0:
        fail(f"{' '.join(cmd)} failed: {r.stderr}{r.stdout}")

    tracks, parents, processes, counters = {}, {}, set(), set()
    seqs = collections.defaultdict(lambda: {"iid": collections.defaultdict(dict), "track": None, "t": 0,
                                            "open": []})
    slices, counter_points = [], collections.defaultdict(list)
    flows_out, flows_in = {}, {}
    for p in packets(os.path.join(prof, "trace.pftrace")):
        s = seqs[p.trusted_packet_sequence_id]
        if p.sequence_flags & pb.TracePacket.SEQ_INCREMENTAL_STATE_CLEARED:
            s["iid"].clear()
        if p.HasField("trace_packet_defaults"):
            d = p.trace_packet_defaults
            if d.timestamp_clock_id != 64:
                fail("a sequence without its incremental clock")
            s["track"] = d.track_event_defaults.track_uuid
        if p.HasField("clock_snapshot"):
            clocks = {c.clock_id: c for c in p.clock_snapshot.clocks}
            if not clocks[64].is_incremental or clocks[64].timestamp != 0 or clocks[6].timestamp != 0:
                fail(f"clock snapshot {p.clock_snapshot}")
        idata = p.interned_data
        for e in idata.event_names:
            s["iid"]["name"][e.iid] = e.name
        for e in idata.event_categories:
            s["iid"]["cat"][e.iid] = e.name
        for e in idata.debug_annotation_names:
            s["iid"]["arg"][e.iid] = e.name
        for e in idata.debug_annotation_string_values:
            s["iid"]["str"][e.iid] = e.str.decode()
        if p.HasField("track_descriptor"):
            t = p.track_descriptor
            if t.HasField("process"):
                processes.add(t.uuid)
            else:
                tracks[t.uuid] = t.name
                parents[t.uuid] = t.parent_uuid
                if t.HasField("counter"):
                    counters.add(t.uuid)
        if not p.HasField("track_event"):
            continue
        s["t"] += p.timestamp
        te = p.track_event
        track = te.track_uuid if te.HasField("track_uuid") else s["track"]
        if te.type == pb.TrackEvent.TYPE_SLICE_BEGIN:
            args = {}
            for a in te.debug_annotations:
                key = s["iid"]["arg"][a.name_iid]
                args[key] = str(a.uint_value) if a.HasField("uint_value") else s["iid"]["str"][a.string_value_iid]
            sl = {"track": tracks[track], "name": s["iid"]["name"][te.name_iid],
                  "cat": s["iid"]["cat"][te.category_iids[0]], "start": s["t"], "args": args}
            for f in te.flow_ids:
                flows_out[f] = sl
            for f in te.terminating_flow_ids:
                flows_in[f] = sl
            s["open"].append(sl)
        elif te.type == pb.TrackEvent.TYPE_SLICE_END:
            if not s["open"]:
                fail(f"an end with no open slice on {tracks[track]}")
            sl = s["open"].pop()
            sl["dur"] = s["t"] - sl["start"]
            slices.append(sl)
        elif te.type == pb.TrackEvent.TYPE_COUNTER:
            if track not in counters:
                fail(f"a counter value on {tracks[track]}, not a counter track")
            counter_points[tracks[track]].append((s["t"], te.counter_value))
    for s in seqs.values():
        if s["open"]:
            fail("slices left open")
    for uuid in tracks:
        if parents[uuid] not in processes:
            fail(f"track {tracks[uuid]} is under no process")

    # Against trace.json: the same events, times to the nanosecond (trace.json's microseconds have 3 decimals).
    events = [e for e in json.load(open(os.path.join(prof, "trace.json")))["traceEvents"] if e["ph"] == "X"]
    names = {e["tid"]: e["args"]["name"] for e in json.load(open(os.path.join(prof, "trace.json")))["traceEvents"]
             if e["ph"] == "M" and e["name"] == "thread_name"}
    origin = min(round(e["ts"] * 1000) for e in events)

    def key(track, name, start, dur):
        return (track.split(" #")[0], name, start, dur)

    want = collections.Counter()
    want_args = {}
    for e in events:
        k = key(names[e["tid"]], e["name"], round(e["ts"] * 1000) - origin, round(e["dur"] * 1000))
        want[k] += 1
        want_args[k] = ({a: str(v) for a, v in e.get("args", {}).items()}, e["cat"])
    got = collections.Counter(key(s["track"], s["name"], s["start"], s["dur"]) for s in slices)
    if got != want:
        fail(f"slices differ from trace.json: missing {list((want - got).items())[:5]}, extra "
             f"{list((got - want).items())[:5]}")
    for s in slices:
        args, cat = want_args[key(s["track"], s["name"], s["start"], s["dur"])]
        if s["args"] != args or s["cat"] != cat:
            fail(f"{s['name']} at {s['start']}: args {s['args']} / {s['cat']}, trace.json {args} / {cat}")

    # Pipeline transfers: each send's arrow ends at the receive of the same transfer, on the other device.
    sends = [s for s in slices if "flow_out" in s["args"]]
    if not sends:
        fail("no send carries a flow")
    for f, out in flows_out.items():
        if f not in flows_in:
            fail(f"flow {f} from {out['name']} has no end")
        inn = flows_in[f]
        if inn["args"].get("flow_in") != out["args"]["flow_out"] or inn["track"] == out["track"]:
            fail(f"flow {f}: {out['args']} on {out['track']} -> {inn['args']} on {inn['track']}")
        if inn["start"] + inn["dur"] < out["start"]:
            fail(f"flow {f} ends before it starts")
    if len(flows_out) != len(sends):
        fail(f"{len(sends)} sends, {len(flows_out)} arrows")

    # Counters: planned memory within the programs' largest arena; bytes in flight end at 0.
    arena = max(p["arena_bytes"] for p in json.load(open(os.path.join(prof, "profile.json")))["programs"])
    mem = [n for n in counter_points if n.endswith("memory (planned)")]
    if len(mem) != 2:
        fail(f"planned-memory counters: {mem}")
    for n in mem:
        vals = [v for _, v in counter_points[n]]
        if min(vals) < 0 or max(vals) > arena or max(vals) == 0:
            fail(f"{n}: values {min(vals)}..{max(vals)}, arena {arena}")
    flight = [n for n in counter_points if n.endswith("bytes in flight")]
    if not flight or any(counter_points[n][-1][1] != 0 for n in flight) or \
            any(v < 0 for n in flight for _, v in counter_points[n]):
        fail(f"bytes in flight: {[(n, counter_points[n][-3:]) for n in flight]}")
    size = os.path.getsize(os.path.join(prof, "trace.pftrace"))
    print(f"trace.pftrace: {len(slices)} slices, {len(flows_out)} arrows, {sum(map(len, counter_points.values()))} "
          f"counter values, {size} bytes ({size / len(slices):.1f} an event; trace.json "
          f"{os.path.getsize(os.path.join(prof, 'trace.json')) / len(slices):.1f})")


if __name__ == "__main__":
    main()
