// Copies, fills and random numbers on the host.
#include <algorithm>
#include <cstring>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/strided_loop.h>
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
}  // namespace

void CpuBackend::copy(const Tensor& dst, const Tensor& src) {
  if (dst.dtype() == DType::Float32) {
    copy_typed<float>(dst, src);
  } else {
    copy_typed<int64_t>(dst, src);
  }
}

void CpuBackend::fill(const Tensor& dst, double value) {
  const auto n = static_cast<size_t>(dst.numel());
  if (dst.dtype() == DType::Float32) {
    std::fill_n(static_cast<float*>(dst.data_ptr()), n, static_cast<float>(value));
  } else {
    std::fill_n(static_cast<int64_t*>(dst.data_ptr()), n, static_cast<int64_t>(value));
  }
}

void CpuBackend::arange(const Tensor& dst, double start, double step) {
  const int64_t n = dst.numel();
  if (dst.dtype() == DType::Float32) {
    auto* d = static_cast<float*>(dst.data_ptr());
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<float>(start + step * static_cast<double>(i));
  } else {
    auto* d = static_cast<int64_t*>(dst.data_ptr());
    for (int64_t i = 0; i < n; ++i) d[i] = static_cast<int64_t>(start + step * static_cast<double>(i));
  }
}

void CpuBackend::random_uniform(const Tensor& dst, double low, double high, uint64_t seed,
                                uint64_t offset) {
  auto* d = static_cast<float*>(dst.data_ptr());
  const auto lo = static_cast<float>(low), span = static_cast<float>(high - low);
  const auto n = static_cast<uint64_t>(dst.numel());
  for (uint64_t i = 0; i < n; ++i) d[i] = lo + span * philox::uniform(seed, offset, i);
}

void CpuBackend::random_normal(const Tensor& dst, double mean, double stddev, uint64_t seed,
                               uint64_t offset) {
  auto* d = static_cast<float*>(dst.data_ptr());
  const auto m = static_cast<float>(mean), s = static_cast<float>(stddev);
  const auto n = static_cast<uint64_t>(dst.numel());
  for (uint64_t i = 0; i < n; ++i) d[i] = m + s * philox::normal(seed, offset, i);
}

}  // namespace mg
