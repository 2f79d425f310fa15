#include <minigrad/autograd/anomaly_mode.h>

#include <atomic>
#include <cmath>

#include <minigrad/autograd/node.h>
#include <minigrad/core/ops.h>

namespace mg {
namespace {
std::atomic<bool> anomaly_enabled{false};
}  // namespace

bool AnomalyMode::is_enabled() { return anomaly_enabled.load(std::memory_order_relaxed); }
void AnomalyMode::set_enabled(bool enabled) {
  anomaly_enabled.store(enabled, std::memory_order_relaxed);
}

namespace anomaly {

std::string describe_forward(const std::vector<Tensor>& inputs) {
  std::string out;
  for (size_t i = 0; i < inputs.size(); ++i) {
    const Tensor& t = inputs[i];
    if (i > 0) out += ", ";
    if (!t.defined()) {
      out += "undefined";
      continue;
    }
    const char* origin = t.grad_fn()           ? t.grad_fn()->name().c_str()
                         : t.requires_grad() ? "a leaf that requires grad"
                                             : "a constant";
    out += fmt::format("{} {} {} from {}", t.shape(), t.dtype(), t.device(), origin);
  }
  return out;
}

bool has_non_finite(const Tensor& t) {
  if (!t.defined() || !is_floating_point(t.dtype()) || t.numel() == 0) return false;
  // x * 0 is 0 for every finite x and NaN for NaN and +-inf, so one reduction on the
  // tensor's own device answers the question without copying it to the host.
  const Tensor probe = ops::sum(ops::binary_scalar(BinaryOp::Mul, t, 0.0), {}, false);
  return std::isnan(ops::to_dtype(probe, DType::Float64).item<double>());
}

void report_non_finite(const std::string& node_name, const std::string& creation_context,
                       size_t index, const Tensor& grad) {
  int64_t nans = 0, infs = 0;
  for (double v : ops::to_dtype(grad, DType::Float64).to_vector<double>()) {
    nans += std::isnan(v) ? 1 : 0;
    infs += std::isinf(v) ? 1 : 0;
  }
  MG_FAIL("detect_anomaly: {} returned non-finite values in its gradient {} (shape {}, {}, {}): "
          "{} NaN and {} infinite of {} values. {} was created in forward{}",
          node_name, index, grad.shape(), grad.dtype(), grad.device(), nans, infs, grad.numel(),
          node_name,
          creation_context.empty()
              ? " before anomaly detection was enabled (enable it before forward to see its inputs)"
              : fmt::format(" from inputs: {}", creation_context));
}

}  // namespace anomaly
}  // namespace mg
