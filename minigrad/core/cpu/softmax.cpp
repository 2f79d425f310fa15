// log_softmax and fused cross-entropy over the last dimension of [rows, classes].
// Both subtract the row maximum before exponentiating, so logits of 1000 stay finite.
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

void CpuBackend::cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const Rows x = rows_of(logits);
  const auto* t = static_cast<const int64_t*>(targets.data_ptr());
  const int64_t ts = targets.stride(0);
  double total = 0.0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t target = t[i * ts];
    MG_CHECK(target >= 0 && target < cols,
             "cross_entropy: target {} at row {} is out of range for {} classes (expected [0, {}))",
             target, i, cols, cols);
    total += log_sum_exp(x, i, cols) - static_cast<double>(x.at(i, target));
  }
  *static_cast<float*>(loss.data_ptr()) = static_cast<float>(total / static_cast<double>(rows));
}

void CpuBackend::cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                        const Tensor& logits, const Tensor& targets) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  const Rows x = rows_of(logits);
  const auto* t = static_cast<const int64_t*>(targets.data_ptr());
  const int64_t ts = targets.stride(0);
  const double scale = static_cast<double>(*static_cast<const float*>(grad_loss.data_ptr())) /
                       static_cast<double>(rows);
  auto* g = static_cast<float*>(grad_logits.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    // softmax = exp(x - max) / sum: one exp per element (exp dominates this op on small
    // batches), each kept in the output row until the sum is known.
    float* row = g + i * cols;
    float max = -std::numeric_limits<float>::infinity();
    for (int64_t j = 0; j < cols; ++j) max = std::max(max, x.at(i, j));
    double total = 0.0;
    for (int64_t j = 0; j < cols; ++j) {
      const double e = std::exp(static_cast<double>(x.at(i, j) - max));
      row[j] = static_cast<float>(e);
      total += e;
    }
    const int64_t target = t[i * ts];
    for (int64_t j = 0; j < cols; ++j)
      row[j] = static_cast<float>((row[j] / total - (j == target ? 1.0 : 0.0)) * scale);
  }
}

}  // namespace mg
