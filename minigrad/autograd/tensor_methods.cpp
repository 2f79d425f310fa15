// Tensor's differentiable methods (declared in core/tensor.h) forward to the functions
// of autograd/functions.h; backward() starts the engine; the in-place methods update
// values outside the graph, for optimizers and initialisation.
#include <string>
#include <vector>

#include <minigrad/autograd/engine.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/checked_math.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>

namespace mg {

Tensor Tensor::to(Device device) const { return mg::to(*this, device); }
Tensor Tensor::to(DType dtype) const { return mg::to(*this, dtype); }
Tensor Tensor::reshape(const Shape& shape) const { return mg::reshape(*this, shape); }
Tensor Tensor::view(const Shape& shape) const { return mg::view(*this, shape); }
Tensor Tensor::transpose(int64_t dim0, int64_t dim1) const {
  return mg::transpose(*this, dim0, dim1);
}
Tensor Tensor::t() const {
  MG_CHECK(dim() <= 2, "t: expects a tensor with at most 2 dimensions, got shape {}", shape());
  return dim() < 2 ? *this : mg::transpose(*this, 0, 1);
}
Tensor Tensor::narrow(int64_t d, int64_t start, int64_t length) const {
  return mg::narrow(*this, d, start, length);
}
Tensor Tensor::contiguous() const { return mg::contiguous(*this); }
Tensor Tensor::expand(const Shape& shape) const { return mg::expand(*this, shape); }
Tensor Tensor::sum() const { return mg::sum(*this); }
Tensor Tensor::sum(const std::vector<int64_t>& dims, bool keepdim) const {
  return mg::sum(*this, dims, keepdim);
}
Tensor Tensor::mean() const { return mg::mean(*this); }
Tensor Tensor::mean(const std::vector<int64_t>& dims, bool keepdim) const {
  return mg::mean(*this, dims, keepdim);
}
Tensor Tensor::matmul(const Tensor& other) const { return mg::matmul(*this, other); }
Tensor Tensor::relu() const { return mg::relu(*this); }
Tensor Tensor::exp() const { return mg::exp(*this); }
Tensor Tensor::log() const { return mg::log(*this); }
Tensor Tensor::neg() const { return mg::neg(*this); }
Tensor Tensor::log_softmax(int64_t d) const { return mg::log_softmax(*this, d); }
Tensor Tensor::softmax(int64_t d) const { return mg::softmax(*this, d); }
Tensor Tensor::tanh() const { return mg::tanh(*this); }
Tensor Tensor::permute(const std::vector<int64_t>& dims) const { return mg::permute(*this, dims); }
Tensor Tensor::argmax(int64_t d) const { return ops::argmax(*this, d); }

void Tensor::backward(const Tensor& gradient, bool retain_graph) const {
  Tensor seed = gradient;
  if (!seed.defined()) {
    MG_CHECK(numel() == 1,
             "backward: grad can be implicitly created only for scalar outputs, but this "
             "tensor has shape {}; pass a gradient of that shape",
             shape());
    seed = ones(shape(), dtype(), device());
  } else {
    MG_CHECK(seed.shape() == shape() && seed.device() == device() && seed.dtype() == dtype(),
             "backward: gradient of shape {} ({}, on {}) does not match the tensor's shape {} "
             "({}, on {})",
             seed.shape(), seed.dtype(), seed.device(), shape(), dtype(), device());
  }
  run_backward({*this}, {seed}, retain_graph);
}

// ---- in-place ----
//
// Each one writes through the backend and then bumps the version once (bump_version),
// whatever path it took, so that t.version() counts in-place ops as PyTorch's _version.

namespace {
void check_inplace(const Tensor& t, const char* op) {
  MG_CHECK(!(GradMode::is_enabled() && t.requires_grad()),
           "{}: a tensor that requires grad (shape {}) is being modified in place while grad "
           "mode is on; wrap the update in a NoGradGuard",
           op, t.shape());
}

// An in-place op keeps the tensor's dtype, so the scalar's category must fit it, as in
// torch: a floating-point scalar would make an int64 tensor's result float32 ("result type
// Float can't be cast to the desired output type Long"), whatever its value.
void check_scalar_category(const Tensor& t, const Scalar& value, const char* op, const char* what) {
  if (t.dtype() != DType::Int64 || value.is_integral()) return;
  if (std::string(what) == "alpha")
    MG_FAIL("{}: for an int64 tensor (shape {}) alpha must be an integer, got the "
            "floating-point number {} (torch: \"For integral input tensors, argument alpha must "
            "not be a floating point number\")",
            op, t.shape(), value.str());
  MG_FAIL("{}: the {} {} is a floating-point number, so the result is float32, which cannot be "
          "written into the int64 tensor (shape {}) in place (torch: \"result type Float can't be "
          "cast to the desired output type Long\"); pass an integer, or convert the tensor first",
          op, what, value.str(), t.shape());
}

// An int64 scalar as a 0-dim tensor on t's device, exact (a double would round it past 2^53).
Tensor int64_operand(const Tensor& t, const Scalar& value) {
  return ops::copy_to(from_vector(std::vector<int64_t>{value.to_int64()}, Shape{}), t.device());
}

bool exact_in_double(const Scalar& value) {
  constexpr int64_t kExact = int64_t{1} << 53;
  return value.is_floating_point() || (value.to_int64() <= kExact && value.to_int64() >= -kExact);
}

// dst = src on dst's device, for a source made on that device (a broadcast value, fresh
// random numbers): the values only, the caller bumps the version.
void write_values(const Tensor& dst, const Tensor& src) {
  if (dst.numel() == 0) return;
  const Tensor source = src.shape() == dst.shape() ? src : ops::expand(src, dst.shape());
  backend(dst.device()).copy(dst, source);
}
}  // namespace

Tensor& Tensor::copy_(const Tensor& src) {
  check_inplace(*this, "copy_");
  ops::copy_(*this, src);  // bumps the version
  return *this;
}

Tensor& Tensor::fill_(double value) {
  check_inplace(*this, "fill_");
  if (dtype() == DType::Int64) checked_int64(value, "fill_");
  if (numel() > 0) {
    if (is_contiguous()) {
      backend(device()).fill(*this, value);
    } else {
      write_values(*this, full(Shape{}, value, dtype(), device()));
    }
  }
  bump_version(*this, "fill_");
  return *this;
}

Tensor& Tensor::add_(const Tensor& other, Scalar alpha) {
  check_inplace(*this, "add_");
  ops::check_same_device("add_", *this, other);
  MG_CHECK(dtype() == other.dtype(), "add_: dtype mismatch {} vs {}", dtype(), other.dtype());
  check_scalar_category(*this, alpha, "add_", "alpha");
  Tensor b = other.shape() == shape() ? other : ops::expand(other, shape());
  double scale = alpha.to_double();
  if (!exact_in_double(alpha)) {  // other * alpha first, exactly (wrapping, as torch's)
    b = ops::binary(BinaryOp::Mul, b, int64_operand(*this, alpha));
    scale = 1.0;
  }
  if (numel() > 0) backend(device()).binary(BinaryOp::Add, *this, *this, b, scale);
  bump_version(*this, "add_");
  return *this;
}

Tensor& Tensor::mul_(Scalar value) {
  check_inplace(*this, "mul_");
  check_scalar_category(*this, value, "mul_", "scalar");
  if (numel() > 0) {
    if (exact_in_double(value)) {
      backend(device()).binary_scalar(BinaryOp::Mul, *this, *this, value.to_double());
    } else {
      backend(device()).binary(BinaryOp::Mul, *this, *this,
                               ops::expand(int64_operand(*this, value), shape()), 1.0);
    }
  }
  bump_version(*this, "mul_");
  return *this;
}

Tensor& Tensor::mul_(const Tensor& other) {
  check_inplace(*this, "mul_");
  ops::check_same_device("mul_", *this, other);
  MG_CHECK(dtype() == other.dtype(), "mul_: dtype mismatch {} vs {}", dtype(), other.dtype());
  const Tensor b = other.shape() == shape() ? other : ops::expand(other, shape());
  if (numel() > 0) backend(device()).binary(BinaryOp::Mul, *this, *this, b, 1.0);
  bump_version(*this, "mul_");
  return *this;
}

Tensor& Tensor::uniform_(double low, double high) {
  check_inplace(*this, "uniform_");
  ops::check_float("uniform_", *this);
  Tensor values = empty(shape(), dtype(), device());
  const auto draw = default_generator().reserve((static_cast<uint64_t>(numel()) + 3) / 4);
  if (numel() > 0) backend(device()).random_uniform(values, low, high, draw.seed, draw.offset);
  write_values(*this, values);
  bump_version(*this, "uniform_");
  return *this;
}

Tensor& Tensor::normal_(double mean, double stddev) {
  check_inplace(*this, "normal_");
  ops::check_float("normal_", *this);
  Tensor values = empty(shape(), dtype(), device());
  const auto draw = default_generator().reserve((static_cast<uint64_t>(numel()) + 1) / 2);
  if (numel() > 0) backend(device()).random_normal(values, mean, stddev, draw.seed, draw.offset);
  write_values(*this, values);
  bump_version(*this, "normal_");
  return *this;
}

}  // namespace mg
