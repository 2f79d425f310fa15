// Host-side entry points of the CUDA kernels (cuda/kernels/*.cu). They take raw device
// pointers and plain layouts, not Tensors, so the .cu files stay free of minigrad's
// tensor headers; cuda/backend_*.cpp translate Tensors into these calls. Every launch
// is asynchronous on `stream` and checked with MG_CUDA_CHECK_LAUNCH.
//
// Each kernel's reference is the CPU backend (core/cpu/), and tests/cuda compares the
// two on random inputs.
#pragma once

#include <cstddef>
#include <cstdint>

#include <cuda_runtime_api.h>

#include <minigrad/cuda/kernels/indexing.h>

namespace mg::cuda::kernels {

// Float64 reaches the elementwise ops, fill, arange and sum; BFloat16 and Float16 (stored
// as __nv_bfloat16 and __half, computed in float: kernels/reduced_float.cuh) the
// elementwise ops, fill, arange and copies; the other kernels here are float32 (and
// int64) only, which the backend checks before it calls them (it widens 16-bit tensors
// to float32 for them: cuda/widen.h).
enum class ElementType { Float32, Int64, Float64, BFloat16, Float16 };
enum class UnaryKind { Neg, Exp, Log, Relu, Sqrt, Abs, Tanh };
enum class BinaryKind { Add, Sub, Mul, Div, Maximum };

// ---- elementwise.cu ----
// out = f(in); float32, and int64 for Neg.
void unary(UnaryKind kind, ElementType type, void* out, const void* in,
           const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream);
// out = a op (alpha * b) for Add/Sub, a op b for Mul/Div/Maximum. `out` may alias `a`.
void binary(BinaryKind kind, ElementType type, void* out, const void* a, const void* b,
            double alpha, const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream);
// out = in op scalar. `out` may alias `in`.
void binary_scalar(BinaryKind kind, ElementType type, void* out, const void* in, double scalar,
                   const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream);
// grad_in = input > 0 ? grad_out : 0 (float32 or float64)
void relu_backward(ElementType type, void* grad_in, const void* grad_out, const void* input,
                   const StridedIndexer<3>& layout, int64_t numel, cudaStream_t stream);

// ---- data.cu ----
// dst = src element for element, any strides (layout operand 0 is dst, 1 is src).
void strided_copy(std::size_t element_size, void* dst, const void* src,
                  const StridedIndexer<2>& layout, int64_t numel, cudaStream_t stream);
void fill(ElementType type, void* dst, double value, int64_t numel, cudaStream_t stream);
// dst[i] = start + step * i, computed in double and then converted (as on the CPU).
void arange(ElementType type, void* dst, double start, double step, int64_t numel,
            cudaStream_t stream);
// dst[i] = low + span * philox::uniform(seed, offset, i), float arithmetic as on the CPU.
void random_uniform(float* dst, int64_t numel, float low, float span, uint64_t seed,
                    uint64_t offset, cudaStream_t stream);
// dst[i] = mean + stddev * philox::normal(seed, offset, i).
void random_normal(float* dst, int64_t numel, float mean, float stddev, uint64_t seed,
                   uint64_t offset, cudaStream_t stream);
// dst (bfloat16 or float16, contiguous) = src (float32, contiguous) rounded stochastically
// with philox::uniform(seed, offset, i) for element i (core/backend.h: round_stochastic).
void round_stochastic(ElementType type, void* dst, const float* src, int64_t numel, uint64_t seed,
                      uint64_t offset, cudaStream_t stream);

// ---- reduce.cu ----
// A sum seen as out[k] = sum_r in[kept(k) + reduced(r)]: `kept` walks the output
// elements (in output order), `reduced` the elements summed into each.
struct SumPlan {
  StridedIndexer<1> kept;
  StridedIndexer<1> reduced;
  int64_t kept_count = 1;
  int64_t reduced_count = 1;
};
// Bytes of temporary device memory sum() needs for this plan (0 for most plans).
std::size_t sum_scratch_bytes(ElementType type, const SumPlan& plan);
// out (contiguous, kept_count elements) = the sums. Deterministic: the same inputs
// give the same bits on every run.
void sum(ElementType type, void* out, const void* in, const SumPlan& plan, void* scratch,
         cudaStream_t stream);
// *out = max |in[i]| over n > 0 contiguous floats, NaN if any is NaN. Deterministic (a
// maximum does not depend on the order it is taken in).
void abs_max(float* out, const float* in, int64_t n, cudaStream_t stream);
// out[i] = the first j with the largest in[i, j] (NaN the largest), for `type` elements.
void argmax_rows(ElementType type, int64_t* out, const void* in, int64_t rows, int64_t cols,
                 int64_t row_stride, int64_t col_stride, cudaStream_t stream);

// ---- softmax.cu ----
struct MatrixView {
  const float* data;
  int64_t row_stride;
  int64_t col_stride;
};
// Where a kernel reports a class index outside [0, classes): the first offending row,
// its value and the number of classes, in host-mapped memory that the host reads after
// a synchronisation (see cuda/target_check.h).
struct TargetError {
  int32_t raised;
  int32_t unused;
  int64_t row;
  int64_t value;
  int64_t classes;
};
// Which thread writes the report is settled with an atomic on device memory (`claim`),
// not on the mapped host memory, where atomics need PCIe atomic support: the first
// thread to raise `claim` to `generation` writes. The host moves to a new generation
// each time it has read a report, so later errors are reported again.
struct TargetErrorSink {
  TargetError* report;
  unsigned long long* claim;
  unsigned long long generation;
};
// out (contiguous [rows, cols]) = in - logsumexp(in, row).
void log_softmax(float* out, MatrixView in, int64_t rows, int64_t cols, cudaStream_t stream);
// grad_in (contiguous) = grad_out - exp(output) * rowsum(grad_out).
void log_softmax_backward(float* grad_in, MatrixView grad_out, MatrixView output, int64_t rows,
                          int64_t cols, cudaStream_t stream);
// The options of core/cross_entropy_options.h, as the kernels take them.
enum class LossReduction { None, Mean, Sum };
struct CrossEntropyParams {
  int64_t ignore_index;
  float label_smoothing;  // eps
  LossReduction reduction;
};
// row_losses[i] (a device buffer of `rows` floats) = (1 - eps) * (logsumexp(logits[i]) -
// logits[i, t_i]) + eps * (logsumexp(logits[i]) - mean_j logits[i, j]), 0 for a row whose
// target is ignore_index; then, for Mean and Sum, loss (one float) = their sum, divided
// for Mean by the number of rows not ignored (NaN when there are none). `loss` is unused
// for None. A row with an invalid target contributes NaN and is reported through `error`.
void cross_entropy(float* loss, MatrixView logits, const int64_t* targets,
                   int64_t target_stride, int64_t rows, int64_t cols, CrossEntropyParams params,
                   float* row_losses, TargetErrorSink error, cudaStream_t stream);
// grad (contiguous) = (softmax(logits) - q) * s_i with q = (1 - eps) onehot(t_i) + eps / cols
// and s_i = grad_loss[0] (Sum), grad_loss[0] / rows not ignored (Mean, computed into the
// one float of `scale_scratch`) or grad_loss[i * grad_loss_stride] (None); 0 for an
// ignored row. A row with an invalid target gets NaN and is reported through `error`.
void cross_entropy_backward(float* grad, const float* grad_loss, int64_t grad_loss_stride,
                            MatrixView logits, const int64_t* targets, int64_t target_stride,
                            int64_t rows, int64_t cols, CrossEntropyParams params,
                            float* scale_scratch, TargetErrorSink error, cudaStream_t stream);

// ---- optim.cu ----
// One tensor of an SGD step (core/backend.h's SgdTensor as device pointers).
// momentum_buffer is null without momentum; a new buffer is written, never read.
struct SgdTensorPointers {
  float* param;
  const float* grad;
  float* momentum_buffer;
  int64_t numel;
  bool new_buffer;
};
// The step's options, already rounded to float as add_ and mul_ round their scalars.
struct SgdScalars {
  float weight_decay;
  float momentum;
  float keep;    // 1 - dampening
  float neg_lr;  // -lr
  bool use_weight_decay;
  bool use_momentum;
  bool nesterov;
};
// SGD's update of every tensor (rounded as core/backend.h's SgdStep says), in one
// launch per group of up to kSgdTensorsPerLaunch tensors. The tensors' pointers travel
// by value in the kernel's parameters: nothing is allocated or copied to the device,
// so the step can be captured in a CUDA graph.
constexpr int kSgdTensorsPerLaunch = 96;
void sgd_step(const SgdTensorPointers* tensors, std::size_t count, const SgdScalars& scalars,
              cudaStream_t stream);

// One tensor of an Adam step (core/backend.h's AdamTensor as device pointers), with its
// own bias corrections rounded to float. max_exp_avg_sq is null without amsgrad.
struct AdamTensorPointers {
  float* param;
  const float* grad;
  float* exp_avg;
  float* exp_avg_sq;
  float* max_exp_avg_sq;
  int64_t numel;
  float neg_step_size;          // -lr / (1 - beta1^step)
  float bias_correction2_sqrt;  // sqrt(1 - beta2^step)
};
enum class AdamWeightDecay : int32_t { None, L2, Decoupled };  // none, Adam's, AdamW's
// The step's options, rounded to float as PyTorch's in-place ops round their scalars.
struct AdamScalars {
  float beta1, keep1;  // keep1 = 1 - beta1
  float beta2, keep2;  // keep2 = 1 - beta2
  float eps;
  float weight_decay;  // Adam: g + weight_decay * p
  float decay;         // AdamW: p * (1 - lr * weight_decay)
  AdamWeightDecay weight_decay_mode;
  bool amsgrad;
  bool maximize;
};
// Adam's update of every tensor (rounded as core/backend.h's AdamStep says), in one
// launch per group of up to kAdamTensorsPerLaunch tensors, their pointers by value in
// the kernel's parameters as SGD's.
constexpr int kAdamTensorsPerLaunch = 56;
void adam_step(const AdamTensorPointers* tensors, std::size_t count, const AdamScalars& scalars,
               cudaStream_t stream);

}  // namespace mg::cuda::kernels
