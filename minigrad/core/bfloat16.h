// bfloat16: float32's sign and 8-bit exponent with 7 bits of mantissa, stored in 2 bytes
// (what Google's TPUs, NVIDIA's tensor cores since Ampere and the AVX512-BF16 units
// multiply). It is float32 with the low 16 bits cut off, so it has float32's range (no
// overflow where float32 has none, subnormals included) and about 3 significant decimal
// digits: the unit roundoff is 2^-8, the gap from 1 to the next number (epsilon) 2^-7.
//
// minigrad never does arithmetic in bfloat16: a kernel converts each element to float,
// computes in float and rounds once when it stores (c10::BFloat16 does the same).
// Conversions, as torch's:
//   - float -> bfloat16 rounds to nearest, ties to even (1 + 2^-8 is 1; 1 + 3 * 2^-8 is
//     1 + 2^-6); a finite float beyond the largest bfloat16 (3.3895e38) rounds to
//     infinity, float32's largest value included; a NaN stays a NaN, made quiet, its sign
//     and leading payload bits kept; infinities stay infinities.
//   - bfloat16 -> float is exact (the 16 bits become the high half).
//   - double and int64 -> bfloat16 go through float (two roundings), as torch's do.
#pragma once

#include <cstdint>
#include <cstring>

#include <fmt/format.h>

namespace mg {

namespace detail {
inline uint32_t float_bits(float f) {
  uint32_t u;
  std::memcpy(&u, &f, sizeof u);
  return u;
}
inline float float_from_bits(uint32_t u) {
  float f;
  std::memcpy(&f, &u, sizeof f);
  return f;
}

inline uint16_t bfloat16_bits_from_float(float f) {
  const uint32_t u = float_bits(f);
  // NaN: keep the sign and the top of the payload, set the quiet bit (a truncated payload
  // of zeros would otherwise read as infinity).
  if ((u & 0x7fffffffu) > 0x7f800000u) return static_cast<uint16_t>((u >> 16) | 0x0040u);
  // Round to nearest even: add just under half of the dropped part's unit, plus one when
  // the kept part is odd, and let the carry run into the exponent (up to infinity).
  const uint32_t rounding_bias = 0x7fffu + ((u >> 16) & 1u);
  return static_cast<uint16_t>((u + rounding_bias) >> 16);
}
inline float float_from_bfloat16_bits(uint16_t b) { return float_from_bits(uint32_t{b} << 16); }
}  // namespace detail

struct bfloat16 {
  uint16_t bits;  // uninitialised by default, as a float is

  bfloat16() = default;
  // Rounds to nearest even; double and integers reach it through float, as in torch.
  explicit bfloat16(float value) : bits(detail::bfloat16_bits_from_float(value)) {}
  // Exact.
  operator float() const { return detail::float_from_bfloat16_bits(bits); }  // NOLINT: implicit, as c10::BFloat16

  static bfloat16 from_bits(uint16_t b) {
    bfloat16 v;
    v.bits = b;
    return v;
  }
};

static_assert(sizeof(bfloat16) == 2, "bfloat16 is two bytes");

}  // namespace mg

template <>
struct fmt::formatter<mg::bfloat16> : fmt::formatter<float> {
  template <typename Ctx>
  auto format(mg::bfloat16 v, Ctx& ctx) const {
    return fmt::formatter<float>::format(static_cast<float>(v), ctx);
  }
};
