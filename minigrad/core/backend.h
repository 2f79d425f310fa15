// Backend: the operations a device type must provide. core/cpu implements it for the
// host; cuda/ implements it for NVIDIA GPUs and registers itself at start-up.
//
// Contract: the ops layer (core/ops.cpp) checks shapes, dtypes and devices, allocates
// every output and broadcasts inputs (stride-0 views), so a backend only computes:
// inputs and outputs are already on its device, shapes agree, and any input may be a
// strided view. Outputs are freshly allocated and contiguous unless stated otherwise.
// Where an output may be an existing tensor (the in-place forms of binary and
// binary_scalar, copy and fill into a view, sgd_step), the caller bumps that tensor's
// version counter (core/tensor.h: bump_version), never the backend: Tensor's in-place
// methods, ops::copy_, the optimizers and the engine do it, and code that writes a
// visible tensor through a Backend directly must do it too.
//
// Every op on floats takes the 16-bit floats too (bfloat16, float16: core/dtype.h): each
// output is computed in float32 from the inputs' exact float32 values and rounded once
// (reductions and GEMMs accumulate in float32), so a 16-bit op equals the float32 op on
// the same inputs, rounded, up to the order of its float32 sums.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/allocator.h>
#include <minigrad/core/cross_entropy_options.h>
#include <minigrad/core/device.h>
#include <minigrad/core/stream.h>
#include <minigrad/core/tensor.h>

namespace mg {

// Sqrt, Abs and Maximum are not differentiable ops of the user API: optimizers and
// gradient clipping use them (ops::unary / ops::binary) on values outside the graph.
enum class UnaryOp { Neg, Exp, Log, Relu, Sqrt, Abs, Tanh };
// Maximum propagates NaN (torch.maximum): max(NaN, x) and max(x, NaN) are NaN.
enum class BinaryOp { Add, Sub, Mul, Div, Maximum };

inline const char* op_name(UnaryOp op) {
  switch (op) {
    case UnaryOp::Neg: return "neg";
    case UnaryOp::Exp: return "exp";
    case UnaryOp::Log: return "log";
    case UnaryOp::Relu: return "relu";
    case UnaryOp::Sqrt: return "sqrt";
    case UnaryOp::Abs: return "abs";
    case UnaryOp::Tanh: return "tanh";
  }
  return "?";
}
inline const char* op_name(BinaryOp op) {
  switch (op) {
    case BinaryOp::Add: return "add";
    case BinaryOp::Sub: return "sub";
    case BinaryOp::Mul: return "mul";
    case BinaryOp::Div: return "div";
    case BinaryOp::Maximum: return "maximum";
  }
  return "?";
}

// One step of optim::SGD's update rule (nn/optim/sgd.h) over tensors of one device:
//
//   d_p = g + weight_decay * p                        (when weight_decay != 0)
//   buf = d_p                                         (a new buffer: its first step)
//   buf = buf * momentum + (1 - dampening) * d_p      (a buffer's later steps)
//   d_p = nesterov ? d_p + momentum * buf : buf       (when momentum != 0)
//   p   = p + (-lr) * d_p
//
// in float32, each product and sum rounded on its own (no fused multiply-add), with
// the scalars rounded to float first (weight_decay, momentum, 1 - dampening computed in
// double, -lr), as the in-place ops add_ and mul_ compute it: a fused implementation
// gives the bits of that composition.
struct SgdTensor {
  Tensor param;
  Tensor grad;
  Tensor momentum_buffer;     // undefined when momentum == 0
  bool new_buffer = false;    // its first step: momentum_buffer's values are not read
};
struct SgdStep {
  std::vector<SgdTensor> tensors;
  double lr = 0.0, momentum = 0.0, dampening = 0.0, weight_decay = 0.0;
  bool nesterov = false;
};

// mg::Error unless `step` is what Backend::sgd_step takes: every param, grad and
// momentum buffer (one per tensor exactly when momentum != 0) is float32, contiguous,
// of the param's shape and on `device`.
void check_sgd_step(const SgdStep& step, Device device);

// One step of optim::Adam or optim::AdamW (nn/optim/adam.h) over tensors of one device,
// torch.optim.Adam/AdamW's update with their roundings:
//
//   g    = maximize ? -grad : grad
//   p    = p * (1 - lr * weight_decay)                (AdamW, when weight_decay != 0)
//   g    = g + weight_decay * p                       (Adam, when weight_decay != 0)
//   m    = m * beta1 + (1 - beta1) * g                (exp_avg.mul_(beta1).add_(g, 1 - beta1))
//   v    = v * beta2 + ((1 - beta2) * g) * g          (exp_avg_sq.mul_(beta2).addcmul_(g, g, 1 - beta2))
//   vmax = maximum(vmax, v)                           (amsgrad)
//   d    = sqrt(amsgrad ? vmax : v) / bias_correction2_sqrt + eps
//   p    = p + ((-step_size) * m) / d                 (p.addcdiv_(m, d, -step_size))
//
// in float32, each product, quotient, sum and square root rounded on its own, with the
// scalars rounded to float first (1 - lr * weight_decay, 1 - beta1, 1 - beta2 and
// -step_size computed in double). Each tensor brings its own bias corrections, since a
// parameter counts its own steps: step_size = lr / (1 - beta1^step) and
// bias_correction2_sqrt = sqrt(1 - beta2^step), in double. The state of a first step is
// zeros (m, v, vmax), as PyTorch starts it.
struct AdamTensor {
  Tensor param;
  Tensor grad;
  Tensor exp_avg;
  Tensor exp_avg_sq;
  Tensor max_exp_avg_sq;  // undefined unless amsgrad
  double step_size = 0.0;
  double bias_correction2_sqrt = 1.0;
};
struct AdamStep {
  std::vector<AdamTensor> tensors;
  double lr = 1e-3, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool decoupled_weight_decay = false;  // AdamW: p *= 1 - lr * weight_decay
  bool amsgrad = false;
  bool maximize = false;
};

// mg::Error unless `step` is what Backend::adam_step takes: every param, grad, exp_avg,
// exp_avg_sq (and max_exp_avg_sq exactly when amsgrad) is contiguous, of the param's
// shape and on `device`, and every tensor of the step is float32, or every one float64.
void check_adam_step(const AdamStep& step, Device device);
// The one floating dtype of a checked step's tensors (Float32 for an empty step).
DType adam_step_dtype(const AdamStep& step);

// A device's memory as its driver reports it: free and total bytes (cudaMemGetInfo on a
// GPU; the host's MemAvailable and MemTotal on the CPU). `known` is false where the
// backend cannot tell.
struct MemoryInfo {
  std::size_t free_bytes = 0;
  std::size_t total_bytes = 0;
  bool known = false;
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual DeviceType type() const = 0;
  virtual int device_count() const = 0;
  virtual Allocator& allocator(int index) = 0;

  // ---- devices, streams, events (no-ops on the CPU) ----
  virtual int current_device() const = 0;
  virtual void set_device(int index) = 0;
  virtual Stream current_stream(int index) = 0;
  virtual void set_current_stream(const Stream& stream) = 0;
  virtual Stream compute_stream(int index) = 0;
  virtual Stream copy_stream(int index) = 0;
  virtual void synchronize(int index) = 0;
  virtual void* event_create(int index) = 0;
  virtual void event_destroy(void* event) = 0;
  virtual void event_record(void* event, const Stream& stream) = 0;
  virtual void event_block(void* event, const Stream& stream) = 0;
  virtual void event_synchronize(void* event) = 0;
  // Extra streams of a device, for work that must overlap on one device (pipeline
  // stages sharing a GPU): slot k is the same stream at every call. The default, for
  // backends without streams, is the compute stream.
  virtual Stream pool_stream(int index, int slot) { (void)slot; return compute_stream(index); }
  // Free and total memory of the device; the default says it is unknown.
  virtual MemoryInfo memory_info(int index) { (void)index; return {}; }
  // Bytes held by live tensors on the device now (what its allocator handed out and has
  // not had back; cached blocks are not counted). The default, for a backend that does
  // not count, is 0.
  virtual std::size_t memory_allocated(int index) { (void)index; return 0; }

  // ---- the profiler's device spans and memory counters (core/profiler.h) ----
  // A new event that can be timed, recorded on `stream` (destroy it with event_destroy),
  // or null where the backend times nothing on streams: the CPU, whose work runs on the
  // calling thread and is timed there, or a stream being captured into a CUDA graph.
  virtual void* timing_event_record(const Stream& stream) { (void)stream; return nullptr; }
  // Milliseconds from `start` to `end`, two timing events of one device, waiting for both.
  virtual double event_elapsed_ms(void* start, void* end);

  // ---- data ----
  // dst = src; same shape and dtype; any strides. For copies between device types the
  // backend of the non-CPU side is called, with one of dst/src on the host.
  virtual void copy(const Tensor& dst, const Tensor& src) = 0;
  // dst = src converted to dst's dtype (float to int64 truncates toward zero, as a C++
  // cast); same shape and device, any strides.
  virtual void convert(const Tensor& dst, const Tensor& src);
  virtual void fill(const Tensor& dst, double value) = 0;              // dst contiguous
  virtual void arange(const Tensor& dst, double start, double step) = 0;  // dst contiguous
  // Counter-based random numbers (core/philox.h) from Philox block `offset` on, so CPU
  // and CUDA give the same values for the same seed and offset. dst contiguous.
  virtual void random_uniform(const Tensor& dst, double low, double high, uint64_t seed,
                              uint64_t offset) = 0;
  virtual void random_normal(const Tensor& dst, double mean, double stddev, uint64_t seed,
                             uint64_t offset) = 0;
  // out (bfloat16 or float16) = in (float32; both contiguous, one shape) rounded
  // stochastically: to one of the two 16-bit values around it, the upper one with
  // probability (in - lower) / (upper - lower), so that E[out] = in (llm.c's rounding of
  // float32 master weights into bfloat16 parameters). Element i draws
  // philox::uniform(seed, offset, i); a value that is representable, not finite, or
  // whose nearest rounding overflows, rounds to nearest; one between the largest finite
  // value and that overflow stays at the largest.
  virtual void round_stochastic(const Tensor& out, const Tensor& in, uint64_t seed,
                                uint64_t offset);

  // ---- elementwise (the floats; add/sub/mul/div also int64) ----
  // relu(NaN) is NaN (PyTorch's clamp_min propagates NaN). int64: Neg, Relu and Abs, -x
  // and |x| wrapping at INT64_MIN (ops::unary computes the others of int64 in float32).
  virtual void unary(UnaryOp op, const Tensor& out, const Tensor& in) = 0;
  // out = a op (alpha * b) for Add/Sub; out = a op b otherwise. `out` may alias `a`
  // (in-place updates), element for element. Maximum: float32 and int64. int64 sums and
  // products wrap around (two's complement, as in PyTorch); int64 divisors are checked by
  // ops::binary (no zero, no INT64_MIN / -1), and alpha is a whole number in int64's range.
  virtual void binary(BinaryOp op, const Tensor& out, const Tensor& a, const Tensor& b,
                      double alpha) = 0;
  // out = in op scalar (Add, Sub, Mul, Div); `out` may alias `in`.
  virtual void binary_scalar(BinaryOp op, const Tensor& out, const Tensor& in,
                             double scalar) = 0;
  // grad_in = 0 where input <= 0, else grad_out (a NaN input passes the gradient, as
  // PyTorch's threshold_backward).
  virtual void relu_backward(const Tensor& grad_in, const Tensor& grad_out,
                             const Tensor& input) = 0;

  // ---- the transformer's elementwise ops (the floats, any strides) ----
  // The entries below the line default to an mg::Error naming the op and the backend, so
  // a backend that lacks a kernel says so rather than failing to link.
  // out = gelu(in): exact (x * Phi(x), erf) or, with tanh_form, GPT-2's tanh
  // approximation, as torch.nn.functional.gelu(approximate="none" / "tanh").
  virtual void gelu(const Tensor& out, const Tensor& in, bool tanh_form);
  virtual void gelu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input,
                             bool tanh_form);
  // out = silu(in) = in * sigmoid(in), as torch.nn.functional.silu (the Llama's SwiGLU gate).
  virtual void silu(const Tensor& out, const Tensor& in);
  virtual void silu_backward(const Tensor& grad_in, const Tensor& grad_out, const Tensor& input);
  // out = mask != 0 ? value : in, elementwise; mask (int64 or float, of out's shape: the
  // ops layer expands it) may be any dtype of the table.
  virtual void masked_fill(const Tensor& out, const Tensor& in, const Tensor& mask, double value);
  // out[i] = u_i >= p ? in[i] / (1 - p) : 0, where u_i = philox::uniform(seed, offset, i)
  // and i is the element's row-major index in out's shape: the same mask on every backend
  // for one seed and offset. p in [0, 1).
  virtual void dropout(const Tensor& out, const Tensor& in, double p, uint64_t seed,
                       uint64_t offset);

  // ---- reductions ----
  // `out` has in's rank, size 1 in the reduced dims (keepdim form): out = sum over them.
  virtual void sum(const Tensor& out, const Tensor& in) = 0;
  // out[i] = argmax_j in[i, j]; in is 2-D (any dtype, at least one row and one column),
  // out int64 of size rows. NaN is larger than every number (PyTorch's order); ties go to
  // the first index.
  virtual void argmax(const Tensor& out, const Tensor& in) = 0;
  // out (one float32) = the largest |in| over all elements, NaN if any is NaN (the
  // infinity norm, for gradient clipping). in is float32, contiguous, not empty.
  virtual void abs_max(const Tensor& out, const Tensor& in) = 0;

  // ---- linear algebra ----
  // out[m,n] = a[m,k] @ b[k,n]. a and b may be contiguous or transposed views; a
  // backend should pass transposes to its GEMM rather than copy.
  virtual void matmul(const Tensor& out, const Tensor& a, const Tensor& b) = 0;
  // out[m,n] = a[m,k] @ b[k,n] + bias[n] on every row: a Linear layer's forward in one
  // call (torch.addmm). bias is 1-D, contiguous. The default is matmul followed by a
  // broadcast add; a backend can fuse the two (BLAS beta = 1, a cuBLASLt epilogue).
  virtual void addmm(const Tensor& out, const Tensor& bias, const Tensor& a, const Tensor& b);
  // out = relu(a @ b + bias): a Linear layer followed by a ReLU. The default is addmm
  // and then relu in place. A backend may fuse the ReLU into its GEMM only where that
  // keeps relu(NaN) = NaN (cuBLASLt's RELU epilogue is max(x, 0), so CUDA does not).
  virtual void addmm_relu(const Tensor& out, const Tensor& bias, const Tensor& a,
                          const Tensor& b);

  // out[..., m, n] = a[..., m, k] @ b[..., k, n] for every index of the batch dimensions
  // (the same in out, a and b: the ops layer broadcasts them, so a batch stride may be 0);
  // out contiguous, a and b strided.
  virtual void bmm(const Tensor& out, const Tensor& a, const Tensor& b);

  // ---- softmax and cross-entropy over the last dim of 2-D [rows, classes] ----
  virtual void log_softmax(const Tensor& out, const Tensor& in) = 0;
  // grad_in = grad_out - exp(output) * sum(grad_out, -1)
  virtual void log_softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                                    const Tensor& output) = 0;
  // out = softmax(in) over each row; a row of -inf only (or holding +inf) is NaN, as PyTorch.
  virtual void softmax(const Tensor& out, const Tensor& in);
  // grad_in = output * (grad_out - sum(grad_out * output, -1))
  virtual void softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                                const Tensor& output);
  // The row losses of core/cross_entropy_options.h, reduced as options.reduction() says
  // into `loss`: a scalar for Mean and Sum, [rows] for None (0 for an ignored row).
  // targets int64 [rows], each in [0, classes) or options.ignore_index(); the CPU backend
  // throws on any other value, the CUDA one reports it through its target check.
  virtual void cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets,
                             const CrossEntropyOptions& options) = 0;
  // grad_logits[i] = (softmax(logits[i]) - q_i) * s_i, where q_i = (1 - eps) onehot(t_i)
  // + eps / classes and s_i is grad_loss (Sum), grad_loss / rows not ignored (Mean) or
  // grad_loss[i] (None); an ignored row's gradient is 0.
  virtual void cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                      const Tensor& logits, const Tensor& targets,
                                      const CrossEntropyOptions& options) = 0;

  // ---- the transformer's fused ops ----
  // Layer normalisation of each row of in [rows, cols] (contiguous): out = (in - mean) *
  // rstd * weight + bias, with rstd = 1 / sqrt(var + eps) (the biased variance), and the
  // row statistics saved for backward in mean and rstd ([rows], compute_dtype(in): float32
  // for a 16-bit in). weight and bias are [cols], contiguous, or undefined (no affine part).
  virtual void layer_norm(const Tensor& out, const Tensor& mean, const Tensor& rstd,
                          const Tensor& in, const Tensor& weight, const Tensor& bias, double eps);
  // The gradients of layer_norm given grad_out [rows, cols] (contiguous): grad_in always;
  // grad_weight and grad_bias ([cols]) when defined (their sums over the rows).
  virtual void layer_norm_backward(const Tensor& grad_in, const Tensor& grad_weight,
                                   const Tensor& grad_bias, const Tensor& grad_out,
                                   const Tensor& in, const Tensor& mean, const Tensor& rstd,
                                   const Tensor& weight);
  // RMS normalisation over the rows of in [rows, cols] (contiguous, as layer_norm's):
  // out = in * rstd * weight, rstd = 1/sqrt(mean(in^2) + eps) saved for backward ([rows],
  // compute_dtype(in)). weight [cols], contiguous, or undefined.
  virtual void rms_norm(const Tensor& out, const Tensor& rstd, const Tensor& in,
                        const Tensor& weight, double eps);
  // The gradients of rms_norm given grad_out [rows, cols] (contiguous): grad_in always;
  // grad_weight ([cols], the sum over the rows) when defined.
  virtual void rms_norm_backward(const Tensor& grad_in, const Tensor& grad_weight,
                                 const Tensor& grad_out, const Tensor& in, const Tensor& rstd,
                                 const Tensor& weight);
  // Rotary position embedding, the rotate_half convention (HF's Llama): in and out
  // [B, T, H, D] contiguous, D even, cos and sin [T, D/2] contiguous, h = D/2; at position t
  //   out[.., t, .., i]     = in[i] cos[t, i] - in[i + h] sin[t, i]
  //   out[.., t, .., i + h] = in[i + h] cos[t, i] + in[i] sin[t, i]
  // inverse: the rotation by the opposite angles (sin negated), which is its backward.
  virtual void rotary_embedding(const Tensor& out, const Tensor& in, const Tensor& cos,
                                const Tensor& sin, bool inverse);
  // out[i, :] = weight[indices[i], :]: weight [vocab, dim] strided, indices int64 [n]
  // (contiguous), out [n, dim] contiguous. An index outside [0, vocab) is an mg::Error
  // naming it (the CPU checks before reading; CUDA through its device-side check).
  virtual void embedding(const Tensor& out, const Tensor& weight, const Tensor& indices);
  // grad_weight (zeroed by the caller, [vocab, dim] contiguous) += the rows of grad_out
  // [n, dim] at their indices, in index order for each row of grad_weight, so repeated
  // indices sum the same way on every run (no atomics).
  virtual void embedding_backward(const Tensor& grad_weight, const Tensor& grad_out,
                                  const Tensor& indices);
  // Attention over [batch, tq, d] queries and [batch, tk, d] keys and [batch, tk, dv] values
  // (contiguous): out = dropout(softmax(q k^T * scale [+ causal mask])) v in one pass over
  // key blocks with an online softmax, never forming the [tq, tk] matrix; lse [batch, tq]
  // (compute_dtype(q)) keeps each row's log-sum-exp (of the scaled, masked scores) for
  // backward. causal masks
  // key j > query i (torch's is_causal: tril(ones(tq, tk)), aligned to the top left).
  // Dropout draws philox::uniform(seed, offset, (b * tq + i) * tk + j) for score (i, j):
  // the element index of the [batch, tq, tk] probability tensor, as dropout() would.
  virtual void attention(const Tensor& out, const Tensor& lse, const Tensor& q, const Tensor& k,
                         const Tensor& v, double scale, bool causal, double dropout_p,
                         uint64_t seed, uint64_t offset);
  // The gradients of attention given grad_out and the saved out and lse; the
  // probabilities are recomputed block by block (FlashAttention's backward).
  virtual void attention_backward(const Tensor& grad_q, const Tensor& grad_k,
                                  const Tensor& grad_v, const Tensor& grad_out, const Tensor& q,
                                  const Tensor& k, const Tensor& v, const Tensor& out,
                                  const Tensor& lse, double scale, bool causal, double dropout_p,
                                  uint64_t seed, uint64_t offset);

  // ---- optimizers ----
  // Updates params (and momentum buffers) in place, as check_sgd_step() describes
  // them: all on one device of this backend. The default is the composition of
  // elementwise ops (several per tensor); a backend fuses it into one pass per tensor
  // (CPU) or one launch per group of tensors (CUDA), with the same bits.
  virtual void sgd_step(const SgdStep& step);
  // Updates params and their Adam state in place, as AdamStep describes. The default is
  // the composition of elementwise ops (a dozen per tensor); the CPU fuses it into one
  // pass per tensor, CUDA into one launch per group of tensors, with the same bits. The
  // fused kernels are float32's: a float64 step (gradient checks, tight parity tests)
  // takes this composition on either backend, whose ops all have float64 kernels.
  virtual void adam_step(const AdamStep& step);
};

// The backend table, by DeviceType. The CPU backend is always there; the CUDA entry is
// the real backend when minigrad was built with CUDA, else one that explains it was not.
Backend& backend(DeviceType type);
inline Backend& backend(Device device) { return backend(device.type()); }
void register_backend(DeviceType type, Backend* backend);

}  // namespace mg
