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
// int64 x: Neg, Relu and Abs are int64; Exp, Log, Sqrt and Tanh float32 (as torch's).
Tensor unary(UnaryOp op, const Tensor& x);
Tensor binary(BinaryOp op, const Tensor& a, const Tensor& b);
Tensor binary_scalar(BinaryOp op, const Tensor& x, double scalar);
Tensor relu_backward(const Tensor& grad_out, const Tensor& input);

// ---- reductions ----
// Sum over `dims` (all dims when empty).
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim);
// Sums a broadcast gradient back down to `shape` (the input's shape before broadcast).
Tensor sum_to(const Tensor& x, const Shape& shape);
// Any dtype. No rows (a [0, 3] tensor along dim 1) give an empty result; an empty dim
// (along dim 0 of [0, 3]) has no maximum, an mg::Error as in torch.
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

// ---- dtypes ----
// t converted to `dtype` (a new tensor; t itself when it already has that dtype).
Tensor to_dtype(const Tensor& t, DType dtype);
// A float32 tensor rounded stochastically to `dtype` (bfloat16 or float16), unbiased, with
// Philox draws from (seed, offset): Backend::round_stochastic. It takes ceil(numel / 4)
// Philox blocks from `offset`.
Tensor round_stochastic(const Tensor& t, DType dtype, uint64_t seed, uint64_t offset);

// ---- the transformer's ops (core/ops_transformer.cpp) ----
// The view of t with its dimensions in the order `dims` (a permutation; negative dims count
// from the end), as torch.permute.
Tensor permute(const Tensor& t, const std::vector<int64_t>& dims);
// a[..., m, k] @ b[..., k, n] with the batch dimensions broadcast (both at least 2-D).
Tensor bmm(const Tensor& a, const Tensor& b);
Tensor softmax(const Tensor& x, int64_t dim);
Tensor softmax_backward(const Tensor& grad_out, const Tensor& output, int64_t dim);
Tensor tanh(const Tensor& x);
// tanh_form: GPT-2's approximation (approximate="tanh"); else the exact erf form.
Tensor gelu(const Tensor& x, bool tanh_form);
Tensor gelu_backward(const Tensor& grad_out, const Tensor& input, bool tanh_form);
// x * sigmoid(x), and its gradient given grad_out.
Tensor silu(const Tensor& x);
Tensor silu_backward(const Tensor& grad_out, const Tensor& input);
// x where mask == 0, value where mask != 0; mask (int64 or float) broadcasts to x's shape.
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// Zeroes element i of x (row-major) where philox::uniform(seed, offset, i) < p and scales
// the others by 1 / (1 - p). It takes ceil(numel / 4) Philox blocks from `offset`.
Tensor dropout(const Tensor& x, double p, uint64_t seed, uint64_t offset);
// Layer normalisation over the last `normalized_dims` dimensions of x; weight and bias
// (or undefined) have the shape of those dimensions. mean and rstd are [rows], rows the
// product of the other dimensions, in compute_dtype(x) (float32 for a 16-bit x).
struct LayerNormOutput {
  Tensor out, mean, rstd;
};
LayerNormOutput layer_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight,
                           const Tensor& bias, double eps);
// {grad_x, grad_weight, grad_bias}; the last two only when asked for.
std::vector<Tensor> layer_norm_backward(const Tensor& grad_out, const Tensor& x,
                                        int64_t normalized_dims, const Tensor& mean,
                                        const Tensor& rstd, const Tensor& weight,
                                        bool grad_weight, bool grad_bias);
// RMS normalisation over the last `normalized_dims` dimensions of x, times weight (of
// their shape, or undefined); rstd is [rows] in compute_dtype(x), as layer_norm's.
struct RmsNormOutput {
  Tensor out, rstd;
};
RmsNormOutput rms_norm(const Tensor& x, int64_t normalized_dims, const Tensor& weight, double eps);
// {grad_x, grad_weight}; grad_weight only when asked for.
std::vector<Tensor> rms_norm_backward(const Tensor& grad_out, const Tensor& x, int64_t normalized_dims,
                                      const Tensor& rstd, const Tensor& weight, bool grad_weight);
// Rotary embedding of x [B, T, H, D] by the angles of cos and sin [T, D/2] (rotate_half
// layout, Backend::rotary_embedding); inverse: by the opposite angles. mg::Error naming the
// shapes, dtypes and devices unless they fit.
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin, bool inverse);
// weight [vocab, dim] gathered at int64 indices of any shape: [..., dim].
Tensor embedding(const Tensor& weight, const Tensor& indices);
// The [vocab, dim] gradient of embedding given grad_out [..., dim].
Tensor embedding_backward(const Tensor& grad_out, const Tensor& indices, int64_t vocab);
// mg::Error unless q [..., L, E], k [..., S, E], v [..., S, Ev] fit together: one device,
// one float dtype, the same leading dimensions, and S > 0 unless there is no query (an
// empty batch, L = 0).
void check_attention(const Tensor& q, const Tensor& k, const Tensor& v);
// Fused attention (Backend::attention) over q [..., tq, d], k [..., tk, d], v [..., tk, dv]
// with equal batch dimensions: {out [..., tq, dv], lse [..., tq]}; lse in compute_dtype(q)
// (float32 for 16-bit q, k, v).
std::vector<Tensor> attention(const Tensor& q, const Tensor& k, const Tensor& v, double scale,
                              bool causal, double dropout_p, uint64_t seed, uint64_t offset);
// {grad_q, grad_k, grad_v} of attention.
std::vector<Tensor> attention_backward(const Tensor& grad_out, const Tensor& q, const Tensor& k,
                                       const Tensor& v, const Tensor& out, const Tensor& lse,
                                       double scale, bool causal, double dropout_p,
                                       uint64_t seed, uint64_t offset);

// ---- checks shared by ops ----
void check_same_device(const char* op, const Tensor& a, const Tensor& b);
void check_float(const char* op, const Tensor& t);

}  // namespace mg::ops
