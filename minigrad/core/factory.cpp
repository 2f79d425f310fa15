// Creating tensors: empty, filled, ranges, from host vectors, random.
#include <cmath>

#include <minigrad/core/backend.h>
#include <minigrad/core/checked_math.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>

namespace mg {

Tensor empty(const Shape& shape, DType dtype, Device device) {
  // Strides multiply the sizes (a 0 counted as 1), so that product must fit in int64 even
  // when the tensor is empty.
  int64_t extent = static_cast<int64_t>(element_size(dtype));
  for (int64_t s : shape) {
    MG_CHECK(s >= 0, "empty: negative size in shape {}", shape);
    MG_CHECK(!__builtin_mul_overflow(extent, std::max<int64_t>(s, 1), &extent),
             "empty: shape {} of {} is impossibly large (its byte size overflows int64)", shape,
             dtype);
  }
  // extent bounds numel * element size, so the byte count below cannot overflow.
  Storage storage(static_cast<size_t>(shape.numel()) * element_size(dtype), device);
  return Tensor(std::make_shared<TensorImpl>(std::move(storage), shape,
                                             contiguous_strides(shape), 0, dtype));
}

Tensor full(const Shape& shape, double value, DType dtype, Device device) {
  if (dtype == DType::Int64) checked_int64(value, "full");
  Tensor t = empty(shape, dtype, device);
  if (t.numel() > 0) backend(device).fill(t, value);
  return t;
}

Tensor zeros(const Shape& shape, DType dtype, Device device) {
  return full(shape, 0.0, dtype, device);
}
Tensor ones(const Shape& shape, DType dtype, Device device) {
  return full(shape, 1.0, dtype, device);
}
Tensor zeros_like(const Tensor& t) { return zeros(t.shape(), t.dtype(), t.device()); }
Tensor ones_like(const Tensor& t) { return ones(t.shape(), t.dtype(), t.device()); }
Tensor empty_like(const Tensor& t) { return empty(t.shape(), t.dtype(), t.device()); }
Tensor scalar_tensor(double value, DType dtype, Device device) {
  return full(Shape{}, value, dtype, device);
}

Tensor arange(double end, DType dtype, Device device) {
  return arange(0.0, end, 1.0, dtype, device);
}

Tensor arange(double start, double end, double step, DType dtype, Device device) {
  MG_CHECK(std::isfinite(start) && std::isfinite(end) && std::isfinite(step),
           "arange: start, end and step must be finite, got start={}, end={}, step={}", start,
           end, step);
  MG_CHECK(step != 0.0, "arange: step must be non-zero");
  // The length as a double first: (end - start) / step can exceed any int64 (and the
  // conversion of such a double is undefined behaviour).
  const double span = std::ceil((end - start) / step);
  MG_CHECK(span < 9223372036854775808.0,
           "arange: start={}, end={}, step={} give {} elements, more than int64 can count",
           start, end, step, span);
  const auto n = static_cast<int64_t>(std::max(0.0, span));
  // int64 values: the first and the last must convert (the ones between lie inside).
  if (dtype == DType::Int64 && n > 0) {
    checked_int64(start, "arange");
    checked_int64(start + step * static_cast<double>(n - 1), "arange");
  }
  Tensor t = empty(Shape{n}, dtype, device);
  if (n > 0) backend(device).arange(t, start, step);
  return t;
}

namespace {
template <typename T>
Tensor from_host(const std::vector<T>& values, const Shape& shape, Device device) {
  MG_CHECK(static_cast<int64_t>(values.size()) == shape.numel(),
           "from_vector: {} values cannot fill shape {} ({} elements)", values.size(), shape,
           shape.numel());
  Tensor host = empty(shape, dtype_of<T>(), Device::cpu());
  std::copy(values.begin(), values.end(), host.data<T>());
  return device.is_cpu() ? host : ops::copy_to(host, device);
}
}  // namespace

Tensor from_vector(const std::vector<float>& values, const Shape& shape, Device device) {
  return from_host(values, shape, device);
}
Tensor from_vector(const std::vector<double>& values, const Shape& shape, Device device) {
  return from_host(values, shape, device);
}
Tensor from_vector(const std::vector<int64_t>& values, const Shape& shape, Device device) {
  return from_host(values, shape, device);
}
Tensor from_vector(const std::vector<bfloat16>& values, const Shape& shape, Device device) {
  return from_host(values, shape, device);
}
Tensor from_vector(const std::vector<float16>& values, const Shape& shape, Device device) {
  return from_host(values, shape, device);
}
Tensor from_vector(const std::vector<float>& values, const Shape& shape, DType dtype,
                   Device device) {
  MG_CHECK(is_floating_point(dtype), "from_vector: float values cannot make a {} tensor", dtype);
  return ops::to_dtype(from_host(values, shape, device), dtype);
}

Tensor rand(const Shape& shape, Device device) {
  Tensor t = empty(shape, DType::Float32, device);
  const auto draw = default_generator().reserve((static_cast<uint64_t>(t.numel()) + 3) / 4);
  if (t.numel() > 0) backend(device).random_uniform(t, 0.0, 1.0, draw.seed, draw.offset);
  return t;
}

Tensor randn(const Shape& shape, Device device) {
  Tensor t = empty(shape, DType::Float32, device);
  const auto draw = default_generator().reserve((static_cast<uint64_t>(t.numel()) + 1) / 2);
  if (t.numel() > 0) backend(device).random_normal(t, 0.0, 1.0, draw.seed, draw.offset);
  return t;
}

Tensor randint(int64_t low, int64_t high, const Shape& shape, Device device) {
  MG_CHECK(low < high, "randint: expected low < high, got [{}, {})", low, high);
  // Uniform floats scaled to the range, drawn on the host so that any range is exact.
  Tensor u = rand(shape, Device::cpu());
  std::vector<int64_t> values(static_cast<size_t>(u.numel()));
  const float* p = u.data<float>();
  // high - low can exceed INT64_MAX (randint(INT64_MIN, INT64_MAX)): the span and the
  // offsets from low are unsigned, where they always fit, and wrap back into int64.
  const uint64_t span = static_cast<uint64_t>(high) - static_cast<uint64_t>(low);
  for (size_t i = 0; i < values.size(); ++i) {
    // u < 1, so u * span < span <= 2^64 - 1: the conversion is defined; the min guards
    // the rounding of u * span up to span itself.
    const auto step = static_cast<uint64_t>(static_cast<double>(p[i]) * static_cast<double>(span));
    values[i] = static_cast<int64_t>(static_cast<uint64_t>(low) + std::min(step, span - 1));
  }
  return from_vector(values, shape, device);
}

}  // namespace mg
