// Overflow-checked int64 arithmetic for sizes, starts, lengths, strides and offsets that
// come from a caller. Signed overflow is undefined behaviour in C++, and in index
// arithmetic it is worse than a crash: `start + length <= size` wraps to a negative sum,
// passes the check, and the view that follows reads or writes outside its storage. So
// every sum or product of user-given int64s goes through these helpers, which throw an
// mg::Error naming the operation and the values instead of wrapping.
#pragma once

#include <cstdint>

#include <minigrad/core/error.h>

namespace mg {

// a + b, or an mg::Error "<op>: integer overflow: a + b does not fit in int64".
inline int64_t checked_add(int64_t a, int64_t b, const char* op) {
  int64_t out;
  MG_CHECK(!__builtin_add_overflow(a, b, &out),
           "{}: integer overflow: {} + {} does not fit in int64", op, a, b);
  return out;
}

inline int64_t checked_sub(int64_t a, int64_t b, const char* op) {
  int64_t out;
  MG_CHECK(!__builtin_sub_overflow(a, b, &out),
           "{}: integer overflow: {} - {} does not fit in int64", op, a, b);
  return out;
}

inline int64_t checked_mul(int64_t a, int64_t b, const char* op) {
  int64_t out;
  MG_CHECK(!__builtin_mul_overflow(a, b, &out),
           "{}: integer overflow: {} * {} does not fit in int64", op, a, b);
  return out;
}

// True when a + b (a * b) would overflow int64: for checks that report the problem in
// their own words (e.g. "start and length are out of range for dimension 0 of size 1000").
inline bool add_overflows(int64_t a, int64_t b) {
  int64_t out;
  return __builtin_add_overflow(a, b, &out);
}
inline bool mul_overflows(int64_t a, int64_t b) {
  int64_t out;
  return __builtin_mul_overflow(a, b, &out);
}

// ceil(a / b) for a >= 0 and b > 0, without the (a + b - 1) that overflows for a large b
// (chunk(x, INT64_MAX), a batch size of INT64_MAX).
inline int64_t ceil_div(int64_t a, int64_t b) { return a / b + (a % b != 0 ? 1 : 0); }

// A double that a caller wants stored in, or used as, an int64 (a fill value, a scalar
// operand, an arange bound): refused unless finite and within [-2^63, 2^63), where the
// conversion is defined; PyTorch's "value cannot be converted to type int64_t without
// overflow". Returns the value truncated toward zero.
inline int64_t checked_int64(double value, const char* op) {
  // -2^63 is exactly representable as a double; 2^63 is the first value past the range.
  MG_CHECK(value >= -9223372036854775808.0 && value < 9223372036854775808.0,
           "{}: value {} cannot be converted to type int64 without overflow", op, value);
  return static_cast<int64_t>(value);
}

}  // namespace mg
