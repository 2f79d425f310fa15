// Copies, dtype conversions, fills and random numbers on the host. bfloat16 and float16
// convert through float (core/bfloat16.h, core/float16.h): a fill or a random draw is
// computed as float32's and rounded once.
#include <algorithm>
#include <cmath>
#include <cstring>
#include <type_traits>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/strided_loop.h>
#include <minigrad/core/dispatch.h>
#include <minigrad/core/philox.h>

namespace mg {

namespace {
template <typename T>
void copy_typed(const Tensor& dst, const Tensor& src) {
  T* d = static_cast<T*>(dst.data_ptr());
  const T* s = static_cast<const T*>(src.data_ptr());
  if (dst.is_contiguous() && src.is_contiguous()) {
    std::memcpy(d, s, static_cast<size_t>(dst.numel()) * sizeof(T));
    return;
  }
  cpu::for_each_element<2>(dst.shape(), {&dst.strides(), &src.strides()},
                           [&](const std::array<int64_t, 2>& o) { d[o[0]] = s[o[1]]; });
}

// A 16-bit float goes to and from every other type through float (exact one way, one
// rounding the other), as torch's conversions do.
template <typename To, typename From>
To convert_value(From x) {
  if constexpr (std::is_same_v<To, From>) {
    return x;
  } else if constexpr (is_reduced_float(dtype_of<From>())) {
    return static_cast<To>(static_cast<float>(x));
  } else if constexpr (is_reduced_float(dtype_of<To>())) {
    return To(static_cast<float>(x));
  } else {
    return static_cast<To>(x);
  }
}

template <typename To, typename From>
void convert_typed(const Tensor& dst, const Tensor& src) {
  To* d = static_cast<To*>(dst.data_ptr());
  const From* s = static_cast<const From*>(src.data_ptr());
  if (dst.is_contiguous() && src.is_contiguous()) {
    const int64_t n = dst.numel();
    for (int64_t i = 0; i < n; ++i) d[i] = convert_value<To>(s[i]);
    return;
  }
  cpu::for_each_element<2>(dst.shape(), {&dst.strides(), &src.strides()},
                           [&](const std::array<int64_t, 2>& o) { d[o[0]] = convert_value<To>(s[o[1]]); });
}

// The second dispatch, on the source's dtype, in a scope of its own (scalar_t once per scope).
template <typename To>
void convert_to(const Tensor& dst, const Tensor& src) {
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(src.dtype(), "to", [&] { convert_typed<To, scalar_t>(dst, src); });
}
}  // namespace

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(dst.dtype(), "copy", [&] { copy_typed<scalar_t>(dst, src); });
}

void CpuBackend::convert(const Tensor& dst, const Tensor& src) {
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(dst.dtype(), "to", [&] { convert_to<scalar_t>(dst, src); });
}

void CpuBackend::fill(const Tensor& dst, double value) {
  const auto n = static_cast<size_t>(dst.numel());
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(dst.dtype(), "fill", [&] {
    std::fill_n(static_cast<scalar_t*>(dst.data_ptr()), n, convert_value<scalar_t>(value));
  });
}

void CpuBackend::arange(const Tensor& dst, double start, double step) {
  const int64_t n = dst.numel();
  MG_DISPATCH_ALL_TYPES_AND_REDUCED(dst.dtype(), "arange", [&] {
    auto* d = static_cast<scalar_t*>(dst.data_ptr());
    for (int64_t i = 0; i < n; ++i)
      d[i] = convert_value<scalar_t>(start + step * static_cast<double>(i));
  });
}

// Float64 tensors take the same float32 draws widened (the stream of numbers does not
// depend on the dtype), so a float64 tensor made after manual_seed holds the values of
// the float32 one made the same way; bfloat16 and float16 ones hold the float32 values
// rounded.
void CpuBackend::random_uniform(const Tensor& dst, double low, double high, uint64_t seed,
                                uint64_t offset) {
  const auto n = static_cast<uint64_t>(dst.numel());
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(dst.dtype(), "uniform_", [&] {
    using C = compute_t<scalar_t>;
    auto* d = static_cast<scalar_t*>(dst.data_ptr());
    const auto lo = static_cast<C>(low), span = static_cast<C>(high - low);
    for (uint64_t i = 0; i < n; ++i)
      d[i] = scalar_t(lo + span * static_cast<C>(philox::uniform(seed, offset, i)));
  });
}

void CpuBackend::random_normal(const Tensor& dst, double mean, double stddev, uint64_t seed,
                               uint64_t offset) {
  const auto n = static_cast<uint64_t>(dst.numel());
  MG_DISPATCH_FLOATING_TYPES_AND_REDUCED(dst.dtype(), "normal_", [&] {
    using C = compute_t<scalar_t>;
    auto* d = static_cast<scalar_t*>(dst.data_ptr());
    const auto m = static_cast<C>(mean), s = static_cast<C>(stddev);
    for (uint64_t i = 0; i < n; ++i)
      d[i] = scalar_t(m + s * static_cast<C>(philox::normal(seed, offset, i)));
  });
}

namespace {
// The 16-bit values either side of a finite float x of magnitude a (bits of T), by
// magnitude: nearest rounding gives one; the other is one step away in the bit pattern
// (magnitudes of one sign are ordered as their bits are).
template <typename T>
T round_stochastic_value(float x, float u) {
  const T nearest(x);
  const float n = static_cast<float>(nearest);
  if (n == x || !std::isfinite(x) || !std::isfinite(n)) return nearest;
  const float a = std::fabs(x);
  const auto nearest_bits = static_cast<uint16_t>(T(a).bits);
  const float na = static_cast<float>(T::from_bits(nearest_bits));
  const uint16_t lo_bits = na > a ? static_cast<uint16_t>(nearest_bits - 1) : nearest_bits;
  const float lo = static_cast<float>(T::from_bits(lo_bits));
  const float hi = static_cast<float>(T::from_bits(static_cast<uint16_t>(lo_bits + 1)));
  if (!std::isfinite(hi)) return T(std::copysign(lo, x));  // past the largest finite: stay there
  // Up with probability (a - lo) / (hi - lo), computed in double (exact for these widths).
  const double p_up = (static_cast<double>(a) - lo) / (static_cast<double>(hi) - lo);
  const float magnitude = static_cast<double>(u) < p_up ? hi : lo;
  return T(std::copysign(magnitude, x));
}
}  // namespace

void CpuBackend::round_stochastic(const Tensor& out, const Tensor& in, uint64_t seed,
                                  uint64_t offset) {
  const auto n = static_cast<uint64_t>(out.numel());
  const float* x = static_cast<const float*>(in.data_ptr());
  if (out.dtype() == DType::BFloat16) {
    auto* o = static_cast<bfloat16*>(out.data_ptr());
    for (uint64_t i = 0; i < n; ++i) o[i] = round_stochastic_value<bfloat16>(x[i], philox::uniform(seed, offset, i));
  } else {
    auto* o = static_cast<float16*>(out.data_ptr());
    for (uint64_t i = 0; i < n; ++i) o[i] = round_stochastic_value<float16>(x[i], philox::uniform(seed, offset, i));
  }
}

}  // namespace mg
