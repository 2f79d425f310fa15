#include "gradcheck.h"

#include <cmath>
#include <random>

#include <fmt/format.h>

#include <minigrad/autograd/engine.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::testing {
namespace {

// Uniform doubles in [0, 1) from a 64-bit Mersenne twister: the same numbers with every
// standard library (std::uniform_real_distribution is not specified bit for bit).
class UniformSource {
 public:
  explicit UniformSource(uint64_t seed) : engine_(seed) {}
  double next() { return static_cast<double>(engine_() >> 11) * 0x1.0p-53; }

 private:
  std::mt19937_64 engine_;
};

// A float tensor's values as doubles, whatever its float dtype.
std::vector<double> values_of(const Tensor& t) {
  return ops::to_dtype(t, DType::Float64).to_vector<double>();
}

// L = sum_k <outputs_k, weights_k>, in double.
double weighted_sum(const std::vector<Tensor>& outputs,
                    const std::vector<std::vector<double>>& weights) {
  double total = 0.0;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const std::vector<double> values = values_of(outputs[k]);
    for (size_t e = 0; e < values.size(); ++e) total += values[e] * weights[k][e];
  }
  return total;
}

// Values drawn in double, stored in `dtype` (float32 ones rounded as before).
Tensor from_doubles(const std::vector<double>& values, const Shape& shape, DType dtype) {
  return ops::to_dtype(from_vector(values, shape), dtype);
}

// x[e] + delta in the leaf's own dtype, and the value actually stored (after rounding).
template <typename T>
double perturb(const Tensor& leaf, int64_t e, double value) {
  T* x = leaf.data<T>();
  x[e] = static_cast<T>(value);
  return static_cast<double>(x[e]);
}
double perturb_leaf(const Tensor& leaf, int64_t e, double value) {
  return leaf.dtype() == DType::Float64 ? perturb<double>(leaf, e, value)
                                        : perturb<float>(leaf, e, value);
}
double read_leaf(const Tensor& leaf, int64_t e) {
  return leaf.dtype() == DType::Float64 ? leaf.data<double>()[e]
                                        : static_cast<double>(leaf.data<float>()[e]);
}

}  // namespace

Tensor random_input(const Shape& shape, uint64_t seed, double low, double high, DType dtype) {
  UniformSource source(seed);
  std::vector<double> values(static_cast<size_t>(shape.numel()));
  for (double& v : values) v = low + (high - low) * source.next();
  return from_doubles(values, shape, dtype);
}

Tensor random_away_from_zero(const Shape& shape, uint64_t seed, double margin, double high,
                             DType dtype) {
  UniformSource source(seed);
  std::vector<double> values(static_cast<size_t>(shape.numel()));
  for (double& v : values) {
    const double magnitude = margin + (high - margin) * source.next();
    v = source.next() < 0.5 ? -magnitude : magnitude;
  }
  return from_doubles(values, shape, dtype);
}

GradcheckResult gradcheck(const MultiOutputFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options) {
  GradcheckResult result;
  auto fail = [&](const std::string& line) {
    result.ok = false;
    result.report += line + "\n";
  };

  // Fresh contiguous leaves: the caller's tensors are never touched.
  std::vector<Tensor> leaves;
  for (const Tensor& x : inputs) {
    Tensor leaf = ops::clone(x.detach());
    if (is_floating_point(leaf.dtype())) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }

  // Analytic: one backward seeded with a random weight per output.
  std::vector<Tensor> outputs = f(leaves);
  std::vector<Tensor> seeds;
  std::vector<std::vector<double>> weights;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].requires_grad()) {
      fail(fmt::format("output {} (shape {}) does not require grad", k, outputs[k].shape()));
      return result;
    }
    seeds.push_back(random_input(outputs[k].shape(), 7919 + k, -1.0, 1.0, outputs[k].dtype()));
    weights.push_back(values_of(seeds.back()));
  }
  run_backward(outputs, seeds, /*retain_graph=*/false);

  // Numeric: central differences, one input element at a time, without a graph.
  NoGradGuard no_grad;
  for (size_t i = 0; i < leaves.size(); ++i) {
    Tensor& leaf = leaves[i];
    if (!is_floating_point(leaf.dtype())) continue;
    const Tensor grad = leaf.grad();
    if (grad.defined() && grad.shape() != leaf.shape()) {
      fail(fmt::format("input {}: gradient has shape {}, input has shape {}", i, grad.shape(),
                       leaf.shape()));
      continue;
    }
    if (grad.defined() && grad.dtype() != leaf.dtype()) {
      fail(fmt::format("input {}: gradient is {}, input is {}", i, grad.dtype(), leaf.dtype()));
      continue;
    }
    const std::vector<double> analytic =
        grad.defined() ? values_of(grad) : std::vector<double>(static_cast<size_t>(leaf.numel()), 0.0);
    double worst_excess = -1.0;
    std::string worst;
    for (int64_t e = 0; e < leaf.numel(); ++e) {
      const double original = read_leaf(leaf, e);
      const double plus = perturb_leaf(leaf, e, original + options.eps);
      const double loss_plus = weighted_sum(f(leaves), weights);
      const double minus = perturb_leaf(leaf, e, original - options.eps);
      const double loss_minus = weighted_sum(f(leaves), weights);
      perturb_leaf(leaf, e, original);
      // The step actually taken, after rounding x +- eps to the leaf's dtype.
      const double step = plus - minus;
      const double numeric = (loss_plus - loss_minus) / step;
      const double a = analytic[static_cast<size_t>(e)];
      const double tolerance = options.atol + options.rtol * std::fabs(numeric);
      const double excess = std::fabs(a - numeric) - tolerance;
      ++result.checked;
      if (!(excess <= 0.0) && (excess > worst_excess || std::isnan(excess))) {
        worst_excess = std::isnan(excess) ? INFINITY : excess;
        worst = fmt::format(
            "input {} (shape {}) element {}: analytic {:.6g} vs numeric {:.6g} "
            "(tolerance {:.3g})",
            i, leaf.shape(), e, a, numeric, tolerance);
      }
    }
    if (!worst.empty()) fail(worst);
  }
  if (result.ok) result.report = fmt::format("{} gradient elements agree", result.checked);
  return result;
}

GradcheckResult gradcheck(const SingleOutputFn& f, const std::vector<Tensor>& inputs,
                          const GradcheckOptions& options) {
  return gradcheck(
      MultiOutputFn([&f](const std::vector<Tensor>& xs) { return std::vector<Tensor>{f(xs)}; }),
      inputs, options);
}

}  // namespace mg::testing
