// mg::ops: the non-differentiable tensor operations. Each checks its inputs (naming
// the op, shapes, dtypes and devices on failure), allocates its output on the inputs'
// device and calls that device's Backend. autograd/ builds the differentiable API on
// top of these; optimizers and backward functions call them directly.
#pragma once

#include <vector>

#include <minigrad/core/backend.h>
#include <minigrad/core/tensor.h>

namespace mg::ops {

// ---- views: share storage, never copy ----
Tensor as_strided(const Tensor& t, const Shape& shape, std::vector<int64_t> strides,
                  int64_t offset);
Tensor view(const Tensor& t, const Shape& shape);  // mg::Error if strides do not allow it
bool can_view(const Tensor& t, const Shape& shape);
Tensor expand(const Tensor& t, const Shape& shape);
Tensor transpose(const Tensor& t, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& t, int64_t dim, int64_t start, int64_t length);
// A shape with one -1 entry inferred from numel (as in reshape(-1, 4)).
Shape infer_shape(const Shape& shape, int64_t numel, const char* op);

// ---- copies ----
Tensor contiguous(const Tensor& t);  // t itself when already contiguous
Tensor clone(const Tensor& t);       // always a new contiguous copy
Tensor copy_to(const Tensor& t, Device device);
void copy_(const Tensor& dst, const Tensor& src);  // src broadcast to dst's shape

// ---- elementwise (binary ops broadcast) ----
Tensor unary(UnaryOp op, const Tensor& x);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor binary_scalar(BinaryOp op, const Tensor& x, double scalar);
Tensor relu_backward(const Tensor& grad_out, const Tensor& input);

// ---- reductions ----
// Sum over `dims` (all dims when empty).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Sums a broadcast gradient back down to `shape` (the input's shape before broadcast).
Tensor sum_to(const Tensor& x, const Shape& shape);
Tensor argmax(const Tensor& x, int64_t dim);
// max |x| over all elements as a 0-dim float32 tensor on x's device: NaN if any element
// is NaN, 0 for an empty x (torch's x.abs().max(), the infinity norm).
Tensor abs_max(const Tensor& x);

// ---- linear algebra, softmax, loss ----
Tensor matmul(const Tensor& a, const Tensor& b);  // 2-D @ 2-D
// a @ b + bias, with a 1-D bias added to every row (torch.addmm; Linear's forward).
Tensor addmm(const Tensor& bias, const Tensor& a, const Tensor& b);
// relu(a @ b + bias) in one backend call (a Linear layer and the ReLU after it).
Tensor addmm_relu(const Tensor& bias, const Tensor& a, const Tensor& b);
Tensor log_softmax(const Tensor& x, int64_t dim);
Tensor log_softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim);
// Cross-entropy of [batch, classes] logits against int64 class targets [batch], as
// core/cross_entropy_options.h describes (a scalar, or [batch] for Reduction::None).
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = {});
Tensor cross_entropy_backward(const Tensor& grad_loss, const Tensor& logits,
                              const Tensor& targets, const CrossEntropyOptions& options = {});

// ---- checks shared by ops ----
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_float(const char* op, const Tensor& t);

}  // namespace mg::ops
