// profile/profile_dir.h: a run's profile as a directory a person or a script opens (docs/profile.md):
//
//   DIR/trace.json    every recorded event, in the Chrome trace JSON that Perfetto (ui.perfetto.dev) and
//                     chrome://tracing open: one track per device
//   DIR/profile.json  the totals per device and per op (profile::device_totals), with what ran and where, in
//                     the schema "aspen.profile/1" (docs/profile.md), for scripts
//   DIR/report.html   the same drawn for a person: one self-contained page (profile/report.h)
//
// `aspen generate --profile DIR` writes one; so does any command run with the environment variable
// ASPEN_PROFILE=DIR (profile_dir_choice), for programs that cannot pass a flag.
#pragma once

#include <string>
#include <utility>
#include <vector>

#include "core/status.h"
#include "profile/trace.h"

namespace aspen::profile {

// What the profile says about the run besides its events: the command, and facts about the machine and the
// program (name -> value, in order: "cpu", "isa", "threads", ...).
struct RunFacts {
  std::string command;
  std::vector<std::pair<std::string, std::string>> facts;
};

// profile.json's text: schema, command, facts, wall_ns (first start to last end over all devices), and per
// device its busy_ns, span_ns, events and ops (category, name, count, total_ns, mean_ns, share of the
// device's busy time, bytes, gb_per_s or null).
std::string profile_json(const std::vector<TraceEvent>& events, const RunFacts& run);

// Creates `dir` (and its parents) if needed: a command calls it before it runs, so that a directory it
// cannot write is named before the work, not after. kIoError naming `dir`.
[[nodiscard]] Status make_profile_dir(const std::string& dir);

// Creates `dir` (and its parents) if needed and writes trace.json, profile.json and report.html there, each replaced
// atomically. kIoError naming the path that could not be made or written.
[[nodiscard]] Status write_profile_dir(const std::string& dir, const std::vector<TraceEvent>& events,
                                       const RunFacts& run);

// The profile directory of a command: `flag` when not empty, else the environment's ASPEN_PROFILE, else ""
// (no profile).
std::string profile_dir_choice(const std::string& flag);

}  // namespace aspen::profile
