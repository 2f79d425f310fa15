// Shape: the sizes of a tensor's dimensions, printed as [2, 3].
#pragma once

#include <cstdint>
#include <initializer_list>
#include <string>
#include <vector>

#include <fmt/format.h>

namespace mg {

class Shape {
 public:
  Shape() = default;
  Shape(std::initializer_list<int64_t> sizes) : sizes_(sizes) {}
  explicit Shape(std::vector<int64_t> sizes) : sizes_(std::move(sizes)) {}

  int64_t dim() const { return static_cast<int64_t>(sizes_.size()); }
  // The product of the sizes; an mg::Error if it overflows int64 (a Shape can hold any
  // sizes until a tensor is made of it: checked_numel below says what a tensor allows).
  int64_t numel() const;
  int64_t operator[](int64_t d) const { return sizes_[static_cast<size_t>(d)]; }
  int64_t& operator[](int64_t d) { return sizes_[static_cast<size_t>(d)]; }
  const std::vector<int64_t>& sizes() const { return sizes_; }
  std::vector<int64_t>::const_iterator begin() const { return sizes_.begin(); }
  std::vector<int64_t>::const_iterator end() const { return sizes_.end(); }
  std::string str() const;

  bool operator==(const Shape& o) const { return sizes_ == o.sizes_; }
  bool operator!=(const Shape& o) const { return sizes_ != o.sizes_; }

 private:
  std::vector<int64_t> sizes_;
};

// Row-major strides of a contiguous tensor of this shape.
std::vector<int64_t> contiguous_strides(const Shape& shape);

// The number of elements of a tensor of this shape, after checking that the shape can
// be one: no negative size, and the product of the sizes with each 0 counted as 1 (what
// the strides multiply) fits in int64. An mg::Error naming `op` and the shape otherwise.
int64_t checked_numel(const Shape& shape, const char* op);

// Wraps a possibly negative dimension index into [0, ndim); names `op` in the error.
int64_t wrap_dim(int64_t dim, int64_t ndim, const char* op);

// The shape two shapes broadcast to (numpy rules), or an mg::Error naming `op`.
Shape broadcast_shapes(const Shape& a, const Shape& b, const char* op);

}  // namespace mg

template <>
struct fmt::formatter<mg::Shape> : fmt::formatter<std::string_view> {
  template <typename Ctx>
  auto format(const mg::Shape& s, Ctx& ctx) const {
    return fmt::formatter<std::string_view>::format(s.str(), ctx);
  }
};
