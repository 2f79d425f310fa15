// The differentiable operations of minigrad. Each one's forward and backward sit side
// by side in autograd/functions/<family>.cpp. Binary ops broadcast as in numpy, and
// promote as torch does: int64 with a float tensor computes in that float type, float32
// with float64 in float64 (the promoted operand's gradient comes back in its own dtype).
// A scalar operand (core/scalar.h) promotes by its category, never by its value: an int64
// tensor with an integer scalar stays int64 (ints * 2), with a floating-point scalar it
// becomes float32, the default float dtype (ints * 2.0, ints + 1.0, ints * 0.5); a float
// tensor keeps its dtype whatever the scalar.
#pragma once

#include <initializer_list>
#include <string>
#include <vector>

#include <minigrad/core/cross_entropy_options.h>
#include <minigrad/core/scalar.h>
#include <minigrad/core/tensor.h>

namespace mg {

// ---- elementwise (functions/elementwise.cpp) ----
Tensor add(const Tensor& a, const Tensor& b);
Tensor sub(const Tensor& a, const Tensor& b);
Tensor mul(const Tensor& a, const Tensor& b);
// True division, as torch's `/`: int64 operands divide as float32 (7 / 2 == 3.5).
Tensor div(const Tensor& a, const Tensor& b);
// With a scalar (promoted as the top of this file says): a + b, a - b, a * b, and a / b,
// true division (int64 / 2 is float32, as torch's `/`).
Tensor add(const Tensor& a, Scalar b);
Tensor sub(const Tensor& a, Scalar b);
Tensor mul(const Tensor& a, Scalar b);
Tensor div(const Tensor& a, Scalar b);
// b - a and b / a (torch's rsub, and `2 / x`: reciprocal(x) * 2, as torch computes it).
Tensor rsub(const Tensor& a, Scalar b);
Tensor rdiv(const Tensor& a, Scalar b);
// neg and relu keep an int64 tensor int64 (relu(x) is max(x, 0)); exp, log and tanh of
// an int64 tensor are float32, as in torch.
Tensor neg(const Tensor& x);
Tensor exp(const Tensor& x);
Tensor log(const Tensor& x);
Tensor relu(const Tensor& x);
Tensor tanh(const Tensor& x);
// torch.nn.functional.gelu: approximate "none" (x * Phi(x), with erf) or "tanh" (GPT-2's
// 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))).
Tensor gelu(const Tensor& x, const std::string& approximate = "none");
// torch.nn.functional.silu: x * sigmoid(x) (the gate of the Llama's SwiGLU MLP).
Tensor silu(const Tensor& x);
// x with `value` wherever mask != 0 (mask: int64 0/1 or float, broadcastable to x's shape,
// never differentiated), as torch's x.masked_fill(mask, value).
Tensor masked_fill(const Tensor& x, const Tensor& mask, double value);
// torch.nn.functional.dropout: zeroes each element with probability p and scales the rest
// by 1 / (1 - p) when training; the identity when !training or p == 0. The mask is drawn
// from `gen` (the default generator when null) with counter-based Philox, so the same
// seed and offset give the same mask on the CPU and on a GPU; backward redraws it rather
// than keeping it.
class Generator;
Tensor dropout(const Tensor& x, double p, bool training, Generator* gen = nullptr);

Tensor operator+(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& a, const Tensor& b);
Tensor operator*(const Tensor& a, const Tensor& b);
Tensor operator/(const Tensor& a, const Tensor& b);
Tensor operator-(const Tensor& x);
Tensor operator+(const Tensor& a, Scalar b);
Tensor operator+(Scalar a, const Tensor& b);
Tensor operator-(const Tensor& a, Scalar b);
Tensor operator-(Scalar a, const Tensor& b);
Tensor operator*(const Tensor& a, Scalar b);
Tensor operator*(Scalar a, const Tensor& b);
Tensor operator/(const Tensor& a, Scalar b);
Tensor operator/(Scalar a, const Tensor& b);

// ---- reductions (functions/reduce.cpp) ----
// sum keeps the dtype (int64 sums are int64); an empty sum is 0.
Tensor sum(const Tensor& x);
Tensor sum(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);
// Floating-point tensors only (torch refuses int64 too). The mean of no elements is NaN,
// as torch's (a [0, 3] tensor's mean over dim 0 is [NaN, NaN, NaN]); its gradient is empty.
Tensor mean(const Tensor& x);
Tensor mean(const Tensor& x, const std::vector<int64_t>& dims, bool keepdim = false);

// ---- linear algebra (functions/linalg.cpp) ----
// torch.matmul: 1-D @ 1-D is a dot product (0-dim); a 1-D operand is promoted to a matrix
// ([1, k] on the left, [k, 1] on the right) and that dimension removed from the result;
// 2-D @ 2-D a matrix product; otherwise a batched product over the leading dimensions,
// broadcast (a [B, H, T, D] @ [D, T] is fine).
Tensor matmul(const Tensor& a, const Tensor& b);
// x @ w^T + b, with w of shape [out, in] as in torch.nn.functional.linear; x of any rank
// [..., in] gives [..., out] (a [B, T, C] activation as in a transformer).
Tensor linear(const Tensor& x, const Tensor& w, const Tensor& b = Tensor());
// relu(linear(x, w, b)) computed as one op: the same values, gradients and backward graph
// (LinearBackward, ReluBackward) as the two ops, with no pre-activation in memory (the
// ReLU runs in place on the product). b is required.
Tensor linear_relu(const Tensor& x, const Tensor& w, const Tensor& b);

// ---- softmax and loss (functions/loss.cpp, functions/activation.cpp) ----
Tensor log_softmax(const Tensor& x, int64_t dim = -1);
Tensor softmax(const Tensor& x, int64_t dim);
// Cross-entropy of [batch, classes] logits against int64 class targets, as PyTorch's
// F::cross_entropy: the mean over the batch by default; ignore_index (-100), label
// smoothing and the reduction (mean, sum, none) are options
// (core/cross_entropy_options.h), e.g.
//   cross_entropy(x, y, CrossEntropyOptions().ignore_index(-1).label_smoothing(0.1))
// An empty batch ([0, classes]) gives torch's results: NaN for the mean (no rows to
// average), 0 for the sum, [0] for none; its gradient is empty.
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
// A copy in `dtype` (x itself when it has it); its backward converts the grad back.
Tensor to(const Tensor& x, DType dtype);
// A view with the dimensions reordered, as torch.permute (negative dims count from the end).
Tensor permute(const Tensor& x, const std::vector<int64_t>& dims);
Tensor cat(const std::vector<Tensor>& tensors, int64_t dim = 0);
// Splits into `chunks` pieces of ceil(size / chunks) along dim (the last may be smaller;
// fewer pieces when there are not enough rows), as torch.chunk. The pieces are views. An
// empty dimension gives `chunks` empty pieces, as torch.chunk does (at most 2^20 of them).
std::vector<Tensor> chunk(const Tensor& x, int64_t chunks, int64_t dim = 0);
std::vector<Tensor> split(const Tensor& x, const std::vector<int64_t>& sizes, int64_t dim = 0);
// Pieces of `split_size` along dim (the last may be smaller), as torch.split(x, int, dim).
std::vector<Tensor> split(const Tensor& x, int64_t split_size, int64_t dim = 0);

// ---- the transformer's layers (functions/embedding.cpp, functions/normalization.cpp) ----
// Rows of weight [num_embeddings, dim] at int64 indices of any shape: [..., dim]. Backward
// sums each row's gradients in index order (deterministic); an index outside
// [0, num_embeddings) is an mg::Error naming it.
Tensor embedding(const Tensor& weight, const Tensor& indices);
// torch.nn.functional.layer_norm over the trailing `normalized_shape` dimensions, with the
// biased variance; weight and bias of normalized_shape, or undefined (no affine part).
// One fused op that saves the row mean and 1/sqrt(var + eps) for backward.
Tensor layer_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                  const Tensor& bias = Tensor(), double eps = 1e-5);
Tensor layer_norm(const Tensor& x, const std::vector<int64_t>& normalized_shape,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);
// layer_norm(x, {C}, w, b): a braced list picks this one (it would fit both above).
Tensor layer_norm(const Tensor& x, std::initializer_list<int64_t> normalized_shape,
                  const Tensor& weight = Tensor(), const Tensor& bias = Tensor(),
                  double eps = 1e-5);

// torch.nn.functional.rms_norm (torch >= 2.4; HF's LlamaRMSNorm computes the same):
// x / sqrt(mean(x^2 over normalized_shape) + eps) * weight; weight of normalized_shape, or
// undefined. One fused op that saves 1/sqrt(mean(x^2) + eps) per row for backward.
Tensor rms_norm(const Tensor& x, const Shape& normalized_shape, const Tensor& weight = Tensor(),
                double eps = 1e-6);
Tensor rms_norm(const Tensor& x, std::initializer_list<int64_t> normalized_shape,
                const Tensor& weight = Tensor(), double eps = 1e-6);
// Rotary position embedding (RoFormer; HF's apply_rotary_pos_emb, the rotate_half layout):
// x [B, T, H, D] (D even) -> x * cos + rotate_half(x) * sin, where rotate_half(x) is
// cat(-x[..., D/2:], x[..., :D/2]) and cos, sin [T, D/2] (x's dtype and device) are the
// angles' tables of the T positions (each used for both halves). Differentiable in x; the
// tables are constants (functions/rotary_embedding.cpp).
Tensor rotary_embedding(const Tensor& x, const Tensor& cos, const Tensor& sin);

// ---- attention (functions/attention.cpp) ----
// torch.nn.functional.scaled_dot_product_attention for q [..., L, E], k [..., S, E],
// v [..., S, Ev] (the same leading dimensions): softmax(q k^T / sqrt(E) [causal mask])
// with dropout, times v. is_causal masks key j > query i (torch's tril(ones(L, S))).
// Runs fused (one op, the [L, S] matrix never in memory) when fused attention is enabled,
// else as the composition below; both give the same values and gradients.
Tensor scaled_dot_product_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                                   bool is_causal = false, double dropout_p = 0.0,
                                   Generator* gen = nullptr);
// What scaled_dot_product_attention computes, written as the ops a reader knows: matmul,
// scale, masked_fill(-inf) for the causal mask, softmax, dropout, matmul.
Tensor scaled_dot_product_attention_composed(const Tensor& q, const Tensor& k, const Tensor& v,
                                            bool is_causal = false, double dropout_p = 0.0,
                                            Generator* gen = nullptr);
// The fused path (Backend::attention: FlashAttention's online softmax, blocked over keys on
// the CPU), whatever the switch says. Backward recomputes the probabilities from the
// saved log-sum-exp instead of saving them.
Tensor scaled_dot_product_attention_fused(const Tensor& q, const Tensor& k, const Tensor& v,
                                         bool is_causal = false, double dropout_p = 0.0,
                                         Generator* gen = nullptr);
// Whether scaled_dot_product_attention takes the fused path: on by default; one setting for
// the process (as nn::set_fusion_enabled), or for a scope with FusedAttentionGuard.
bool fused_attention_enabled();
void set_fused_attention_enabled(bool enabled);
class FusedAttentionGuard {
 public:
  explicit FusedAttentionGuard(bool enabled) : previous_(fused_attention_enabled()) {
    set_fused_attention_enabled(enabled);
  }
  ~FusedAttentionGuard() { set_fused_attention_enabled(previous_); }
  FusedAttentionGuard(const FusedAttentionGuard&) = delete;
  FusedAttentionGuard& operator=(const FusedAttentionGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace mg
