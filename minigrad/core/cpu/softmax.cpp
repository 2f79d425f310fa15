// log_softmax and fused cross-entropy over the last dimension of [rows, classes].
// Both subtract the row maximum before exponentiating, so logits of 1000 stay finite.
#include <algorithm>
#include <cmath>
#include <limits>

#include <minigrad/core/cpu/cpu_backend.h>

namespace mg {
namespace {

// Reads row i of a possibly strided 2-D float tensor.
struct Rows {
  const float* data;
  int64_t row_stride, col_stride;
  float at(int64_t i, int64_t j) const { return data[i * row_stride + j * col_stride]; }
};
Rows rows_of(const Tensor& t) {
  return Rows{static_cast<const float*>(t.data_ptr()), t.stride(0), t.stride(1)};
}

// log(sum_j exp(x[i, j])), computed stably.
double log_sum_exp(const Rows& x, int64_t i, int64_t cols) {
  float max = -std::numeric_limits<float>::infinity();
  for (int64_t j = 0; j < cols; ++j) max = std::max(max, x.at(i, j));
  if (std::isinf(max)) return max;
  double total = 0.0;
  for (int64_t j = 0; j < cols; ++j) total += std::exp(static_cast<double>(x.at(i, j) - max));
  return static_cast<double>(max) + std::log(total);
}

}  // namespace

void CpuBackend::log_softmax(const Tensor& out, const Tensor& in) {
  const int64_t rows = in.size(0), cols = in.size(1);
  const Rows x = rows_of(in);
  auto* o = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    const double lse = log_sum_exp(x, i, cols);
    for (int64_t j = 0; j < cols; ++j)
      o[i * cols + j] = static_cast<float>(static_cast<double>(x.at(i, j)) - lse);
  }
}

void CpuBackend::log_softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                                      const Tensor& output) {
  const int64_t rows = output.size(0), cols = output.size(1);
  const Rows g = rows_of(grad_out), y = rows_of(output);
  auto* gi = static_cast<float*>(grad_in.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    double total = 0.0;
    for (int64_t j = 0; j < cols; ++j) total += g.at(i, j);
    for (int64_t j = 0; j < cols; ++j)
      gi[i * cols + j] = static_cast<float>(g.at(i, j) - std::exp(y.at(i, j)) * total);
  }
}

namespace {

// The class index of row i, or -1 for a row to ignore; an mg::Error for any other value
// outside [0, cols).
int64_t row_target(const int64_t* t, int64_t ts, int64_t i, int64_t cols, int64_t ignore_index) {
  const int64_t target = t[i * ts];
  if (target == ignore_index) return -1;
  MG_CHECK(target >= 0 && target < cols,
           "cross_entropy: target {} at row {} is out of range for {} classes (expected [0, {}) "
           "or ignore_index {})",
           target, i, cols, cols, ignore_index);
  return target;
}

}  // namespace

void CpuBackend::cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets,
                               const CrossEntropyOptions& options) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const Rows x = rows_of(logits);
  const auto* t = static_cast<const int64_t*>(targets.data_ptr());
  const int64_t ts = targets.stride(0);
  const double eps = options.label_smoothing();
  auto* out = static_cast<float*>(loss.data_ptr());
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t target = row_target(t, ts, i, cols, options.ignore_index());
    double row_loss = 0.0;
    if (target >= 0) {
      const double lse = log_sum_exp(x, i, cols);
      // (1 - eps) * (lse - x[t]) + eps * (lse - mean_j x[j])
      row_loss = lse - static_cast<double>(x.at(i, target));
      if (eps != 0.0) {
        double sum = 0.0;
        for (int64_t j = 0; j < cols; ++j) sum += static_cast<double>(x.at(i, j));
        row_loss = (1.0 - eps) * row_loss + eps * (lse - sum / static_cast<double>(cols));
      }
      ++counted;
    }
    if (options.reduction() == Reduction::None) out[i] = static_cast<float>(row_loss);
    total += row_loss;
  }
  if (options.reduction() == Reduction::Sum) *out = static_cast<float>(total);
  // Every row ignored: 0 / 0, a NaN, as PyTorch's mean.
  if (options.reduction() == Reduction::Mean)
    *out = static_cast<float>(total / static_cast<double>(counted));
}

void CpuBackend::cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                        const Tensor& logits, const Tensor& targets,
                                        const CrossEntropyOptions& options) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const Rows x = rows_of(logits);
  const auto* t = static_cast<const int64_t*>(targets.data_ptr());
  const int64_t ts = targets.stride(0);
  const auto* gl = static_cast<const float*>(grad_loss.data_ptr());
  const double eps = options.label_smoothing();
  const double spread = eps / static_cast<double>(cols);
  double scale = static_cast<double>(gl[0]);  // Sum
  if (options.reduction() == Reduction::Mean) {
    int64_t counted = 0;
    for (int64_t i = 0; i < rows; ++i)
      if (row_target(t, ts, i, cols, options.ignore_index()) >= 0) ++counted;
    scale /= static_cast<double>(counted);
  }
  const int64_t grad_stride = options.reduction() == Reduction::None ? grad_loss.stride(0) : 0;
  auto* g = static_cast<float*>(grad_logits.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    float* row = g + i * cols;
    const int64_t target = row_target(t, ts, i, cols, options.ignore_index());
    if (target < 0) {  // an ignored row has no gradient
      std::fill_n(row, cols, 0.0f);
      continue;
    }
    const double row_scale =
        options.reduction() == Reduction::None ? static_cast<double>(gl[i * grad_stride]) : scale;
    // softmax = exp(x - max) / sum: one exp per element (exp dominates this op on small
    // batches), each kept in the output row until the sum is known.
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < cols; ++j) max = std::max(max, x.at(i, j));
    double total = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double e = std::exp(static_cast<double>(x.at(i, j) - max));
      row[j] = static_cast<float>(e);
      total += e;
    }
    // d loss_i / d x[i, j] = softmax[j] - q[j], with q = (1 - eps) onehot(t) + eps / C.
    for (int64_t j = 0; j < cols; ++j) {
      const double q = (j == target ? 1.0 - eps : 0.0) + spread;
      row[j] = static_cast<float>((row[j] / total - q) * row_scale);
    }
  }
}

}  // namespace mg
