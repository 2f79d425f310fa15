// log_softmax and the fused softmax-cross-entropy over the last dim of [rows, classes].
//
// A row is handled by a warp when it has up to 1024 classes (8 rows per block), else
// by a whole block. Every row subtracts its maximum before exponentiating, so logits
// of 1000 stay finite, and log-probabilities are formed as (x - max) - log(sum), which
// keeps the precision that x - logsumexp would lose for large logits.
#include <cmath>

#include <minigrad/cuda/check.h>
#include <minigrad/cuda/kernels/launch.h>

namespace mg::cuda::kernels {
namespace {

constexpr int kThreads = 256;
constexpr int kWarpRowLimit = 1024;  // rows up to this many classes go to one warp each

struct MaxOp {
  __device__ float operator()(float a, float b) const { return fmaxf(a, b); }
};
struct SumOp {
  __device__ float operator()(float a, float b) const { return a + b; }
};

// Reduces `value` over the ThreadsPerRow threads of a row; every one of them gets the
// result. With a whole block per row, every thread of the block must call this.
template <int ThreadsPerRow, typename Op>
__device__ __forceinline__ float row_reduce(float value, Op op) {
  for (int delta = 16; delta > 0; delta >>= 1)
    value = op(value, __shfl_xor_sync(0xffffffffu, value, delta));
  if constexpr (ThreadsPerRow == 32) {
    return value;
  } else {
    __shared__ float warp_values[kThreads / 32];
    __syncthreads();  // the previous reduction's readers are done with warp_values
    if (threadIdx.x % 32 == 0) warp_values[threadIdx.x / 32] = value;
    __syncthreads();
    float result = warp_values[0];
    for (int w = 1; w < kThreads / 32; ++w) result = op(result, warp_values[w]);
    return result;
  }
}

// Which row this thread works on, and its position within the row's threads.
template <int ThreadsPerRow>
struct RowSlot {
  int64_t row;
  int lane;
  __device__ RowSlot()
      : row(static_cast<int64_t>(blockIdx.x) * (kThreads / ThreadsPerRow) +
            threadIdx.x / ThreadsPerRow),
        lane(static_cast<int>(threadIdx.x % ThreadsPerRow)) {}
};

// The row's maximum and sum_j exp(x_j - max). A row whose maximum is infinite gets
// sum 1 so that (x - max) - log(sum) reduces to x - max, as on the CPU.
template <int ThreadsPerRow>
__device__ __forceinline__ void row_max_and_sum(const float* x, int64_t col_stride, int64_t cols,
                                                bool active, int lane, float& max, float& sum) {
  float m = -INFINITY;
  if (active)
    for (int64_t j = lane; j < cols; j += ThreadsPerRow) m = fmaxf(m, x[j * col_stride]);
  m = row_reduce<ThreadsPerRow>(m, MaxOp{});
  float s = 0.0f;
  if (active && !isinf(m))
    for (int64_t j = lane; j < cols; j += ThreadsPerRow) s += expf(x[j * col_stride] - m);
  s = row_reduce<ThreadsPerRow>(s, SumOp{});
  max = m;
  sum = isinf(m) ? 1.0f : s;
}

template <int ThreadsPerRow>
__global__ void __launch_bounds__(kThreads)
    log_softmax_kernel(float* out, MatrixView in, int64_t rows, int64_t cols) {
  const RowSlot<ThreadsPerRow> slot;
  const bool active = slot.row < rows;
  const float* x = in.data + (active ? slot.row * in.row_stride : 0);
  float max, sum;
  row_max_and_sum<ThreadsPerRow>(x, in.col_stride, cols, active, slot.lane, max, sum);
  if (!active) return;
  const float log_sum = logf(sum);
  float* y = out + slot.row * cols;
  for (int64_t j = slot.lane; j < cols; j += ThreadsPerRow)
    y[j] = (x[j * in.col_stride] - max) - log_sum;
}

template <int ThreadsPerRow>
__global__ void __launch_bounds__(kThreads)
    log_softmax_backward_kernel(float* grad_in, MatrixView grad_out, MatrixView output,
                                int64_t rows, int64_t cols) {
  const RowSlot<ThreadsPerRow> slot;
  const bool active = slot.row < rows;
  const float* g = grad_out.data + (active ? slot.row * grad_out.row_stride : 0);
  const float* y = output.data + (active ? slot.row * output.row_stride : 0);
  float total = 0.0f;
  if (active)
    for (int64_t j = slot.lane; j < cols; j += ThreadsPerRow) total += g[j * grad_out.col_stride];
  total = row_reduce<ThreadsPerRow>(total, SumOp{});
  if (!active) return;
  float* gi = grad_in + slot.row * cols;
  for (int64_t j = slot.lane; j < cols; j += ThreadsPerRow)
    gi[j] = g[j * grad_out.col_stride] - expf(y[j * output.col_stride]) * total;
}

// Records the first invalid target seen in this generation (see TargetErrorSink).
__device__ void report_invalid_target(const TargetErrorSink& sink, int64_t row, int64_t value,
                                      int64_t classes) {
  if (sink.report == nullptr) return;
  if (atomicMax(sink.claim, sink.generation) < sink.generation) {
    sink.report->row = row;
    sink.report->value = value;
    sink.report->classes = classes;
    __threadfence_system();  // the details are visible before the flag that announces them
    *static_cast<volatile int32_t*>(&sink.report->raised) = 1;
    __threadfence_system();
  }
}

// The sum of row i's logits, when label smoothing needs it (every thread of the row's
// warp or block calls this, as row_reduce requires; `needed` is the same for all).
template <int ThreadsPerRow>
__device__ __forceinline__ float row_logit_sum(const float* x, int64_t col_stride, int64_t cols,
                                               bool active, int lane, bool needed) {
  if (!needed) return 0.0f;
  float s = 0.0f;
  if (active)
    for (int64_t j = lane; j < cols; j += ThreadsPerRow) s += x[j * col_stride];
  return row_reduce<ThreadsPerRow>(s, SumOp{});
}

template <int ThreadsPerRow>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_rows_kernel(float* row_losses, MatrixView logits, const int64_t* targets,
                              int64_t target_stride, int64_t rows, int64_t cols,
                              CrossEntropyParams params, TargetErrorSink error) {
  const RowSlot<ThreadsPerRow> slot;
  const bool active = slot.row < rows;
  const float* x = logits.data + (active ? slot.row * logits.row_stride : 0);
  float max, sum;
  row_max_and_sum<ThreadsPerRow>(x, logits.col_stride, cols, active, slot.lane, max, sum);
  const float eps = params.label_smoothing;
  const float logit_sum =
      row_logit_sum<ThreadsPerRow>(x, logits.col_stride, cols, active, slot.lane, eps != 0.0f);
  if (!active || slot.lane != 0) return;
  const int64_t target = targets[slot.row * target_stride];
  if (target == params.ignore_index) {
    row_losses[slot.row] = 0.0f;
    return;
  }
  if (target < 0 || target >= cols) {
    report_invalid_target(error, slot.row, target, cols);
    row_losses[slot.row] = NAN;
    return;
  }
  // logsumexp - x[t] = (max - x[t]) + log(sum)
  const float log_sum = logf(sum);
  float loss = (max - x[target * logits.col_stride]) + log_sum;
  if (eps != 0.0f) {
    const float smooth = (max - logit_sum / static_cast<float>(cols)) + log_sum;
    loss = __fadd_rn(__fmul_rn(1.0f - eps, loss), __fmul_rn(eps, smooth));
  }
  row_losses[slot.row] = loss;
}

// Sums a double and a count over the block (thread 0 gets the totals).
__device__ __forceinline__ void block_sum(double& total, long long& count) {
  for (int delta = 16; delta > 0; delta >>= 1) {
    total += __shfl_down_sync(0xffffffffu, total, delta);
    count += __shfl_down_sync(0xffffffffu, count, delta);
  }
  __shared__ double warp_totals[kThreads / 32];
  __shared__ long long warp_counts[kThreads / 32];
  if (threadIdx.x % 32 == 0) {
    warp_totals[threadIdx.x / 32] = total;
    warp_counts[threadIdx.x / 32] = count;
  }
  __syncthreads();
  if (threadIdx.x == 0) {
    total = 0.0;
    count = 0;
    for (int w = 0; w < kThreads / 32; ++w) {
      total += warp_totals[w];
      count += warp_counts[w];
    }
  }
}

// loss = the sum of the row losses (Sum), or that sum over the number of rows not
// ignored (Mean), added in a fixed order (one block, double accumulator).
__global__ void __launch_bounds__(kThreads)
    reduce_losses_kernel(float* loss, const float* row_losses, const int64_t* targets,
                         int64_t target_stride, int64_t rows, int64_t ignore_index, bool mean) {
  double total = 0.0;
  long long counted = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kThreads) {
    total += row_losses[i];
    counted += targets[i * target_stride] != ignore_index ? 1 : 0;
  }
  block_sum(total, counted);
  // Every row ignored: 0 / 0, a NaN, as PyTorch's mean.
  if (threadIdx.x == 0)
    *loss = static_cast<float>(mean ? total / static_cast<double>(counted) : total);
}

// scale = grad_loss / (rows not ignored): the factor of every row of a Mean's gradient.
__global__ void __launch_bounds__(kThreads)
    mean_scale_kernel(float* scale, const float* grad_loss, const int64_t* targets,
                      int64_t target_stride, int64_t rows, int64_t ignore_index) {
  double unused = 0.0;
  long long counted = 0;
  for (int64_t i = threadIdx.x; i < rows; i += kThreads)
    counted += targets[i * target_stride] != ignore_index ? 1 : 0;
  block_sum(unused, counted);
  if (threadIdx.x == 0) *scale = *grad_loss / static_cast<float>(counted);
}

template <int ThreadsPerRow>
__global__ void __launch_bounds__(kThreads)
    cross_entropy_backward_kernel(float* grad, const float* scales, int64_t scale_stride,
                                  MatrixView logits, const int64_t* targets,
                                  int64_t target_stride, int64_t rows, int64_t cols,
                                  CrossEntropyParams params, TargetErrorSink error) {
  const RowSlot<ThreadsPerRow> slot;
  const bool active = slot.row < rows;
  const float* x = logits.data + (active ? slot.row * logits.row_stride : 0);
  float max, sum;
  row_max_and_sum<ThreadsPerRow>(x, logits.col_stride, cols, active, slot.lane, max, sum);
  if (!active) return;
  const int64_t target = targets[slot.row * target_stride];
  float* g = grad + slot.row * cols;
  if (target == params.ignore_index) {  // an ignored row has no gradient
    for (int64_t j = slot.lane; j < cols; j += ThreadsPerRow) g[j] = 0.0f;
    return;
  }
  if (target < 0 || target >= cols) {
    if (slot.lane == 0) report_invalid_target(error, slot.row, target, cols);
    for (int64_t j = slot.lane; j < cols; j += ThreadsPerRow) g[j] = NAN;
    return;
  }
  const float scale = scales[slot.row * scale_stride];
  const float eps = params.label_smoothing;
  const float spread = eps / static_cast<float>(cols);
  const float inverse_sum = 1.0f / sum;
  for (int64_t j = slot.lane; j < cols; j += ThreadsPerRow) {
    const float p = expf(x[j * logits.col_stride] - max) * inverse_sum;
    const float q = (j == target ? 1.0f - eps : 0.0f) + spread;
    g[j] = (p - q) * scale;
  }
}

unsigned row_blocks(int64_t rows, int threads_per_row) {
  const int64_t rows_per_block = kThreads / threads_per_row;
  return static_cast<unsigned>((rows + rows_per_block - 1) / rows_per_block);
}

bool warp_per_row(int64_t cols) { return cols <= kWarpRowLimit; }

}  // namespace

void log_softmax(float* out, MatrixView in, int64_t rows, int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  if (warp_per_row(cols)) {
    log_softmax_kernel<32><<<row_blocks(rows, 32), kThreads, 0, stream>>>(out, in, rows, cols);
  } else {
    log_softmax_kernel<kThreads><<<row_blocks(rows, kThreads), kThreads, 0, stream>>>(out, in, rows,
                                                                                    cols);
  }
  MG_CUDA_CHECK_LAUNCH();
}

void log_softmax_backward(float* grad_in, MatrixView grad_out, MatrixView output, int64_t rows,
                          int64_t cols, cudaStream_t stream) {
  if (rows == 0) return;
  if (warp_per_row(cols)) {
    log_softmax_backward_kernel<32><<<row_blocks(rows, 32), kThreads, 0, stream>>>(
        grad_in, grad_out, output, rows, cols);
  } else {
    log_softmax_backward_kernel<kThreads><<<row_blocks(rows, kThreads), kThreads, 0, stream>>>(
        grad_in, grad_out, output, rows, cols);
  }
  MG_CUDA_CHECK_LAUNCH();
}

void cross_entropy(float* loss, MatrixView logits, const int64_t* targets,
                   int64_t target_stride, int64_t rows, int64_t cols, CrossEntropyParams params,
                   float* row_losses, TargetErrorSink error, cudaStream_t stream) {
  if (rows == 0) return;
  if (warp_per_row(cols)) {
    cross_entropy_rows_kernel<32><<<row_blocks(rows, 32), kThreads, 0, stream>>>(
        row_losses, logits, targets, target_stride, rows, cols, params, error);
  } else {
    cross_entropy_rows_kernel<kThreads><<<row_blocks(rows, kThreads), kThreads, 0, stream>>>(
        row_losses, logits, targets, target_stride, rows, cols, params, error);
  }
  MG_CUDA_CHECK_LAUNCH();
  if (params.reduction == LossReduction::None) return;
  reduce_losses_kernel<<<1, kThreads, 0, stream>>>(loss, row_losses, targets, target_stride, rows,
                                                   params.ignore_index,
                                                   params.reduction == LossReduction::Mean);
  MG_CUDA_CHECK_LAUNCH();
}

void cross_entropy_backward(float* grad, const float* grad_loss, int64_t grad_loss_stride,
                            MatrixView logits, const int64_t* targets, int64_t target_stride,
                            int64_t rows, int64_t cols, CrossEntropyParams params,
                            float* scale_scratch, TargetErrorSink error, cudaStream_t stream) {
  if (rows == 0) return;
  const float* scales = grad_loss;
  int64_t scale_stride = params.reduction == LossReduction::None ? grad_loss_stride : 0;
  if (params.reduction == LossReduction::Mean) {
    mean_scale_kernel<<<1, kThreads, 0, stream>>>(scale_scratch, grad_loss, targets,
                                                  target_stride, rows, params.ignore_index);
    MG_CUDA_CHECK_LAUNCH();
    scales = scale_scratch;
  }
  if (warp_per_row(cols)) {
    cross_entropy_backward_kernel<32><<<row_blocks(rows, 32), kThreads, 0, stream>>>(
        grad, scales, scale_stride, logits, targets, target_stride, rows, cols, params, error);
  } else {
    cross_entropy_backward_kernel<kThreads><<<row_blocks(rows, kThreads), kThreads, 0, stream>>>(
        grad, scales, scale_stride, logits, targets, target_stride, rows, cols, params, error);
  }
  MG_CUDA_CHECK_LAUNCH();
}

}  // namespace mg::cuda::kernels
