// Copies, dtype conversions, fills and random numbers on the host.
#include <algorithm>
#include <cstring>

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

template <typename To, typename From>
void convert_typed(const Tensor& dst, const Tensor& src) {
  To* d = static_cast<To*>(dst.data_ptr());
  const From* s = static_cast<const From*>(src.data_ptr());
  cpu::for_each_element<2>(dst.shape(), {&dst.strides(), &src.strides()},
                           [&](const std::array<int64_t, 2>& o) { d[o[0]] = static_cast<To>(s[o[1]]); });
}

// The second dispatch, on the source's dtype, in a scope of its own (scalar_t once per scope).
template <typename To>
void convert_to(const Tensor& dst, const Tensor& src) {
  MG_DISPATCH_ALL_TYPES(src.dtype(), "to", [&] { convert_typed<To, scalar_t>(dst, src); });
}
}  // namespace

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  MG_DISPATCH_ALL_TYPES(dst.dtype(), "copy", [&] { copy_typed<scalar_t>(dst, src); });
}

void CpuBackend::convert(const Tensor& dst, const Tensor& src) {
  MG_DISPATCH_ALL_TYPES(dst.dtype(), "to", [&] { convert_to<scalar_t>(dst, src); });
}

void CpuBackend::fill(const Tensor& dst, double value) {
  const auto n = static_cast<size_t>(dst.numel());
  MG_DISPATCH_ALL_TYPES(dst.dtype(), "fill", [&] {
    std::fill_n(static_cast<scalar_t*>(dst.data_ptr()), n, static_cast<scalar_t>(value));
  });
}

void CpuBackend::arange(const Tensor& dst, double start, double step) {
  const int64_t n = dst.numel();
  MG_DISPATCH_ALL_TYPES(dst.dtype(), "arange", [&] {
    auto* d = static_cast<scalar_t*>(dst.data_ptr());
    for (int64_t i = 0; i < n; ++i)
      d[i] = static_cast<scalar_t>(start + step * static_cast<double>(i));
  });
}

// Float64 tensors take the same float32 draws widened (the stream of numbers does not
// depend on the dtype), so a float64 tensor made after manual_seed holds the values of
// the float32 one made the same way.
void CpuBackend::random_uniform(const Tensor& dst, double low, double high, uint64_t seed,
                                uint64_t offset) {
  const auto n = static_cast<uint64_t>(dst.numel());
  MG_DISPATCH_FLOATING_TYPES(dst.dtype(), "uniform_", [&] {
    auto* d = static_cast<scalar_t*>(dst.data_ptr());
    const auto lo = static_cast<scalar_t>(low), span = static_cast<scalar_t>(high - low);
    for (uint64_t i = 0; i < n; ++i)
      d[i] = lo + span * static_cast<scalar_t>(philox::uniform(seed, offset, i));
  });
}

void CpuBackend::random_normal(const Tensor& dst, double mean, double stddev, uint64_t seed,
                               uint64_t offset) {
  const auto n = static_cast<uint64_t>(dst.numel());
  MG_DISPATCH_FLOATING_TYPES(dst.dtype(), "normal_", [&] {
    auto* d = static_cast<scalar_t*>(dst.data_ptr());
    const auto m = static_cast<scalar_t>(mean), s = static_cast<scalar_t>(stddev);
    for (uint64_t i = 0; i < n; ++i)
      d[i] = m + s * static_cast<scalar_t>(philox::normal(seed, offset, i));
  });
}

}  // namespace mg
