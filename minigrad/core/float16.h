// float16: IEEE 754 binary16 (half precision), 1 sign bit, 5 exponent bits and 10 of
// mantissa, stored in 2 bytes. About 3.3 significant decimal digits (unit roundoff 2^-11,
// epsilon 2^-10) but a narrow range: the largest value is 65504, the smallest normal 2^-14
// and the smallest subnormal 2^-24. Gradients smaller than that become 0, which is why
// float16 training scales the loss (nn/grad_scaler.h) and bfloat16 training does not.
//
// minigrad never does arithmetic in float16: a kernel converts each element to float,
// computes in float and rounds once when it stores (as c10::Half). Conversions, as torch's:
//   - float -> float16 rounds to nearest, ties to even, subnormals included (2^-25 is 0,
//     2^-25 * (1 + 2^-10) the smallest subnormal); from 65520 up (the midpoint between
//     65504 and the 65536 float16 cannot hold) it overflows to infinity; infinities stay;
//     a NaN stays a NaN, quiet, with its sign (0x7e00 | sign, as torch).
//   - float16 -> float is exact.
//   - double and int64 -> float16 go through float (two roundings), as torch's do.
#pragma once

#include <cstdint>

#include <fmt/format.h>

#include <minigrad/core/bfloat16.h>  // detail::float_bits, float_from_bits

namespace mg {

namespace detail {
// Fabian Giesen's float_to_half_fast3_rtne (public domain), branch for branch.
inline uint16_t float16_bits_from_float(float value) {
  constexpr uint32_t kFloatInfinity = 255u << 23;
  constexpr uint32_t kHalfOverflow = (127u + 16u) << 23;  // 2^16: past float16's range
  // 0.5 as a float whose mantissa's low 10 bits land where float16's subnormals live.
  constexpr uint32_t kDenormMagic = ((127u - 15u) + (23u - 10u) + 1u) << 23;
  uint32_t u = float_bits(value);
  const uint32_t sign = u & 0x80000000u;
  u ^= sign;
  uint32_t out;
  if (u >= kHalfOverflow) {
    out = u > kFloatInfinity ? 0x7e00u : 0x7c00u;  // NaN stays a (quiet) NaN; inf stays inf
  } else if (u < (113u << 23)) {
    // Below 2^-14: a subnormal or zero. Adding the magic number makes the float adder
    // round the value to float16's subnormal grid (nearest even), then the integer
    // subtraction takes its mantissa bits.
    const float aligned = float_from_bits(u) + float_from_bits(kDenormMagic);
    out = float_bits(aligned) - kDenormMagic;
  } else {
    const uint32_t mantissa_odd = (u >> 13) & 1u;
    u += (static_cast<uint32_t>(15 - 127) << 23) + 0xfffu;  // rebias; half of the dropped unit, less one
    u += mantissa_odd;  // ... plus one when the kept part is odd: ties go to even
    out = u >> 13;      // a carry past 65504 gives 0x7c00, infinity
  }
  return static_cast<uint16_t>(out | (sign >> 16));
}

inline float float_from_float16_bits(uint16_t h) {
  const uint32_t sign = static_cast<uint32_t>(h & 0x8000u) << 16;
  const uint32_t exponent = (h >> 10) & 0x1fu;
  const uint32_t mantissa = h & 0x3ffu;
  if (exponent == 0x1fu) return float_from_bits(sign | 0x7f800000u | (mantissa << 13));  // inf, NaN
  if (exponent == 0) {
    // Zero or a subnormal: mantissa * 2^-24, exact in float.
    const float magnitude = static_cast<float>(mantissa) * 5.9604644775390625e-8f;
    return sign != 0 ? -magnitude : magnitude;
  }
  return float_from_bits(sign | ((exponent + (127u - 15u)) << 23) | (mantissa << 13));
}
}  // namespace detail

struct float16 {
  uint16_t bits;  // uninitialised by default, as a float is

  float16() = default;
  // Rounds to nearest even; double and integers reach it through float, as in torch.
  explicit float16(float value) : bits(detail::float16_bits_from_float(value)) {}
  // Exact.
  operator float() const { return detail::float_from_float16_bits(bits); }  // NOLINT: implicit, as c10::Half

  static float16 from_bits(uint16_t b) {
    float16 v;
    v.bits = b;
    return v;
  }
};

static_assert(sizeof(float16) == 2, "float16 is two bytes");

}  // namespace mg

template <>
struct fmt::formatter<mg::float16> : fmt::formatter<float> {
  template <typename Ctx>
  auto format(mg::float16 v, Ctx& ctx) const {
    return fmt::formatter<float>::format(static_cast<float>(v), ctx);
  }
};
