// The differentiable operations of minigrad. Each one's forward and backward sit side
// by side in autograd/functions/<family>.cpp. Binary ops broadcast as in numpy.
#pragma once

#include <vector>

#include <minigrad/core/cross_entropy_options.h>
#include <minigrad/core/tensor.h>

namespace mg {

// ---- elementwise (functions/elementwise.cpp) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
Tensor div(const Tensor& a, const Tensor& b);
Tensor add(const Tensor& a, double b);
Tensor mul(const Tensor& a, double b);
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor relu(const Tensor& x);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, double b);
Tensor operator+(double a, const Tensor& b);
Tensor operator-(const Tensor& a, double b);
Tensor operator-(double a, const Tensor& b);
Tensor operator*(const Tensor& a, double b);
Tensor operator*(double a, const Tensor& b);
Tensor operator/(const Tensor& a, double b);

// ---- reductions (functions/reduce.cpp) ----
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

// ---- linear algebra (functions/linalg.cpp) ----
Tensor matmul(const Tensor& a, const Tensor& b);
// x @ w^T + b, with w of shape [out, in] as in torch.nn.functional.linear.
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());
// relu(linear(x, w, b)) computed as one op: the same values, gradients and backward graph
// (LinearBackward, ReluBackward) as the two ops, with no pre-activation in memory (the
// ReLU runs in place on the product). b is required.
Tensor linear_relu(const Tensor& x, const Tensor& w, const Tensor& b);

// ---- softmax and loss (functions/loss.cpp) ----
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
// Cross-entropy of [batch, classes] logits against int64 class targets, as PyTorch's
// F::cross_entropy: the mean over the batch by default; ignore_index (-100), label
// smoothing and the reduction (mean, sum, none) are options
// (core/cross_entropy_options.h), e.g.
//   cross_entropy(x, y, CrossEntropyOptions().ignore_index(-1).label_smoothing(0.1))
Tensor cross_entropy(const Tensor& logits, const Tensor& targets,
                     const CrossEntropyOptions& options = {});

// ---- shape and placement (functions/shape.cpp) ----
Tensor reshape(const Tensor& x, const Shape& shape);
Tensor view(const Tensor& x, const Shape& shape);
Tensor transpose(const Tensor& x, int64_t dim0, int64_t dim1);
Tensor narrow(const Tensor& x, int64_t dim, int64_t start, int64_t length);
Tensor expand(const Tensor& x, const Shape& shape);
Tensor contiguous(const Tensor& x);
Tensor to(const Tensor& x, Device device);  // a copy; its backward copies the grad back
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Splits into `chunks` pieces of ceil(size / chunks) along dim (the last may be smaller;
// fewer pieces when there are not enough rows), as torch.chunk. The pieces are views. An
// empty dimension gives `chunks` empty pieces, as torch.chunk does (at most 2^20 of them).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);

}  // namespace mg
