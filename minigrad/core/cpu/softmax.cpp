// log_softmax and fused cross-entropy over the last dimension of [rows, classes].
// Both subtract the row maximum before exponentiating, so logits of 1000 stay finite.
// Each row is worked on as a contiguous array (a strided row is copied first), with
// cpu/vector_exp.h's exp, so that the per-element loops vectorise: this file is built
// with -fno-trapping-math (CMakeLists.txt), without which GCC keeps that exp's clamp as
// a branch and no loop here vectorises.
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/vector_exp.h>

namespace mg {
namespace {

// Row i of a 2-D float tensor as `cols` contiguous floats: the row itself when its
// columns are adjacent, else a copy in `scratch`.
struct Rows {
  const float* data;
  int64_t row_stride, col_stride, cols;
  std::vector<float> scratch;

  explicit Rows(const Tensor& t)
      : data(static_cast<const float*>(t.data_ptr())),
        row_stride(t.stride(0)),
        col_stride(t.stride(1)),
        cols(t.size(1)) {}

  const float* operator[](int64_t i) {
    const float* row = data + i * row_stride;
    if (col_stride == 1 || cols <= 1) return row;
    scratch.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) scratch[static_cast<size_t>(j)] = row[j * col_stride];
    return scratch.data();
  }
};

// The largest of x[0..n), skipping NaN (what follows turns a NaN into a NaN result
// anyway). Four running maxima, so that the loop is not one long dependency chain.
float row_max(const float* x, int64_t n) {
  float m[4];
  std::fill_n(m, 4, -std::numeric_limits<float>::infinity());
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int k = 0; k < 4; ++k) m[k] = std::max(m[k], x[j + k]);
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// The sum of x[0..n) in double, with four running sums for the same reason.
double row_sum(const float* x, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(x[j + k]);
  for (; j < n; ++j) s[0] += static_cast<double>(x[j]);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// exps[j] = exp(x[j] - max) for the row, and the row's max and sum of those exps:
// log(sum_j exp(x[j])) is max + log(sum); softmax[j] is exps[j] / sum.
struct ExpRow {
  float max;
  double sum;
};
ExpRow exp_row_shifted(float* exps, const float* x, int64_t n) {
  const float max = row_max(x, n);
  if (std::isinf(max)) return {max, 0.0};  // all -inf, or an inf logit: no finite shift
  cpu::exp_row(exps, x, max, n);
  return {max, row_sum(exps, n)};
}

double log_sum_exp(const ExpRow& e) {
  if (std::isinf(e.max)) return e.max;
  return static_cast<double>(e.max) + std::log(e.sum);
}

}  // namespace

void CpuBackend::log_softmax(const Tensor& out, const Tensor& in) {
  const int64_t rows = in.size(0), cols = in.size(1);
  Rows x(in);
  auto* o = static_cast<float*>(out.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    const float* row = x[i];
    float* out_row = o + i * cols;
    const double lse = log_sum_exp(exp_row_shifted(out_row, row, cols));  // out_row: scratch
    for (int64_t j = 0; j < cols; ++j)
      out_row[j] = static_cast<float>(static_cast<double>(row[j]) - lse);
  }
}

void CpuBackend::log_softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                                      const Tensor& output) {
  const int64_t rows = output.size(0), cols = output.size(1);
  Rows g(grad_out), y(output);
  auto* gi = static_cast<float*>(grad_in.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    const float* g_row = g[i];
    const float total = static_cast<float>(row_sum(g_row, cols));
    // softmax = exp(log_softmax), written first into grad_in's row: a tensor of its own
    // (ops::log_softmax_backward allocates it), so grad_out's row is still there to read.
    float* out_row = gi + i * cols;
    cpu::exp_row(out_row, y[i], 0.0f, cols);
    for (int64_t j = 0; j < cols; ++j) out_row[j] = g_row[j] - out_row[j] * total;
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
  Rows x(logits);
  const auto* t = static_cast<const int64_t*>(targets.data_ptr());
  const int64_t ts = targets.stride(0);
  const double eps = options.label_smoothing();
  auto* out = static_cast<float*>(loss.data_ptr());
  std::vector<float> exps(static_cast<size_t>(cols));
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t target = row_target(t, ts, i, cols, options.ignore_index());
    double row_loss = 0.0;
    if (target >= 0) {
      const float* row = x[i];
      const double lse = log_sum_exp(exp_row_shifted(exps.data(), row, cols));
      // (1 - eps) * (lse - x[t]) + eps * (lse - mean_j x[j])
      row_loss = lse - static_cast<double>(row[target]);
      if (eps != 0.0)
        row_loss = (1.0 - eps) * row_loss +
                   eps * (lse - row_sum(row, cols) / static_cast<double>(cols));
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
  Rows x(logits);
  const auto* t = static_cast<const int64_t*>(targets.data_ptr());
  const int64_t ts = targets.stride(0);
  const auto* gl = static_cast<const float*>(grad_loss.data_ptr());
  const double eps = options.label_smoothing();
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
    // d loss_i / d x[i, j] = (softmax[j] - q[j]) * s_i, with q = (1 - eps) onehot(t) +
    // eps / C: the exps go into the gradient row, then each becomes its gradient.
    const ExpRow e = exp_row_shifted(row, x[i], cols);
    if (std::isinf(e.max)) {  // no finite shift: as the unshifted softmax, a NaN row
      std::fill_n(row, cols, std::numeric_limits<float>::quiet_NaN());
      continue;
    }
    const auto s = static_cast<float>(row_scale);
    const auto softmax_scale = static_cast<float>(row_scale / e.sum);
    const auto spread = static_cast<float>(eps / static_cast<double>(cols) * row_scale);
    for (int64_t j = 0; j < cols; ++j) row[j] = row[j] * softmax_scale - spread;
    row[target] -= static_cast<float>(1.0 - eps) * s;
  }
}

}  // namespace mg
