// softmax, log_softmax and fused cross-entropy over the last dimension of [rows, classes].
// Both subtract the row maximum before exponentiating, so logits of 1000 stay finite.
// Each row is worked on as a contiguous array (a strided row is copied first), with
// cpu/vector_exp.h's exp, so that the per-element loops vectorise: this file is built
// with -fno-trapping-math (CMakeLists.txt), without which GCC keeps that exp's clamp as
// a branch and no loop here vectorises. bfloat16 and float16 run the float32 kernels on
// widened copies and round each output once (cpu/widen.h).
#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include <minigrad/core/cpu/cpu_backend.h>
#include <minigrad/core/cpu/vector_exp.h>
#include <minigrad/core/cpu/widen.h>
#include <minigrad/core/dispatch.h>

namespace mg {
namespace {

// Row i of a 2-D float tensor as `cols` contiguous values: the row itself when its
// columns are adjacent, else a copy in `scratch`.
template <typename T>
struct Rows {
  const T* data;
  int64_t row_stride, col_stride, cols;
  std::vector<T> scratch;

  explicit Rows(const Tensor& t)
      : data(static_cast<const T*>(t.data_ptr())),
        row_stride(t.stride(0)),
        col_stride(t.stride(1)),
        cols(t.size(1)) {}

  const T* operator[](int64_t i) {
    const T* row = data + i * row_stride;
    if (col_stride == 1 || cols <= 1) return row;
    scratch.resize(static_cast<size_t>(cols));
    for (int64_t j = 0; j < cols; ++j) scratch[static_cast<size_t>(j)] = row[j * col_stride];
    return scratch.data();
  }
};

// The largest of x[0..n), skipping NaN (what follows turns a NaN into a NaN result
// anyway). Four running maxima, so that the loop is not one long dependency chain.
template <typename T>
T row_max(const T* x, int64_t n) {
  T m[4];
  std::fill_n(m, 4, -std::numeric_limits<T>::infinity());
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int k = 0; k < 4; ++k) m[k] = std::max(m[k], x[j + k]);
  for (; j < n; ++j) m[0] = std::max(m[0], x[j]);
  return std::max(std::max(m[0], m[1]), std::max(m[2], m[3]));
}

// The sum of x[0..n) in double, with four running sums for the same reason.
template <typename T>
double row_sum(const T* x, int64_t n) {
  double s[4] = {0.0, 0.0, 0.0, 0.0};
  int64_t j = 0;
  for (; j + 4 <= n; j += 4)
    for (int k = 0; k < 4; ++k) s[k] += static_cast<double>(x[j + k]);
  for (; j < n; ++j) s[0] += static_cast<double>(x[j]);
  return (s[0] + s[1]) + (s[2] + s[3]);
}

// exps[j] = exp(x[j] - max) for the row, and the row's max and sum of those exps:
// log(sum_j exp(x[j])) is max + log(sum); softmax[j] is exps[j] / sum.
// float rows take cpu/vector_exp.h's exp, double rows std::exp.
inline void exp_row(float* out, const float* in, float shift, int64_t n) {
  cpu::exp_row(out, in, shift, n);
}
inline void exp_row(double* out, const double* in, double shift, int64_t n) {
  for (int64_t j = 0; j < n; ++j) out[j] = std::exp(in[j] - shift);
}

template <typename T>
struct ExpRow {
  T max;
  double sum;
};
template <typename T>
ExpRow<T> exp_row_shifted(T* exps, const T* x, int64_t n) {
  const T max = row_max(x, n);
  if (std::isinf(max)) return {max, 0.0};  // all -inf, or an inf logit: no finite shift
  exp_row(exps, x, max, n);
  return {max, row_sum(exps, n)};
}

template <typename T>
double log_sum_exp(const ExpRow<T>& e) {
  if (std::isinf(e.max)) return e.max;
  return static_cast<double>(e.max) + std::log(e.sum);
}

}  // namespace

namespace {
template <typename T>
void log_softmax_typed(const Tensor& out, const Tensor& in) {
  const int64_t rows = in.size(0), cols = in.size(1);
  Rows<T> x(in);
  auto* o = static_cast<T*>(out.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    const T* row = x[i];
    T* out_row = o + i * cols;
    const double lse = log_sum_exp(exp_row_shifted(out_row, row, cols));  // out_row: scratch
    for (int64_t j = 0; j < cols; ++j)
      out_row[j] = static_cast<T>(static_cast<double>(row[j]) - lse);
  }
}

template <typename T>
void log_softmax_backward_typed(const Tensor& grad_in, const Tensor& grad_out,
                                const Tensor& output) {
  const int64_t rows = output.size(0), cols = output.size(1);
  Rows<T> g(grad_out), y(output);
  auto* gi = static_cast<T*>(grad_in.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    const T* g_row = g[i];
    const T total = static_cast<T>(row_sum(g_row, cols));
    // softmax = exp(log_softmax), written first into grad_in's row: a tensor of its own
    // (ops::log_softmax_backward allocates it), so grad_out's row is still there to read.
    T* out_row = gi + i * cols;
    exp_row(out_row, y[i], T(0), cols);
    for (int64_t j = 0; j < cols; ++j) out_row[j] = g_row[j] - out_row[j] * total;
  }
}

// softmax[j] = exp(x[j] - max) / sum: the exps go into the output row, then are scaled.
template <typename T>
void softmax_typed(const Tensor& out, const Tensor& in) {
  const int64_t rows = in.size(0), cols = in.size(1);
  Rows<T> x(in);
  auto* o = static_cast<T*>(out.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    T* out_row = o + i * cols;
    const ExpRow<T> e = exp_row_shifted(out_row, x[i], cols);
    if (std::isinf(e.max)) {
      // All -inf (a fully masked row) or an inf: exp(x - max) is NaN somewhere, as
      // PyTorch's softmax gives NaN for such a row.
      std::fill_n(out_row, cols, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    const auto inv = static_cast<T>(1.0 / e.sum);
    for (int64_t j = 0; j < cols; ++j) out_row[j] *= inv;
  }
}

// grad_in = y * (grad_out - sum_j grad_out[j] y[j])
template <typename T>
void softmax_backward_typed(const Tensor& grad_in, const Tensor& grad_out, const Tensor& output) {
  const int64_t rows = output.size(0), cols = output.size(1);
  Rows<T> g(grad_out), y(output);
  auto* gi = static_cast<T*>(grad_in.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    const T* g_row = g[i];
    // The scratch of g and y are different vectors, so both rows stay valid together.
    const T* y_row = y[i];
    double dot = 0.0;
    for (int64_t j = 0; j < cols; ++j) dot += static_cast<double>(g_row[j]) * y_row[j];
    const auto d = static_cast<T>(dot);
    T* out_row = gi + i * cols;
    for (int64_t j = 0; j < cols; ++j) out_row[j] = y_row[j] * (g_row[j] - d);
  }
}
}  // namespace

void CpuBackend::log_softmax(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = cpu::float32_stand_in(out);
    log_softmax(wide, cpu::widen(in));
    return cpu::round_into(out, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(in.dtype(), "log_softmax", [&] { log_softmax_typed<scalar_t>(out, in); });
}

void CpuBackend::log_softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                                      const Tensor& output) {
  if (is_reduced_float(output.dtype())) {
    const Tensor wide = cpu::float32_stand_in(grad_in);
    log_softmax_backward(wide, cpu::widen(grad_out), cpu::widen(output));
    return cpu::round_into(grad_in, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(output.dtype(), "log_softmax_backward", [&] {
    log_softmax_backward_typed<scalar_t>(grad_in, grad_out, output);
  });
}

void CpuBackend::softmax(const Tensor& out, const Tensor& in) {
  if (is_reduced_float(in.dtype())) {
    const Tensor wide = cpu::float32_stand_in(out);
    softmax(wide, cpu::widen(in));
    return cpu::round_into(out, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(in.dtype(), "softmax", [&] { softmax_typed<scalar_t>(out, in); });
}

void CpuBackend::softmax_backward(const Tensor& grad_in, const Tensor& grad_out,
                                  const Tensor& output) {
  if (is_reduced_float(output.dtype())) {
    const Tensor wide = cpu::float32_stand_in(grad_in);
    softmax_backward(wide, cpu::widen(grad_out), cpu::widen(output));
    return cpu::round_into(grad_in, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(output.dtype(), "softmax_backward", [&] {
    softmax_backward_typed<scalar_t>(grad_in, grad_out, output);
  });
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

namespace {
template <typename T>
void cross_entropy_typed(const Tensor& loss, const Tensor& logits, const Tensor& targets,
                         const CrossEntropyOptions& options) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  Rows<T> x(logits);
  const auto* t = static_cast<const int64_t*>(targets.data_ptr());
  const int64_t ts = targets.stride(0);
  const double eps = options.label_smoothing();
  auto* out = static_cast<T*>(loss.data_ptr());
  std::vector<T> exps(static_cast<size_t>(cols));
  double total = 0.0;
  int64_t counted = 0;
  for (int64_t i = 0; i < rows; ++i) {
    const int64_t target = row_target(t, ts, i, cols, options.ignore_index());
    double row_loss = 0.0;
    if (target >= 0) {
      const T* row = x[i];
      const double lse = log_sum_exp(exp_row_shifted(exps.data(), row, cols));
      // (1 - eps) * (lse - x[t]) + eps * (lse - mean_j x[j])
      row_loss = lse - static_cast<double>(row[target]);
      if (eps != 0.0)
        row_loss = (1.0 - eps) * row_loss +
                   eps * (lse - row_sum(row, cols) / static_cast<double>(cols));
      ++counted;
    }
    if (options.reduction() == Reduction::None) out[i] = static_cast<T>(row_loss);
    total += row_loss;
  }
  if (options.reduction() == Reduction::Sum) *out = static_cast<T>(total);
  // Every row ignored: 0 / 0, a NaN, as PyTorch's mean.
  if (options.reduction() == Reduction::Mean)
    *out = static_cast<T>(total / static_cast<double>(counted));
}

template <typename T>
void cross_entropy_backward_typed(const Tensor& grad_logits, const Tensor& grad_loss,
                                  const Tensor& logits, const Tensor& targets,
                                  const CrossEntropyOptions& options) {
  const int64_t rows = logits.size(0), cols = logits.size(1);
  Rows<T> x(logits);
  const auto* t = static_cast<const int64_t*>(targets.data_ptr());
  const int64_t ts = targets.stride(0);
  const auto* gl = static_cast<const T*>(grad_loss.data_ptr());
  const double eps = options.label_smoothing();
  double scale = static_cast<double>(gl[0]);  // Sum
  if (options.reduction() == Reduction::Mean) {
    int64_t counted = 0;
    for (int64_t i = 0; i < rows; ++i)
      if (row_target(t, ts, i, cols, options.ignore_index()) >= 0) ++counted;
    scale /= static_cast<double>(counted);
  }
  const int64_t grad_stride = options.reduction() == Reduction::None ? grad_loss.stride(0) : 0;
  auto* g = static_cast<T*>(grad_logits.data_ptr());
  for (int64_t i = 0; i < rows; ++i) {
    T* row = g + i * cols;
    const int64_t target = row_target(t, ts, i, cols, options.ignore_index());
    if (target < 0) {  // an ignored row has no gradient
      std::fill_n(row, cols, T(0));
      continue;
    }
    const double row_scale =
        options.reduction() == Reduction::None ? static_cast<double>(gl[i * grad_stride]) : scale;
    // d loss_i / d x[i, j] = (softmax[j] - q[j]) * s_i, with q = (1 - eps) onehot(t) +
    // eps / C: the exps go into the gradient row, then each becomes its gradient.
    const ExpRow<T> e = exp_row_shifted(row, x[i], cols);
    if (std::isinf(e.max)) {  // no finite shift: as the unshifted softmax, a NaN row
      std::fill_n(row, cols, std::numeric_limits<T>::quiet_NaN());
      continue;
    }
    const auto s = static_cast<T>(row_scale);
    const auto softmax_scale = static_cast<T>(row_scale / e.sum);
    const auto spread = static_cast<T>(eps / static_cast<double>(cols) * row_scale);
    for (int64_t j = 0; j < cols; ++j) row[j] = row[j] * softmax_scale - spread;
    row[target] -= static_cast<T>(1.0 - eps) * s;
  }
}

}  // namespace

void CpuBackend::cross_entropy(const Tensor& loss, const Tensor& logits, const Tensor& targets,
                               const CrossEntropyOptions& options) {
  if (is_reduced_float(logits.dtype())) {
    const Tensor wide = cpu::float32_stand_in(loss);
    cross_entropy(wide, cpu::widen(logits), targets, options);
    return cpu::round_into(loss, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(logits.dtype(), "cross_entropy", [&] {
    cross_entropy_typed<scalar_t>(loss, logits, targets, options);
  });
}

void CpuBackend::cross_entropy_backward(const Tensor& grad_logits, const Tensor& grad_loss,
                                        const Tensor& logits, const Tensor& targets,
                                        const CrossEntropyOptions& options) {
  if (is_reduced_float(logits.dtype())) {
    const Tensor wide = cpu::float32_stand_in(grad_logits);
    cross_entropy_backward(wide, cpu::widen(grad_loss), cpu::widen(logits), targets, options);
    return cpu::round_into(grad_logits, wide);
  }
  MG_DISPATCH_FLOATING_TYPES(logits.dtype(), "cross_entropy_backward", [&] {
    cross_entropy_backward_typed<scalar_t>(grad_logits, grad_loss, logits, targets, options);
  });
}

}  // namespace mg
