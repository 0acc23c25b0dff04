// io/npz.h: NumPy's .npz files (numpy.savez and numpy.savez_compressed) as named tensors.
//
// An .npz is a ZIP archive of .npy files, one per array, named "<key>.npy". read_npz reads the central
// directory (ZIP64 too, which numpy writes for large members), checks every member's bounds, method
// (stored or deflate), flags (no encryption) and CRC-32, and parses each member with io/npy.h, so the
// dtypes are those read_npy accepts. Arrays come back keyed by the name without ".npy". Every error is
// Corrupt (or Unimplemented for a ZIP feature numpy never writes) naming the file and the member.
//
// Sizes are bounded before anything is allocated: a member may not claim more than 1,032 times its
// compressed bytes (deflate's largest ratio) nor more than kMaxNpzMemberBytes, and inflating must give
// exactly the bytes it claims.
//
// write_npz writes an uncompressed archive, as numpy.savez does, atomically.
//
// Thread-safety: free functions without shared state.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <string_view>

#include "core/status.h"
#include "core/tensor.h"

namespace aspen::io {

inline constexpr uint64_t kMaxNpzMemberBytes = uint64_t(64) << 30;

Result<std::map<std::string, Tensor>> read_npz(const std::string& path);
// The same parsing over bytes in memory; `name` stands in for the path in errors.
Result<std::map<std::string, Tensor>> parse_npz(std::string_view bytes, const std::string& name);
[[nodiscard]] Status write_npz(const std::string& path, const std::map<std::string, Tensor>& arrays);

// Whether a member of `size` bytes once inflated (`stored` in the file) may be inflated on a machine of
// `memory_bytes` (0: unknown): at most half of it, checked before any allocation, so that a small archive
// claiming tens of GiB is an error naming the member, not the end of the process.
[[nodiscard]] Status npz_member_fits(const std::string& where, uint64_t size, uint64_t stored, double memory_bytes);

}  // namespace aspen::io
