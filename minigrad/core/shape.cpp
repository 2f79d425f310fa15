#include <minigrad/core/shape.h>

#include <algorithm>

#include <fmt/ranges.h>

#include <minigrad/core/error.h>

namespace mg {

int64_t Shape::numel() const {
  int64_t n = 1;
  for (int64_t s : sizes_)
    MG_CHECK(!__builtin_mul_overflow(n, s, &n),
             "numel: the shape {} has more elements than int64 can count", str());
  return n;
}

int64_t checked_numel(const Shape& shape, const char* op) {
  int64_t extent = 1;
  for (int64_t s : shape) {
    MG_CHECK(s >= 0, "{}: invalid size {} in shape {} (sizes must be >= 0)", op, s, shape);
    MG_CHECK(!__builtin_mul_overflow(extent, std::max<int64_t>(s, 1), &extent),
             "{}: shape {} is too large: the product of its sizes overflows int64", op, shape);
  }
  return shape.numel();
}

std::string Shape::str() const { return fmt::format("[{}]", fmt::join(sizes_, ", ")); }

std::vector<int64_t> contiguous_strides(const Shape& shape) {
  std::vector<int64_t> strides(static_cast<size_t>(shape.dim()));
  int64_t stride = 1;
  for (int64_t d = shape.dim() - 1; d >= 0; --d) {
    strides[static_cast<size_t>(d)] = stride;
    MG_CHECK(d == 0 || !__builtin_mul_overflow(stride, std::max<int64_t>(shape[d], 1), &stride),
             "contiguous_strides: the strides of shape {} overflow int64", shape);
  }
  return strides;
}

int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op) {
  const int64_t lo = ndim == 0 ? -1 : -ndim;
  const int64_t hi = ndim == 0 ? 0 : ndim - 1;
  MG_CHECK(dim >= lo && dim <= hi,
           "{}: dimension {} out of range for a tensor of {} dimensions (expected [{}, {}])", op,
           dim, ndim, lo, hi);
  return dim < 0 ? dim + std::max<int64_t>(ndim, 1) : dim;
}

Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op) {
  const int64_t n = std::max(a.dim(), b.dim());
  std::vector<int64_t> out(static_cast<size_t>(n));
  for (int64_t i = 0; i < n; ++i) {
    const int64_t da = i - (n - a.dim()), db = i - (n - b.dim());
    const int64_t sa = da >= 0 ? a[da] : 1, sb = db >= 0 ? b[db] : 1;
    MG_CHECK(sa == sb || sa == 1 || sb == 1,
             "{}: shapes {} and {} do not broadcast (dimension {}: {} vs {})", op, a, b, i, sa,
             sb);
    out[static_cast<size_t>(i)] = sa == 1 ? sb : sa;
  }
  return Shape(std::move(out));
}

}  // namespace mg
