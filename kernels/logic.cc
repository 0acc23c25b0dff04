#include "kernels/logic.h"

#include <string>

#include "kernels/check_args.h"

namespace aspen::kernels {

namespace {

constexpr int64_t kParallelMin = 1 << 15;  // below this, the calling thread runs the loop

Status check(const char* k, int64_t N) { return check_extent(k, "N", N); }

template <class T, class F>
void map2(const T* a, const T* b, uint8_t* y, int64_t N, F f) {
#pragma omp parallel for simd schedule(static) if (N >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) y[i] = uint8_t(f(a[i], b[i]));
}

}  // namespace

template <class T>
Status compare_forward(Compare op, std::span<const T> a, std::span<const T> b, std::span<uint8_t> y, int64_t N) {
  constexpr const char* k = "compare_forward";
  ASPEN_RETURN_IF_ERROR(check(k, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "a", a, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "b", b, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  switch (op) {
    case Compare::equal:
      map2(a.data(), b.data(), y.data(), N, [](T p, T q) { return p == q; });
      return Status();
    case Compare::less:
      map2(a.data(), b.data(), y.data(), N, [](T p, T q) { return p < q; });
      return Status();
    case Compare::greater:
      map2(a.data(), b.data(), y.data(), N, [](T p, T q) { return p > q; });
      return Status();
  }
  return Status::invalid_argument(std::string(k) + ": op", "equal, less or greater", std::to_string(int(op)));
}

template Status compare_forward<float>(Compare, std::span<const float>, std::span<const float>, std::span<uint8_t>,
                                       int64_t);
template Status compare_forward<int32_t>(Compare, std::span<const int32_t>, std::span<const int32_t>,
                                         std::span<uint8_t>, int64_t);
template Status compare_forward<int64_t>(Compare, std::span<const int64_t>, std::span<const int64_t>,
                                         std::span<uint8_t>, int64_t);
template Status compare_forward<uint8_t>(Compare, std::span<const uint8_t>, std::span<const uint8_t>,
                                         std::span<uint8_t>, int64_t);

Status logic_forward(Logic op, std::span<const uint8_t> a, std::span<const uint8_t> b, std::span<uint8_t> y,
                     int64_t N) {
  constexpr const char* k = "logic_forward";
  ASPEN_RETURN_IF_ERROR(check(k, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "a", a, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "b", b, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  if (op == Logic::logical_and)
    map2(a.data(), b.data(), y.data(), N, [](uint8_t p, uint8_t q) { return p != 0 && q != 0; });
  else
    map2(a.data(), b.data(), y.data(), N, [](uint8_t p, uint8_t q) { return p != 0 || q != 0; });
  return Status();
}

Status not_forward(std::span<const uint8_t> x, std::span<uint8_t> y, int64_t N) {
  constexpr const char* k = "not_forward";
  ASPEN_RETURN_IF_ERROR(check(k, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  const uint8_t* in = x.data();
  uint8_t* out = y.data();
#pragma omp parallel for simd schedule(static) if (N >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) out[i] = uint8_t(in[i] == 0);
  return Status();
}

Status is_nan_forward(std::span<const float> x, std::span<uint8_t> y, int64_t N) {
  constexpr const char* k = "is_nan_forward";
  ASPEN_RETURN_IF_ERROR(check(k, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "x", x, N));
  ASPEN_RETURN_IF_ERROR(check_buffer(k, "y", y, N));
  const float* in = x.data();
  uint8_t* out = y.data();
#pragma omp parallel for simd schedule(static) if (N >= kParallelMin)
  for (int64_t i = 0; i < N; ++i) out[i] = uint8_t(in[i] != in[i]);
  return Status();
}

}  // namespace aspen::kernels
