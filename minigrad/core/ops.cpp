#include <minigrad/core/ops.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <limits>

#include <fmt/ranges.h>

#include <minigrad/core/checked_math.h>
#include <minigrad/core/cpu/strided_loop.h>

namespace mg::ops {

// ---------------------------------------------------------------- checks

void check_same_device(const char* op, const Tensor& a, const Tensor& b) {
  MG_CHECK(a.device() == b.device(),
           "{}: expected all tensors on the same device, but found {} (shape {}) and {} "
           "(shape {}); move one with .to()",
           op, a.device(), a.shape(), b.device(), b.shape());
}

void check_float(const char* op, const Tensor& t) {
  MG_CHECK(is_floating_point(t.dtype()),
           "{}: expected a floating-point tensor (float32, float64, bfloat16 or float16), got {} "
           "(shape {})", op,
           t.dtype(), t.shape());
}

namespace {
Backend& backend_of(const Tensor& t) { return backend(t.device()); }
}  // namespace

// ---------------------------------------------------------------- views

// Every view is made here, so this is where a view that would reach outside its
// storage is refused, whatever arithmetic produced its shape, strides and offset (the
// check of PyTorch's setStorage: sizes, strides, offset and itemsize must fit the storage).
Tensor as_strided(const Tensor& t, const Shape& shape, std::vector<int64_t> strides,
                  int64_t offset) {
  const auto describe = [&] {
    return fmt::format("a view of shape {}, strides [{}] and storage offset {}", shape,
                       fmt::join(strides, ", "), offset);
  };
  MG_CHECK(static_cast<int64_t>(strides.size()) == shape.dim(),
           "as_strided: {} has {} strides for {} dimensions", describe(), strides.size(),
           shape.dim());
  checked_numel(shape, "as_strided");  // no negative size, an element count that fits
  MG_CHECK(offset >= 0, "as_strided: {}: negative storage offset", describe());
  // The last element's offset: offset + sum (size - 1) * stride, each step checked.
  int64_t last = offset;
  bool empty_view = false;
  for (size_t d = 0; d < strides.size(); ++d) {
    const int64_t size = shape[static_cast<int64_t>(d)];
    MG_CHECK(strides[d] >= 0, "as_strided: {}: negative strides are not supported", describe());
    if (size == 0) empty_view = true;
    if (size > 1) last = checked_add(last, checked_mul(size - 1, strides[d], "as_strided"), "as_strided");
  }
  MG_CHECK(empty_view || !t.storage().is_freed(),
           "as_strided: {} of a tensor whose memory has been freed (Storage::resize_(0)). "
           "FSDP (fully_shard) frees a unit's full parameters outside its forward and backward: "
           "call the module through operator() (its hooks gather them), read them through "
           "full_state_dict(), or train the shards its parameters() returns",
           describe());
  const auto capacity =
      static_cast<int64_t>(t.storage().nbytes() / element_size(t.dtype()));  // elements
  // An empty view reads nothing, so any offset will do, as in PyTorch (checkInBoundsForStorage
  // returns early for 0 bytes): the columns [1, 3) of a [0, 3] tensor start at offset 1 of
  // a storage of 0 elements.
  MG_CHECK(empty_view || last < capacity,
           "as_strided: {} is out of bounds for a storage of {} elements ({})", describe(),
           capacity, t.dtype());
  return Tensor(std::make_shared<TensorImpl>(t.storage(), shape, std::move(strides), offset,
                                             t.dtype()));
}

Shape infer_shape(const Shape& shape, int64_t numel, const char* op) {
  std::vector<int64_t> sizes = shape.sizes();
  int64_t infer_at = -1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (sizes[i] == -1) {
      MG_CHECK(infer_at < 0, "{}: only one dimension can be -1, got {}", op, shape);
      infer_at = static_cast<int64_t>(i);
    } else {
      MG_CHECK(sizes[i] >= 0, "{}: invalid size {} in shape {}", op, sizes[i], shape);
    }
  }
  // The product of the known sizes, with 0 counted as 1 so that its overflow is caught
  // even when a 0 makes the tensor empty (its strides multiply the same sizes).
  int64_t known = 1, extent = 1;
  for (size_t i = 0; i < sizes.size(); ++i) {
    if (static_cast<int64_t>(i) == infer_at) continue;
    MG_CHECK(!mul_overflows(extent, std::max<int64_t>(sizes[i], 1)),
             "{}: shape {} is too large: the product of its sizes overflows int64", op, shape);
    extent *= std::max<int64_t>(sizes[i], 1);
    known *= sizes[i];
  }
  if (infer_at >= 0) {
    MG_CHECK(known != 0 && numel % known == 0,
             "{}: shape {} is invalid for a tensor of {} elements", op, shape, numel);
    sizes[static_cast<size_t>(infer_at)] = numel / known;
  } else {
    MG_CHECK(known == numel, "{}: shape {} is invalid for a tensor of {} elements", op, shape,
             numel);
  }
  return Shape(std::move(sizes));
}

namespace {
// The strides that would let a tensor of (old_shape, old_strides) be seen as new_shape
// without copying, or false (the algorithm of PyTorch's computeStride: dimensions
// merge only where they are laid out contiguously with respect to each other).
bool view_strides(const Shape& old_shape, const std::vector<int64_t>& old_strides,
                  const Shape& new_shape, std::vector<int64_t>& new_strides) {
  new_strides.assign(static_cast<size_t>(new_shape.dim()), 0);
  if (old_shape.dim() == 0 || old_shape.numel() == 0) {
    new_strides = contiguous_strides(new_shape);
    return true;
  }
  int64_t view_d = new_shape.dim() - 1;
  int64_t chunk_base_stride = old_strides.back();
  int64_t tensor_numel = 1, view_numel = 1;
  for (int64_t tensor_d = old_shape.dim() - 1; tensor_d >= 0; --tensor_d) {
    tensor_numel *= old_shape[tensor_d];
    const bool chunk_ends =
        tensor_d == 0 ||
        (old_shape[tensor_d - 1] != 1 &&
         old_strides[static_cast<size_t>(tensor_d - 1)] != tensor_numel * chunk_base_stride);
    if (!chunk_ends) continue;
    while (view_d >= 0 && (view_numel < tensor_numel || new_shape[view_d] == 1)) {
      new_strides[static_cast<size_t>(view_d)] = view_numel * chunk_base_stride;
      view_numel *= new_shape[view_d];
      --view_d;
    }
    if (view_numel != tensor_numel) return false;
    if (tensor_d > 0) {
      chunk_base_stride = old_strides[static_cast<size_t>(tensor_d - 1)];
      tensor_numel = 1;
      view_numel = 1;
    }
  }
  return view_d == -1;
}
}  // namespace

bool can_view(const Tensor& t, const Shape& shape) {
  std::vector<int64_t> strides;
  return shape.numel() == t.numel() && view_strides(t.shape(), t.strides(), shape, strides);
}

Tensor view(const Tensor& t, const Shape& requested) {
  const Shape shape = infer_shape(requested, t.numel(), "view");
  std::vector<int64_t> strides;
  MG_CHECK(view_strides(t.shape(), t.strides(), shape, strides),
           "view: a tensor of shape {} with strides [{}] cannot be viewed as {} without a "
           "copy (its memory is not laid out for it); use reshape() or contiguous() first",
           t.shape(), fmt::join(t.strides(), ", "), shape);
  return as_strided(t, shape, std::move(strides), t.storage_offset());
}

Tensor expand(const Tensor& t, const Shape& shape) {
  const int64_t n = shape.dim();
  MG_CHECK(n >= t.dim(), "expand: cannot expand shape {} to fewer dimensions {}", t.shape(),
           shape);
  std::vector<int64_t> sizes(static_cast<size_t>(n)), strides(static_cast<size_t>(n));
  for (int64_t i = n - 1; i >= 0; --i) {
    const int64_t src = i - (n - t.dim());
    const auto iu = static_cast<size_t>(i);
    if (src < 0) {
      MG_CHECK(shape[i] >= 0,
               "expand: size {} is not allowed in a new leading dimension (target shape {})",
               shape[i], shape);
      sizes[iu] = shape[i];
      strides[iu] = 0;
      continue;
    }
    const int64_t have = t.size(src);
    const int64_t want = shape[i] == -1 ? have : shape[i];
    MG_CHECK(want >= 0, "expand: invalid size {} for dimension {} in target shape {} (sizes are "
             ">= 0, or -1 to keep the size)", shape[i], i, shape);
    MG_CHECK(have == want || have == 1,
             "expand: the size {} of dimension {} of shape {} cannot be expanded to {} (target {})",
             have, src, t.shape(), want, shape);
    sizes[iu] = want;
    strides[iu] = have == want ? t.stride(src) : 0;
  }
  Shape out(std::move(sizes));
  checked_numel(out, "expand");
  return as_strided(t, out, std::move(strides), t.storage_offset());
}

Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1) {
  dim0 = wrap_dim(dim0, t.dim(), "transpose");
  dim1 = wrap_dim(dim1, t.dim(), "transpose");
  if (t.dim() == 0) return as_strided(t, t.shape(), t.strides(), t.storage_offset());
  std::vector<int64_t> sizes = t.shape().sizes(), strides = t.strides();
  std::swap(sizes[static_cast<size_t>(dim0)], sizes[static_cast<size_t>(dim1)]);
  std::swap(strides[static_cast<size_t>(dim0)], strides[static_cast<size_t>(dim1)]);
  return as_strided(t, Shape(std::move(sizes)), std::move(strides), t.storage_offset());
}

Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length) {
  MG_CHECK(t.dim() > 0, "narrow: cannot narrow a 0-dimensional tensor");
  dim = wrap_dim(dim, t.dim(), "narrow");
  const int64_t size = t.size(dim);
  if (start < 0) start += size;  // start >= INT64_MIN and size >= 0: no overflow
  // length <= size - start, not start + length <= size, which wraps for a start near
  // INT64_MAX and lets the view through (start is in [0, size] when this is reached).
  MG_CHECK(start >= 0 && start <= size && length >= 0 && length <= size - start,
           "narrow: start {} and length {} are out of range for dimension {} of size {} "
           "(shape {})",
           start, length, dim, size, t.shape());
  std::vector<int64_t> sizes = t.shape().sizes();
  sizes[static_cast<size_t>(dim)] = length;
  const int64_t offset = checked_add(t.storage_offset(), checked_mul(start, t.stride(dim), "narrow"),
                                     "narrow");
  return as_strided(t, Shape(std::move(sizes)), t.strides(), offset);
}

// ---------------------------------------------------------------- copies

void copy_(const Tensor& dst, const Tensor& src) {
  MG_CHECK(dst.dtype() == src.dtype(), "copy_: dtype mismatch: destination {} vs source {}",
           dst.dtype(), src.dtype());
  const Tensor source = src.shape() == dst.shape() ? src : expand(src, dst.shape());
  if (dst.numel() > 0) {
    // The non-CPU side's backend moves data between the host and its devices.
    Backend& b = !dst.device().is_cpu() ? backend_of(dst) : backend_of(source);
    b.copy(dst, source);
  }
  bump_version(dst, "copy_");
}

Tensor contiguous(const Tensor& t) { return t.is_contiguous() ? t : clone(t); }

Tensor clone(const Tensor& t) {
  Tensor out = empty(t.shape(), t.dtype(), t.device());
  copy_(out, t);
  return out;
}

Tensor to_dtype(const Tensor& t, DType dtype) {
  if (t.dtype() == dtype) return t;
  Tensor out = empty(t.shape(), dtype, t.device());
  if (out.numel() > 0) backend_of(t).convert(out, t);
  return out;
}

Tensor round_stochastic(const Tensor& t, DType dtype, uint64_t seed, uint64_t offset) {
  MG_CHECK(t.dtype() == DType::Float32 && is_reduced_float(dtype),
           "round_stochastic: rounds float32 to bfloat16 or float16, got {} to {} (shape {})",
           t.dtype(), dtype, t.shape());
  const Tensor in = contiguous(t);
  Tensor out = empty(t.shape(), dtype, t.device());
  if (out.numel() > 0) backend_of(t).round_stochastic(out, in, seed, offset);
  return out;
}

Tensor copy_to(const Tensor& t, Device device) {
  Tensor out = empty(t.shape(), t.dtype(), device);
  copy_(out, t);
  return out;
}

// ---------------------------------------------------------------- elementwise

namespace {

// int64 division traps (SIGFPE) on a zero divisor and on INT64_MIN / -1, whose quotient
// 2^63 does not fit: both are refused before any kernel runs, as PyTorch's
// "ZeroDivisionError". The operands are read on the host (a copy, and a wait, for a GPU
// tensor: integer division is not on any hot path), element pair by element pair after
// broadcasting.
void check_int64_division(const Tensor& a, const Tensor& b, const char* op) {
  const Tensor ha = a.device().is_cpu() ? a : copy_to(a, Device::cpu());
  const Tensor hb = b.device().is_cpu() ? b : copy_to(b, Device::cpu());
  const auto* x = static_cast<const int64_t*>(ha.data_ptr());
  const auto* y = static_cast<const int64_t*>(hb.data_ptr());
  bool zero = false, overflow = false;
  cpu::for_each_element<2>(ha.shape(), {&ha.strides(), &hb.strides()},
                           [&](const std::array<int64_t, 2>& k) {
                             const int64_t d = y[k[1]];
                             zero = zero || d == 0;
                             overflow = overflow ||
                                        (d == -1 && x[k[0]] == std::numeric_limits<int64_t>::min());
                           });
  MG_CHECK(!zero,
           "{}: ZeroDivisionError: integer division by zero (int64 tensors of shapes {} and {} "
           "on {})",
           op, a.shape(), b.shape(), a.device());
  MG_CHECK(!overflow,
           "{}: integer overflow: {} / -1 does not fit in int64 (int64 tensors of shapes {} and {} "
           "on {})",
           op, std::numeric_limits<int64_t>::min(), a.shape(), b.shape(), a.device());
}

}  // namespace

Tensor unary(UnaryOp op, const Tensor& x) {
  // As torch: neg, relu and abs of int64 are int64; exp, log, sqrt and tanh of int64 are
  // float32 (the default float dtype), computed on the converted values.
  if (x.dtype() == DType::Int64 && op != UnaryOp::Neg && op != UnaryOp::Relu && op != UnaryOp::Abs)
    return unary(op, to_dtype(x, DType::Float32));
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) backend_of(x).unary(op, out, x);
  return out;
}

Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b) {
  const char* name = op_name(op);
  check_same_device(name, a, b);
  MG_CHECK(a.dtype() == b.dtype(),
           "{}: expected both tensors to have the same dtype, but got {} (shape {}) and {} "
           "(shape {})",
           name, a.dtype(), a.shape(), b.dtype(), b.shape());
  const Shape shape = broadcast_shapes(a.shape(), b.shape(), name);
  Tensor out = empty(shape, a.dtype(), a.device());
  if (out.numel() == 0) return out;
  const Tensor ea = a.shape() == shape ? a : expand(a, shape);
  const Tensor eb = b.shape() == shape ? b : expand(b, shape);
  if (op == BinaryOp::Div && a.dtype() == DType::Int64) check_int64_division(ea, eb, name);
  backend_of(a).binary(op, out, ea, eb, 1.0);
  return out;
}

Tensor binary_scalar(BinaryOp op, const Tensor& x, double scalar) {
  // The result keeps x's dtype, so an int64 tensor would silently truncate a fraction.
  MG_CHECK(x.dtype() != DType::Int64 || scalar == std::trunc(scalar),
           "{}: the scalar {} is not a whole number, but the tensor (shape {}) is int64",
           op_name(op), scalar, x.shape());
  if (x.dtype() == DType::Int64) {
    checked_int64(scalar, op_name(op));
    if (op == BinaryOp::Div && x.numel() > 0)
      check_int64_division(x, expand(scalar_tensor(scalar, DType::Int64), x.shape()), "div");
  }
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) backend_of(x).binary_scalar(op, out, x, scalar);
  return out;
}

Tensor relu_backward(const Tensor& grad_out, const Tensor& input) {
  Tensor out = empty(input.shape(), input.dtype(), input.device());
  if (out.numel() > 0) backend_of(input).relu_backward(out, grad_out, input);
  return out;
}

// ---------------------------------------------------------------- reductions

Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim) {
  const int64_t ndim = x.dim();
  std::vector<bool> reduce(static_cast<size_t>(ndim), dims.empty());
  for (int64_t d : dims) {
    const int64_t w = wrap_dim(d, ndim, "sum");
    if (ndim == 0) continue;  // dim 0 or -1 of a 0-dim tensor: nothing to reduce (PyTorch too)
    MG_CHECK(!reduce[static_cast<size_t>(w)], "sum: dimension {} appears more than once", d);
    reduce[static_cast<size_t>(w)] = true;
  }
  std::vector<int64_t> kept_sizes = x.shape().sizes(), out_sizes;
  for (int64_t d = 0; d < ndim; ++d) {
    if (reduce[static_cast<size_t>(d)]) {
      kept_sizes[static_cast<size_t>(d)] = 1;
      if (keepdim) out_sizes.push_back(1);
    } else {
      out_sizes.push_back(x.size(d));
    }
  }
  Tensor out = empty(Shape(kept_sizes), x.dtype(), x.device());
  if (out.numel() > 0) {
    if (x.numel() == 0) {
      backend_of(x).fill(out, 0.0);
    } else {
      backend_of(x).sum(out, x);
    }
  }
  return keepdim ? out : view(out, Shape(out_sizes));
}

Tensor sum_to(const Tensor& x, const Shape& shape) {
  if (x.shape() == shape) return x;
  const int64_t lead = x.dim() - shape.dim();
  MG_CHECK(lead >= 0, "sum_to: cannot reduce shape {} to the larger shape {}", x.shape(), shape);
  std::vector<int64_t> dims;
  for (int64_t d = 0; d < x.dim(); ++d) {
    if (d < lead || (shape[d - lead] == 1 && x.size(d) != 1)) dims.push_back(d);
  }
  Tensor reduced = dims.empty() ? x : sum(x, dims, /*keepdim=*/true);
  return view(reduced, shape);
}

Tensor abs_max(const Tensor& x) {
  check_float("abs_max", x);
  Tensor out = empty(Shape{}, x.dtype(), x.device());
  if (x.numel() == 0) {
    out.fill_(0.0);
    return out;
  }
  backend_of(x).abs_max(out, contiguous(x));
  return out;
}

Tensor argmax(const Tensor& x, int64_t dim) {
  MG_CHECK(x.dim() >= 1, "argmax: expected a tensor of at least one dimension, got shape {}",
           x.shape());
  dim = wrap_dim(dim, x.dim(), "argmax");
  // Empty rows have no maximum; no rows at all (a [0, 3] tensor along dim 1) is an empty
  // result, as in torch.
  MG_CHECK(x.size(dim) > 0,
           "argmax: expected reduction dim {} to have non-zero size, got shape {} (an empty "
           "row has no maximum)",
           dim, x.shape());
  const Tensor moved = contiguous(transpose(x, dim, x.dim() - 1));
  const int64_t cols = moved.size(-1);
  const Tensor rows = view(moved, Shape{moved.numel() / cols, cols});
  Tensor out = empty(Shape{rows.size(0)}, DType::Int64, x.device());
  if (rows.size(0) > 0) backend_of(x).argmax(out, rows);
  std::vector<int64_t> out_sizes = moved.shape().sizes();
  out_sizes.pop_back();
  Tensor result = view(out, Shape(out_sizes));
  // `moved` had `dim` and the last dim swapped; with the reduced dim dropped, the old
  // last dim sits at position `dim`. Walk it back to the end to restore the order.
  if (dim != x.dim() - 1) {
    for (int64_t d = dim; d < x.dim() - 2; ++d) result = transpose(result, d, d + 1);
    result = contiguous(result);
  }
  return result;
}

// ---------------------------------------------------------------- matmul, softmax, loss

namespace {
void check_matmul(const char* op, const Tensor& a, const Tensor& b) {
  check_same_device(op, a, b);
  MG_CHECK(a.dim() == 2 && b.dim() == 2, "{}: expected 2-D tensors, got shapes {} and {}", op,
           a.shape(), b.shape());
  MG_CHECK(a.size(1) == b.size(0),
           "{}: shapes {} and {} cannot be multiplied (inner dimensions {} and {} differ)", op,
           a.shape(), b.shape(), a.size(1), b.size(0));
  MG_CHECK(is_floating_point(a.dtype()) && a.dtype() == b.dtype(),
           "{}: expected two floating-point tensors of one dtype, got {} and {}", op, a.dtype(),
           b.dtype());
}
}  // namespace

Tensor matmul(const Tensor& a, const Tensor& b) {
  check_matmul("matmul", a, b);
  Tensor out = empty(Shape{a.size(0), b.size(1)}, a.dtype(), a.device());
  if (out.numel() > 0) backend_of(a).matmul(out, a, b);
  return out;
}

namespace {
// addmm and addmm_relu: checks the operands, returns the (uninitialised) output.
Tensor addmm_output(const char* op, const Tensor& bias, const Tensor& a, const Tensor& b) {
  check_matmul(op, a, b);
  check_same_device(op, a, bias);
  MG_CHECK(bias.dim() == 1 && bias.size(0) == b.size(1) && bias.dtype() == a.dtype(),
           "{}: expected a {} bias of shape [{}] for a product of shape [{}, {}], got {} "
           "({})",
           op, a.dtype(), b.size(1), a.size(0), b.size(1), bias.shape(), bias.dtype());
  return empty(Shape{a.size(0), b.size(1)}, a.dtype(), a.device());
}
}  // namespace

Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b) {
  Tensor out = addmm_output("addmm", bias, a, b);
  if (out.numel() > 0) backend_of(a).addmm(out, contiguous(bias), a, b);
  return out;
}

Tensor addmm_relu(const Tensor& bias, const Tensor& a, const Tensor& b) {
  Tensor out = addmm_output("addmm_relu", bias, a, b);
  if (out.numel() > 0) backend_of(a).addmm_relu(out, contiguous(bias), a, b);
  return out;
}

namespace {
// Runs a last-dim op on a tensor of any rank by seeing it as [rows, classes].
Shape as_rows(const Tensor& x) {
  const int64_t cols = x.dim() == 0 ? 1 : x.size(-1);
  return Shape{cols == 0 ? 0 : x.numel() / cols, cols};
}
}  // namespace

Tensor log_softmax(const Tensor& x, int64_t dim) {
  check_float("log_softmax", x);
  dim = wrap_dim(dim, x.dim(), "log_softmax");
  if (x.dim() > 0 && dim != x.dim() - 1) {
    return transpose(log_softmax(transpose(x, dim, -1), -1), dim, -1);
  }
  const Tensor rows = contiguous(x.dim() == 0 ? view(x, Shape{1}) : x);
  Tensor out = empty(x.shape(), x.dtype(), x.device());
  if (x.numel() > 0) backend_of(x).log_softmax(view(out, as_rows(x)), view(rows, as_rows(x)));
  return out;
}

Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim) {
  dim = wrap_dim(dim, output.dim(), "log_softmax_backward");
  if (output.dim() > 0 && dim != output.dim() - 1) {
    return transpose(
        log_softmax_backward(transpose(grad_out, dim, -1), transpose(output, dim, -1), -1), dim,
        -1);
  }
  const Tensor g = contiguous(grad_out), y = contiguous(output);
  Tensor out = empty(output.shape(), output.dtype(), output.device());
  if (out.numel() > 0)
    backend_of(output).log_softmax_backward(view(out, as_rows(output)), view(g, as_rows(output)),
                                            view(y, as_rows(output)));
  return out;
}

Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options) {
  check_same_device("cross_entropy", logits, targets);
  MG_CHECK(logits.dim() == 2, "cross_entropy: expected logits of shape [batch, classes], got {}",
           logits.shape());
  check_float("cross_entropy", logits);
  MG_CHECK(targets.dtype() == DType::Int64,
           "cross_entropy: expected int64 class indices as targets, got {} (shape {})",
           targets.dtype(), targets.shape());
  MG_CHECK(targets.dim() == 1 && targets.size(0) == logits.size(0),
           "cross_entropy: targets of shape {} do not match logits of shape {} (expected [{}])",
           targets.shape(), logits.shape(), logits.size(0));
  MG_CHECK(logits.size(1) > 0,
           "cross_entropy: expected at least one class, got logits of shape {}", logits.shape());
  const double eps = options.label_smoothing();
  MG_CHECK(eps >= 0.0 && eps <= 1.0,
           "cross_entropy: label_smoothing must be between 0.0 and 1.0, got {}", eps);
  const Shape loss_shape =
      options.reduction() == Reduction::None ? Shape{logits.size(0)} : Shape{};
  Tensor loss = empty(loss_shape, logits.dtype(), logits.device());
  // An empty batch, as torch: the mean of no rows is 0 / 0 = NaN, their sum 0.
  if (logits.size(0) == 0) {
    if (options.reduction() != Reduction::None)
      backend_of(logits).fill(
          loss, options.reduction() == Reduction::Mean ? std::numeric_limits<double>::quiet_NaN() : 0.0);
    return loss;
  }
  backend_of(logits).cross_entropy(loss, logits, targets, options);
  return loss;
}

Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits,
                              const Tensor& targets, const CrossEntropyOptions& options) {
  const Shape loss_shape =
      options.reduction() == Reduction::None ? Shape{logits.size(0)} : Shape{};
  MG_CHECK(grad_loss.shape() == loss_shape && grad_loss.device() == logits.device() &&
               grad_loss.dtype() == logits.dtype(),
           "cross_entropy_backward: expected a {} gradient of shape {} on {} (reduction "
           "{}), got shape {} ({}, on {})",
           logits.dtype(), loss_shape, logits.device(), reduction_name(options.reduction()), grad_loss.shape(),
           grad_loss.dtype(), grad_loss.device());
  Tensor grad = empty(logits.shape(), logits.dtype(), logits.device());
  if (grad.numel() > 0)
    backend_of(logits).cross_entropy_backward(grad, grad_loss, logits, targets, options);
  return grad;
}

}  // namespace mg::ops
