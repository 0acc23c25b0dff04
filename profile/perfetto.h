// profile/perfetto.h: a run's events as a Perfetto trace (its protobuf format), which stays small enough to open
// at millions of events.
//
// NOTE [perfetto trace]: trace.json spends ~200 bytes an event; a run of 10 million events is 2 GB, past what
// Perfetto's UI or TensorBoard load. This writer emits Perfetto's own format (TracePacket messages; the
// schema is perfetto/protos/perfetto/trace/perfetto_trace.proto, read through the PyPI package `perfetto` in
// the tests) the way its own SDK does, to keep an event to a few bytes:
//   - one track per device (under one process track per MPI process, "p<k>/..."), in order of first
//     appearance; events that overlap without nesting (a slice track cannot hold them) go on extra tracks
//     "<device> #2", ...;
//   - each track's slices on a packet sequence of their own, with that track as the sequence's default and a
//     sequence-scoped incremental clock (each packet's timestamp is the nanoseconds since the previous one);
//   - names, categories, argument names and argument values interned per sequence (sent once, then an id);
//   - the packets deflated in blocks of about 1 MiB (TracePacket.compressed_packets, what Perfetto's tracing
//     service writes when asked to compress; the trace processor and the UI inflate them).
// Beside the slices: counter tracks per device, "memory (planned)" (the bytes of transient values the
// program's memory plan holds live at the instruction running: ProgramMemory::live_bytes, for the devices of
// the process whose programs `programs` lists) and "bytes in flight" (copies and collectives running, and
// pipeline sends not yet received); and a flow arrow from every send to the receive that takes it: events
// with the argument "flow_out" and "flow_in" of the same value pair up in time order (the n-th out with the
// n-th in), across devices and processes.
// The times are the events' nanoseconds less the earliest start (the trace starts at 0), exactly.
#pragma once

#include <string>
#include <vector>

#include "core/status.h"
#include "profile/profile_dir.h"
#include "profile/trace.h"

namespace aspen::profile {

// The trace's bytes (see the note above). `programs`: the memory counter's plans, by ProgramMemory::program.
std::string perfetto_trace(const std::vector<TraceEvent>& events, const std::vector<ProgramMemory>& programs = {});

// The same written to `path`, replaced atomically. kIoError naming `path` and the OS error.
[[nodiscard]] Status write_perfetto_trace(const std::vector<TraceEvent>& events,
                                          const std::vector<ProgramMemory>& programs, const std::string& path);

}  // namespace aspen::profile
