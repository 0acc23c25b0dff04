// io/npz.cc: the ZIP reading and writing behind read_npz / write_npz. zlib (Debian's zlib1g) inflates
// numpy.savez_compressed's members and computes ZIP's CRC-32; the container itself is a few records,
// read here with every offset checked against the file.
#include "io/npz.h"

#include <zlib.h>

#include <algorithm>
#include <cstring>
#include <limits>
#include <new>
#include <vector>

#include "core/atomic_file.h"
#include "core/file.h"
#include "io/npy.h"

namespace aspen::io {

namespace {

constexpr uint32_t kLocalSig = 0x04034b50, kCentralSig = 0x02014b50, kEndSig = 0x06054b50;
constexpr uint32_t kEnd64Sig = 0x06064b50, kLocator64Sig = 0x07064b50;
constexpr size_t kLocalBytes = 30, kCentralBytes = 46, kEndBytes = 22, kEnd64Bytes = 56, kLocator64Bytes = 20;
constexpr uint64_t kMaxDeflateRatio = 1032;

Status corrupt(const std::string& name, const std::string& what, const std::string& expected,
               const std::string& found) {
  return Status::error(Code::kCorrupt, name + ": " + what, expected, found);
}

// Little-endian fields at an offset the caller has checked.
uint64_t le(std::string_view b, size_t at, int bytes) {
  uint64_t v = 0;
  for (int i = bytes - 1; i >= 0; --i) v = (v << 8) | uint8_t(b[at + size_t(i)]);
  return v;
}

struct Member {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint32_t crc = 0;
  uint64_t compressed = 0, size = 0, local = 0;
};

// The ZIP64 extended information of a central record: the 8-byte values of the fields that hold all ones.
Status read_zip64_extra(std::string_view extra, Member& m, bool need_size, bool need_compressed, bool need_local,
                        const std::string& where) {
  for (size_t at = 0; at + 4 <= extra.size();) {
    const uint64_t id = le(extra, at, 2), len = le(extra, at + 2, 2);
    if (at + 4 + len > extra.size()) return corrupt(where, "extra field", "within the record", "past its end");
    if (id == 1) {
      size_t p = at + 4;
      const size_t end = p + len;
      for (auto [need, field] :
           {std::pair{need_size, &m.size}, {need_compressed, &m.compressed}, {need_local, &m.local}}) {
        if (!need) continue;
        if (p + 8 > end) return corrupt(where, "ZIP64 extra field", "8 bytes per widened size", "fewer");
        *field = le(extra, p, 8);
        p += 8;
      }
      return Status::ok();
    }
    at += 4 + len;
  }
  if (need_size || need_compressed || need_local)
    return corrupt(where, "ZIP64 sizes", "a ZIP64 extra field (the record's sizes are all ones)", "none");
  return Status::ok();
}

Result<std::vector<Member>> central_directory(std::string_view b, const std::string& name) {
  if (b.size() < kEndBytes) return corrupt(name, "file", "an .npz (ZIP) archive", std::to_string(b.size()) + " bytes");
  // The end record is the last one with its signature, before a comment of at most 65,535 bytes.
  size_t end = std::string_view::npos;
  const size_t lowest = b.size() - kEndBytes > 65535 ? b.size() - kEndBytes - 65535 : 0;
  for (size_t at = b.size() - kEndBytes + 1; at-- > lowest;) {
    if (le(b, at, 4) == kEndSig && at + kEndBytes + le(b, at + 20, 2) == b.size()) {
      end = at;
      break;
    }
  }
  if (end == std::string_view::npos)
    return corrupt(name, "file", "an .npz (ZIP) archive: an end-of-central-directory record", "none");
  if (le(b, end + 4, 2) != 0 || le(b, end + 6, 2) != 0)
    return Status::error(Code::kUnimplemented, name, "a single-volume archive", "a multi-disk ZIP");
  uint64_t entries = le(b, end + 10, 2), cd_size = le(b, end + 12, 4), cd_offset = le(b, end + 16, 4);
  if (entries == 0xffff || cd_size == 0xffffffff || cd_offset == 0xffffffff) {  // ZIP64
    if (end < kLocator64Bytes || le(b, end - kLocator64Bytes, 4) != kLocator64Sig)
      return corrupt(name, "ZIP64 end locator", "one before the end record (its counts are all ones)", "none");
    const uint64_t at = le(b, end - kLocator64Bytes + 8, 8);
    if (end < kLocator64Bytes + kEnd64Bytes || at > end - kLocator64Bytes - kEnd64Bytes ||
        le(b, size_t(at), 4) != kEnd64Sig)
      return corrupt(name, "ZIP64 end record", "at the offset its locator gives (" + std::to_string(at) + ")",
                     "none there");
    entries = le(b, size_t(at) + 32, 8);
    cd_size = le(b, size_t(at) + 40, 8);
    cd_offset = le(b, size_t(at) + 48, 8);
  }
  if (cd_offset > b.size() || cd_size > b.size() - cd_offset)
    return corrupt(name, "central directory", "inside the file (" + std::to_string(b.size()) + " bytes)",
                   std::to_string(cd_size) + " bytes at offset " + std::to_string(cd_offset));
  if (entries > cd_size / kCentralBytes)
    return corrupt(
        name, "central directory",
        "at most " + std::to_string(cd_size / kCentralBytes) + " entries in " + std::to_string(cd_size) + " bytes",
        std::to_string(entries));
  std::vector<Member> members;
  size_t at = size_t(cd_offset);
  const size_t cd_end = size_t(cd_offset + cd_size);
  for (uint64_t i = 0; i < entries; ++i) {
    const std::string where = name + ": central directory entry " + std::to_string(i);
    if (at + kCentralBytes > cd_end || le(b, at, 4) != kCentralSig)
      return corrupt(where, "record", "a central file header", "none at offset " + std::to_string(at));
    Member m;
    m.flags = uint16_t(le(b, at + 8, 2));
    m.method = uint16_t(le(b, at + 10, 2));
    m.crc = uint32_t(le(b, at + 16, 4));
    m.compressed = le(b, at + 20, 4);
    m.size = le(b, at + 24, 4);
    const size_t name_len = size_t(le(b, at + 28, 2)), extra_len = size_t(le(b, at + 30, 2)),
                 comment_len = size_t(le(b, at + 32, 2));
    m.local = le(b, at + 42, 4);
    if (at + kCentralBytes + name_len + extra_len + comment_len > cd_end)
      return corrupt(where, "record", "its name and fields inside the central directory", "past its end");
    m.name = std::string(b.substr(at + kCentralBytes, name_len));
    ASPEN_RETURN_IF_ERROR(read_zip64_extra(b.substr(at + kCentralBytes + name_len, extra_len), m, m.size == 0xffffffff,
                                           m.compressed == 0xffffffff, m.local == 0xffffffff,
                                           where + " ('" + m.name + "')"));
    members.push_back(std::move(m));
    at += kCentralBytes + name_len + extra_len + comment_len;
  }
  if (at != cd_end)  // the count and the size disagree: an entry lost or one too many
    return corrupt(name, "central directory",
                   std::to_string(entries) + " entries filling its " + std::to_string(cd_size) + " bytes",
                   std::to_string(cd_end - at) + " bytes after them");
  return members;
}

}  // namespace

Status npz_member_fits(const std::string& where, uint64_t size, uint64_t stored, double memory_bytes) {
  if (memory_bytes <= 0 || double(size) <= memory_bytes / 2) return Status();
  return Status::error(Code::kFailedPrecondition, where,
                       "an array that fits in half of this machine's memory (" +
                           std::to_string(int64_t(memory_bytes / 2)) + " bytes)",
                       std::to_string(size) + " bytes once inflated (" + std::to_string(stored) + " in the file)");
}

namespace {

// A member's bytes, inflated where deflated, with its CRC-32 checked.
Result<std::string> member_bytes(std::string_view b, const Member& m, const std::string& where) {
  if (m.flags & 1) return Status::error(Code::kUnimplemented, where, "an unencrypted member", "an encrypted one");
  if (m.method != 0 && m.method != 8)
    return Status::error(Code::kUnimplemented, where, "compression method 0 (stored) or 8 (deflate)",
                         "method " + std::to_string(m.method));
  if (m.local > b.size() || b.size() - m.local < kLocalBytes || le(b, size_t(m.local), 4) != kLocalSig)
    return corrupt(where, "local header", "one at offset " + std::to_string(m.local), "none");
  const uint64_t data = m.local + kLocalBytes + le(b, size_t(m.local) + 26, 2) + le(b, size_t(m.local) + 28, 2);
  if (data > b.size() || m.compressed > b.size() - data)
    return corrupt(where, "data", std::to_string(m.compressed) + " bytes inside the file",
                   std::to_string(b.size() > data ? b.size() - data : 0) + " bytes after its header");
  if (m.method == 0 && m.size != m.compressed)
    return corrupt(where, "size", std::to_string(m.compressed) + " bytes (stored: its compressed size)",
                   std::to_string(m.size));
  const uint64_t limit = m.method == 0 ? m.compressed : std::min(kMaxNpzMemberBytes, m.compressed * kMaxDeflateRatio);
  if (m.size > limit || m.size > kMaxNpzMemberBytes)
    return corrupt(where, "size",
                   "at most " + std::to_string(limit) + " bytes (" + std::to_string(m.compressed) +
                       (m.method == 0 ? " stored" : " deflated") + ")",
                   std::to_string(m.size));
  const std::string_view packed = b.substr(size_t(data), size_t(m.compressed));
  // Checked against the machine before inflating: a small member may claim (and hold) tens of GiB, and
  // filling the buffer would end the process (the allocation, or the kernel's OOM killer), not this call.
  ASPEN_RETURN_IF_ERROR(npz_member_fits(where, m.size, m.compressed, physical_memory_bytes()));
  std::string out;
  if (m.method == 0) {
    out = std::string(packed);
  } else {
    try {
      out.resize(size_t(m.size));
    } catch (const std::bad_alloc&) {
      return Status::error(Code::kFailedPrecondition, where, std::to_string(m.size) + " bytes of memory",
                           "the allocation refused");
    }
    z_stream z{};
    if (inflateInit2(&z, -MAX_WBITS) != Z_OK)
      return Status::error(Code::kInternal, where, "zlib's inflate", "no memory");
    z.next_in = reinterpret_cast<Bytef*>(const_cast<char*>(packed.data()));
    z.next_out = reinterpret_cast<Bytef*>(out.data());
    // zlib counts in 32-bit units: hand it at most 1 GiB of input and of output at a time.
    uint64_t in_left = packed.size(), out_left = out.size();
    int rc = Z_OK;
    while (rc == Z_OK) {
      if (z.avail_in == 0 && in_left > 0) {
        z.avail_in = uInt(std::min<uint64_t>(in_left, uint64_t(1) << 30));
        in_left -= z.avail_in;
      }
      if (z.avail_out == 0 && out_left > 0) {
        z.avail_out = uInt(std::min<uint64_t>(out_left, uint64_t(1) << 30));
        out_left -= z.avail_out;
      }
      rc = inflate(&z, Z_NO_FLUSH);  // Z_BUF_ERROR: no progress (the input ended, or the output is full)
    }
    const uint64_t produced = z.total_out;
    inflateEnd(&z);
    if (rc != Z_STREAM_END || produced != m.size)
      return corrupt(where, "deflate stream", std::to_string(m.size) + " bytes, then the stream's end",
                     rc == Z_DATA_ERROR   ? std::string("invalid deflate data")
                     : rc == Z_STREAM_END ? std::to_string(produced) + " bytes"
                                          : "more than " + std::to_string(produced) + " bytes or a truncated stream");
  }
  const uint32_t crc = uint32_t(crc32_z(0L, reinterpret_cast<const Bytef*>(out.data()), out.size()));
  if (crc != m.crc) return corrupt(where, "CRC-32", std::to_string(m.crc), std::to_string(crc));
  return out;
}

void put_le(std::string& out, uint64_t v, int bytes) {
  for (int i = 0; i < bytes; ++i) out += char((v >> (8 * i)) & 0xff);
}

}  // namespace

Result<std::map<std::string, Tensor>> parse_npz(std::string_view b, const std::string& name) {
  ASPEN_ASSIGN_OR_RETURN(const std::vector<Member> members, central_directory(b, name));
  // Members may not share bytes: entries pointing at one deflate stream would multiply what a small file
  // inflates to. Every member's bytes lie inside the file, so in all they are at most 1,032 x its size.
  std::vector<std::pair<uint64_t, size_t>> starts;
  for (size_t i = 0; i < members.size(); ++i) starts.emplace_back(members[i].local, i);
  std::sort(starts.begin(), starts.end());
  for (size_t i = 1; i < starts.size(); ++i) {
    const Member& prev = members[starts[i - 1].second];
    if (starts[i].first < prev.local + kLocalBytes + prev.compressed)
      return corrupt(name + ": member '" + members[starts[i].second].name + "'", "local header offset",
                     "one past the bytes of member '" + prev.name + "'", std::to_string(starts[i].first));
  }
  std::map<std::string, Tensor> arrays;
  for (const Member& m : members) {
    const std::string where = name + ": member '" + m.name + "'";
    if (m.name.size() < 5 || m.name.compare(m.name.size() - 4, 4, ".npy") != 0)
      return corrupt(where, "name", "'<array>.npy' (numpy.savez names every member so)", "'" + m.name + "'");
    ASPEN_ASSIGN_OR_RETURN(const std::string bytes, member_bytes(b, m, where));
    ASPEN_ASSIGN_OR_RETURN(Tensor t, parse_npy(bytes, where));
    if (!arrays.emplace(m.name.substr(0, m.name.size() - 4), std::move(t)).second)
      return corrupt(where, "name", "each array once", "it again");
  }
  if (arrays.empty()) return corrupt(name, "archive", "at least one array", "none");
  return arrays;
}

Result<std::map<std::string, Tensor>> read_npz(const std::string& path) {
  ASPEN_ASSIGN_OR_RETURN(const std::string bytes, read_regular_file(path, kMaxBinaryFileBytes));
  return parse_npz(bytes, path);
}

Status write_npz(const std::string& path, const std::map<std::string, Tensor>& arrays) {
  // Stored members with 32-bit fields: an archive past 4 GiB would need ZIP64 records, which this writer
  // (for tests and small exports) refuses rather than writing a broken file.
  if (arrays.size() > 65535)
    return Status::error(Code::kUnimplemented, path, "at most 65,535 arrays", std::to_string(arrays.size()));
  std::string out, central;
  for (const auto& [key, t] : arrays) {
    const std::string member = key + ".npy", bytes = npy_bytes(t);
    if (member.size() > 65535)
      return Status::invalid_argument(path + ": array '" + key.substr(0, 40) + "...'", "a name of at most 65,531 bytes",
                                      std::to_string(key.size()) + " bytes");
    if (out.size() + bytes.size() + 1024 > std::numeric_limits<uint32_t>::max())
      return Status::error(Code::kUnimplemented, path, "arrays of at most 4 GiB in all (write .npy files instead)",
                           "more");
    const uint32_t crc = uint32_t(crc32_z(0L, reinterpret_cast<const Bytef*>(bytes.data()), bytes.size()));
    const uint64_t local = out.size();
    auto fields = [&](std::string& r) {               // version needed .. name length, shared by both records
      put_le(r, 20, 2);                               // version needed: 2.0
      put_le(r, 0, 2);                                // flags
      put_le(r, 0, 2);                                // method: stored
      put_le(r, 0, 2);                                // time
      put_le(r, (1980 - 1980) << 9 | 1 << 5 | 1, 2);  // date: 1980-01-01 (a fixed one: the same bytes each run)
      put_le(r, crc, 4);
      put_le(r, bytes.size(), 4);
      put_le(r, bytes.size(), 4);
      put_le(r, member.size(), 2);
    };
    put_le(out, kLocalSig, 4);
    fields(out);
    put_le(out, 0, 2);  // extra length
    out += member;
    out += bytes;
    put_le(central, kCentralSig, 4);
    put_le(central, 20, 2);  // version made by
    fields(central);
    put_le(central, 0, 2);  // extra length
    put_le(central, 0, 2);  // comment length
    put_le(central, 0, 2);  // disk
    put_le(central, 0, 2);  // internal attributes
    put_le(central, 0, 4);  // external attributes
    put_le(central, local, 4);
    central += member;
  }
  const uint64_t cd_offset = out.size();
  out += central;
  put_le(out, kEndSig, 4);
  put_le(out, 0, 2);
  put_le(out, 0, 2);
  put_le(out, arrays.size(), 2);
  put_le(out, arrays.size(), 2);
  put_le(out, central.size(), 4);
  put_le(out, cd_offset, 4);
  put_le(out, 0, 2);
  return write_file_atomic(path, out);
}

}  // namespace aspen::io
