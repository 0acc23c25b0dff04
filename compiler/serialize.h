// compiler/serialize.h: graphs to bytes and back.
//
// The byte layout is pinned (docs/formats.md, "Graph encoding"): little-endian
// integers, length-prefixed strings, every node with its op number, inputs,
// attributes, output types, stage, checkpoint flag and constant data. Decoding
// checks every length and index against the buffer and never trusts a count
// it cannot back with bytes: a truncated or corrupted encoding is a Corrupt
// Status naming the byte offset, never a crash.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>

#include "core/status.h"
#include "graph/graph.h"

namespace aspen::compiler {

std::string encode_graph(const graph::Graph& graph);
Result<graph::Graph> decode_graph(std::string_view bytes);

// 64-bit FNV-1a: cache keys and entry checksums (not cryptographic).
uint64_t fnv1a64(std::string_view bytes, uint64_t seed = 0xcbf29ce484222325ull);

}  // namespace aspen::compiler
