// Views, copies and moves between devices. A view's backward puts the gradient back
// into the input's shape; to()'s backward carries the gradient back to the input's
// device, which is what makes model parallelism (layers on different devices) train.
#include <minigrad/autograd/autocast.h>
#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/core/checked_math.h>
#include <minigrad/core/ops.h>

#include <fmt/ranges.h>

namespace mg {
namespace {
Tensor reshape_grad(const Tensor& grad, const Shape& shape) {
  return ops::can_view(grad, shape) ? ops::view(grad, shape) : ops::view(ops::clone(grad), shape);
}
}  // namespace

Tensor view(const Tensor& x, const Shape& shape) {
  Tensor out = ops::view(x, shape);
  record_function("ViewBackward", {x}, {out}, [shape = x.shape()](const BackwardArgs& g) {
    return std::vector<Tensor>{reshape_grad(g.grad(), shape)};
  });
  return out;
}

Tensor reshape(const Tensor& x, const Shape& shape) {
  const Shape target = ops::infer_shape(shape, x.numel(), "reshape");
  return ops::can_view(x, target) ? view(x, target) : view(contiguous(x), target);
}

Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1) {
  Tensor out = ops::transpose(x, dim0, dim1);
  record_function("TransposeBackward", {x}, {out}, [dim0, dim1](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::transpose(g.grad(), dim0, dim1)};
  });
  return out;
}

Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length) {
  Tensor out = ops::narrow(x, dim, start, length);
  record_function("NarrowBackward", {x}, {out},
                  [shape = x.shape(), dim, start, length](const BackwardArgs& g) {
                    Tensor grad = zeros(shape, g.grad().dtype(), g.grad().device());
                    ops::copy_(ops::narrow(grad, dim, start, length), g.grad());
                    return std::vector<Tensor>{grad};
                  });
  return out;
}

Tensor expand(const Tensor& x, const Shape& shape) {
  Tensor out = ops::expand(x, shape);
  record_function("ExpandBackward", {x}, {out}, [shape = x.shape()](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::sum_to(g.grad(), shape)};
  });
  return out;
}

Tensor contiguous(const Tensor& x) {
  if (x.is_contiguous()) return x;
  Tensor out = ops::clone(x);
  record_function("ContiguousBackward", {x}, {out},
                  [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad()}; });
  return out;
}

Tensor to(const Tensor& x, Device device) {
  Tensor out = ops::copy_to(x, device);
  record_function("ToDeviceBackward", {x}, {out}, [from = x.device()](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::copy_to(g.grad(), from)};
  });
  return out;
}

Tensor to(const Tensor& x, DType dtype) {
  if (x.dtype() == dtype) return x;
  Tensor out = ops::to_dtype(x, dtype);
  // Only a float result carries a gradient (an int64 one cannot require grad).
  if (!is_floating_point(dtype)) return out;
  record_function("ToDtypeBackward", {x}, {out}, [from = x.dtype()](const BackwardArgs& g) {
    return std::vector<Tensor>{ops::to_dtype(g.grad(), from)};
  });
  return out;
}

Tensor permute(const Tensor& x, const std::vector<int64_t>& dims) {
  Tensor out = ops::permute(x, dims);
  record_function("PermuteBackward", {x}, {out}, [dims, ndim = x.dim()](const BackwardArgs& g) {
    // The inverse permutation puts each dimension back where it came from.
    std::vector<int64_t> inverse(dims.size());
    for (size_t i = 0; i < dims.size(); ++i)
      inverse[static_cast<size_t>(wrap_dim(dims[i], ndim, "permute"))] = static_cast<int64_t>(i);
    return std::vector<Tensor>{ops::permute(g.grad(), inverse)};
  });
  return out;
}

Tensor cat(const std::vector<Tensor>& tensors_in, int64_t dim) {
  const std::vector<Tensor> tensors = autocast::cast_inputs(autocast::AutocastOp::Cat, tensors_in);
  MG_CHECK(!tensors.empty(), "cat: expected a non-empty list of tensors");
  const Tensor& first = tensors[0];
  MG_CHECK(first.dim() > 0, "cat: zero-dimensional tensors cannot be concatenated (tensor 0 has "
           "shape []); reshape them to [1] first");
  dim = wrap_dim(dim, first.dim(), "cat");
  std::vector<int64_t> sizes = first.shape().sizes();
  int64_t total = 0;
  for (size_t i = 0; i < tensors.size(); ++i) {
    const Tensor& t = tensors[i];
    ops::check_same_device("cat", first, t);
    MG_CHECK(t.dtype() == first.dtype(), "cat: tensor {} is {} but tensor 0 is {}", i, t.dtype(),
             first.dtype());
    MG_CHECK(t.dim() == first.dim(), "cat: tensor {} has shape {}, tensor 0 has shape {}", i,
             t.shape(), first.shape());
    for (int64_t d = 0; d < t.dim(); ++d)
      MG_CHECK(d == dim || t.size(d) == first.size(d),
               "cat: sizes must match except in dimension {}, but tensor {} has shape {} and "
               "tensor 0 has shape {}",
               dim, i, t.shape(), first.shape());
    total = checked_add(total, t.size(dim), "cat");  // sizes of expanded views can be huge
  }
  sizes[static_cast<size_t>(dim)] = total;
  Tensor out = empty(Shape(sizes), first.dtype(), first.device());
  std::vector<int64_t> lengths;
  int64_t offset = 0;
  for (const Tensor& t : tensors) {
    ops::copy_(ops::narrow(out, dim, offset, t.size(dim)), t);
    lengths.push_back(t.size(dim));
    offset += t.size(dim);
  }
  record_function("CatBackward", tensors, {out}, [dim, lengths](const BackwardArgs& g) {
    std::vector<Tensor> grads;
    int64_t start = 0;
    for (int64_t len : lengths) {
      grads.push_back(ops::narrow(g.grad(), dim, start, len));
      start += len;
    }
    return grads;
  });
  return out;
}

std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim) {
  MG_CHECK(x.dim() > 0, "split: expects a tensor with at least one dimension, got a "
           "zero-dimensional tensor (shape [])");
  dim = wrap_dim(dim, x.dim(), "split");
  int64_t total = 0;
  for (int64_t s : sizes) {
    MG_CHECK(s >= 0, "split: split sizes must be >= 0, got {} in [{}]", s, fmt::join(sizes, ", "));
    total = checked_add(total, s, "split");
  }
  MG_CHECK(total == x.size(dim),
           "split: sizes adding up to {} cannot split dimension {} of size {} (shape {})", total,
           dim, x.size(dim), x.shape());
  std::vector<Tensor> pieces;
  int64_t start = 0;
  for (int64_t s : sizes) {
    pieces.push_back(narrow(x, dim, start, s));
    start += s;
  }
  return pieces;
}

std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim) {
  MG_CHECK(x.dim() > 0, "split: expects a tensor with at least one dimension, got a "
           "zero-dimensional tensor (shape [])");
  dim = wrap_dim(dim, x.dim(), "split");
  const int64_t size = x.size(dim);
  MG_CHECK(split_size > 0 || (split_size == 0 && size == 0),
           "split: split_size must be positive, got {} for dimension {} of size {}", split_size,
           dim, size);
  std::vector<int64_t> sizes;
  for (int64_t start = 0; start < size; start += std::min(split_size, size - start))
    sizes.push_back(std::min(split_size, size - start));
  if (sizes.empty()) sizes.push_back(0);
  return split(x, sizes, dim);
}

std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim) {
  MG_CHECK(chunks > 0, "chunk: number of chunks must be positive, got {}", chunks);
  MG_CHECK(x.dim() > 0, "chunk: expects a tensor with at least one dimension, got a "
           "zero-dimensional tensor (shape [])");
  dim = wrap_dim(dim, x.dim(), "chunk");
  const int64_t size = x.size(dim);
  const int64_t piece = ceil_div(size, chunks);
  std::vector<int64_t> sizes;
  // Each step ends at most at size: start + piece could overflow for a size near INT64_MAX
  // (an expanded view), start + min(piece, size - start) cannot.
  for (int64_t start = 0; start < size; start += std::min(piece, size - start))
    sizes.push_back(std::min(piece, size - start));
  if (size == 0) {
    // torch.chunk of an empty dimension gives `chunks` empty pieces (ATen's chunk calls
    // split_with_sizes then, "because a call to split would discard the number of
    // chunks"). Their count is checked before a list of that length is made.
    constexpr int64_t kMaxEmptyPieces = int64_t{1} << 20;
    MG_CHECK(chunks <= kMaxEmptyPieces,
             "chunk: {} empty pieces of dimension {} (of size 0, shape {}) are more than the "
             "{} that chunk makes of an empty dimension",
             chunks, dim, x.shape(), kMaxEmptyPieces);
    sizes.assign(static_cast<size_t>(chunks), 0);
  }
  return split(x, sizes, dim);
}

}  // namespace mg
