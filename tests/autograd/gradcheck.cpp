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

// L = sum_k <outputs_k, weights_k>, in double.
double weighted_sum(const std::vector<Tensor>& outputs,
                    const std::vector<std::vector<float>>& weights) {
  double total = 0.0;
  for (size_t k = 0; k < outputs.size(); ++k) {
    const std::vector<float> values = outputs[k].to_vector<float>();
    for (size_t e = 0; e < values.size(); ++e)
      total += static_cast<double>(values[e]) * static_cast<double>(weights[k][e]);
  }
  return total;
}

}  // namespace

Tensor random_input(const Shape& shape, uint64_t seed, double low, double high) {
  UniformSource source(seed);
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  for (float& v : values) v = static_cast<float>(low + (high - low) * source.next());
  return from_vector(values, shape);
}

Tensor random_away_from_zero(const Shape& shape, uint64_t seed, double margin, double high) {
  UniformSource source(seed);
  std::vector<float> values(static_cast<size_t>(shape.numel()));
  for (float& v : values) {
    const double magnitude = margin + (high - margin) * source.next();
    v = static_cast<float>(source.next() < 0.5 ? -magnitude : magnitude);
  }
  return from_vector(values, shape);
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
    if (leaf.dtype() == DType::Float32) leaf.set_requires_grad(true);
    leaves.push_back(leaf);
  }

  // Analytic: one backward seeded with a random weight per output.
  std::vector<Tensor> outputs = f(leaves);
  std::vector<Tensor> seeds;
  std::vector<std::vector<float>> weights;
  for (size_t k = 0; k < outputs.size(); ++k) {
    if (!outputs[k].requires_grad()) {
      fail(fmt::format("output {} (shape {}) does not require grad", k, outputs[k].shape()));
      return result;
    }
    seeds.push_back(random_input(outputs[k].shape(), 7919 + k));
    weights.push_back(seeds.back().to_vector<float>());
  }
  run_backward(outputs, seeds, /*retain_graph=*/false);

  // Numeric: central differences, one input element at a time, without a graph.
  NoGradGuard no_grad;
  for (size_t i = 0; i < leaves.size(); ++i) {
    Tensor& leaf = leaves[i];
    if (leaf.dtype() != DType::Float32) continue;
    const Tensor grad = leaf.grad();
    if (grad.defined() && grad.shape() != leaf.shape()) {
      fail(fmt::format("input {}: gradient has shape {}, input has shape {}", i, grad.shape(),
                       leaf.shape()));
      continue;
    }
    const std::vector<float> analytic =
        grad.defined() ? grad.to_vector<float>()
                       : std::vector<float>(static_cast<size_t>(leaf.numel()), 0.0f);
    float* x = leaf.data<float>();
    double worst_excess = -1.0;
    std::string worst;
    for (int64_t e = 0; e < leaf.numel(); ++e) {
      const float original = x[e];
      const float plus = static_cast<float>(original + options.eps);
      const float minus = static_cast<float>(original - options.eps);
      x[e] = plus;
      const double loss_plus = weighted_sum(f(leaves), weights);
      x[e] = minus;
      const double loss_minus = weighted_sum(f(leaves), weights);
      x[e] = original;
      // The step actually taken, after rounding x +- eps to float.
      const double step = static_cast<double>(plus) - static_cast<double>(minus);
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
