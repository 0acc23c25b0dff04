#include "core/philox.h"

#include <cmath>

namespace aspen {

namespace {
constexpr uint32_t kMul0 = 0xD2511F53u, kMul1 = 0xCD9E8D57u;
constexpr uint32_t kWeyl0 = 0x9E3779B9u, kWeyl1 = 0xBB67AE85u;

inline void mulhilo(uint32_t a, uint32_t b, uint32_t& hi, uint32_t& lo) {
  uint64_t p = uint64_t(a) * b;
  hi = uint32_t(p >> 32);
  lo = uint32_t(p);
}
}  // namespace

PhiloxBlock philox4x32_10(PhiloxBlock c, std::array<uint32_t, 2> k) {
  for (int round = 0; round < 10; ++round) {
    uint32_t hi0, lo0, hi1, lo1;
    mulhilo(kMul0, c[0], hi0, lo0);
    mulhilo(kMul1, c[2], hi1, lo1);
    c = {hi1 ^ c[1] ^ k[0], lo1, hi0 ^ c[3] ^ k[1], lo0};
    k[0] += kWeyl0;
    k[1] += kWeyl1;
  }
  return c;
}

PhiloxBlock philox_block(uint64_t seed, uint64_t stream, uint64_t block) {
  return philox4x32_10({uint32_t(block), uint32_t(block >> 32), uint32_t(stream), uint32_t(stream >> 32)},
                       {uint32_t(seed), uint32_t(seed >> 32)});
}

uint32_t philox_bits(uint64_t seed, uint64_t stream, uint64_t n) { return philox_block(seed, stream, n / 4)[n % 4]; }

void philox_fill_uniform(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t offset, float lo, float hi) {
  const int64_t n = int64_t(out.size());
  const float scale = hi - lo;
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) out[i] = lo + scale * bits_to_unit_float(philox_bits(seed, stream, offset + i));
}

void philox_fill_normal(std::span<float> out, uint64_t seed, uint64_t stream, uint64_t offset, float mean,
                        float stddev) {
  const int64_t n = int64_t(out.size());
#pragma omp parallel for schedule(static)
  for (int64_t i = 0; i < n; ++i) {
    // u1 in (0, 1] so log is finite.
    double u1 = (double(philox_bits(seed, stream, offset + 2 * i) >> 8) + 1.0) / 16777216.0;
    double u2 = double(philox_bits(seed, stream, offset + 2 * i + 1) >> 8) / 16777216.0;
    out[i] = float(mean + stddev * std::sqrt(-2.0 * std::log(u1)) * std::cos(2.0 * M_PI * u2));
  }
}

}  // namespace aspen
