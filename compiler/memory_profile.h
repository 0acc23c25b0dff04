// compiler/memory_profile.h: a compiled program's memory plan as the profile's memory view reads it
// (profile::ProgramMemory, docs/profile.md).
#pragma once

#include <string>

#include "compiler/executable.h"
#include "profile/profile_dir.h"

namespace aspen::compiler {

// The bytes of transient (arena) values live at each node of `exe`'s program order: a value from the node that
// makes it to its last reader (a graph output to the end; a reshape planned as a view keeps its input alive as
// long as it is read; an output written over an input that dies at its node replaces it there, not beside
// it), so the curve's maximum is at most the arena (the plan's peak: fragmentation is the difference). Also
// the plan's totals and the values live at its peak node, the largest first.
// `program`: its index in its session (ProgramMemory::program; -1: not known).
profile::ProgramMemory program_memory(const Executable& exe, const std::string& name, int64_t program = -1);

}  // namespace aspen::compiler
