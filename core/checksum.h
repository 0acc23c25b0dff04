// core/checksum.h: CRC-32C (Castagnoli), the checksum of checkpoint files.
//
//   uint32_t c = crc32c(bytes);                 // one buffer
//   c = crc32c(more, c);                        // continued over several
//
// Why CRC-32C: it detects every burst of up to 32 flipped bits and any odd
// number of flipped bits, which is what disks and copies do to files; x86's
// SSE4.2 computes it at several GB/s (used when the CPU has it, else a table),
// so checking a checkpoint costs little beside reading it. It is not a defence
// against someone forging a file. The same polynomial as iSCSI, ext4 and
// LevelDB: crc32c("123456789") = 0xe3069283.
//
// Thread-safety: pure functions.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>


namespace aspen {

uint32_t crc32c(std::string_view bytes, uint32_t crc = 0);

// A file's size and CRC-32C, as checkpoints record them.
struct FileDigest {
  uint64_t bytes = 0;
  uint32_t crc32c = 0;
};

// "e3069283": 8 lowercase hex digits, as checkpoints record it.
std::string crc32c_hex(uint32_t crc);
// The low `digits` hex digits of `value`, lowercase, zero-padded (checksums and fingerprints on disk).
std::string hex_digits(uint64_t value, int digits);

}  // namespace aspen
