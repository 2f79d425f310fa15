#include <minigrad/nn/amp/grad_scaler.h>

#include <algorithm>
#include <cmath>
#include <utility>
#include <vector>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::amp {

GradScaler::GradScaler(GradScalerOptions options)
    : enabled_(options.enabled),
      scale_(static_cast<float>(options.init_scale)),
      growth_factor_(options.growth_factor),
      backoff_factor_(options.backoff_factor),
      growth_interval_(options.growth_interval),
      reduce_found_inf_(std::move(options.reduce_found_inf)) {
  // torch's asserts.
  MG_CHECK(options.growth_factor > 1.0, "GradScaler: the growth factor must be > 1.0, got {}",
           options.growth_factor);
  MG_CHECK(options.backoff_factor < 1.0, "GradScaler: the backoff factor must be < 1.0, got {}",
           options.backoff_factor);
  MG_CHECK(options.growth_interval > 0, "GradScaler: growth_interval must be > 0, got {}",
           options.growth_interval);
  MG_CHECK(std::isfinite(options.init_scale) && options.init_scale > 0.0,
           "GradScaler: init_scale must be a positive finite number, got {}", options.init_scale);
}

GradScaler::OptimizerState& GradScaler::state_of(const optim::Optimizer& optimizer) {
  return per_optimizer_[&optimizer];
}

Tensor GradScaler::scale(const Tensor& outputs) const {
  if (!enabled_) return outputs;
  // A floating scalar keeps the outputs' dtype (a float16 output stays float16, as
  // torch's multiplication by its 0-dim float32 scale tensor does).
  return mul(outputs, static_cast<double>(scale_));
}

void GradScaler::unscale_(optim::Optimizer& optimizer) {
  if (!enabled_) return;
  OptimizerState& state = state_of(optimizer);
  MG_CHECK(state.stage != Stage::Unscaled,
           "GradScaler::unscale_: unscale_() has already been called on this optimizer ({}) "
           "since the last update()",
           optimizer.name());
  MG_CHECK(state.stage != Stage::Stepped,
           "GradScaler::unscale_: unscale_() is being called after step() ({}); call update() "
           "first",
           optimizer.name());
  optimizer.prepare_gradients();  // a MasterWeights optimizer fills its masters' gradients
  NoGradGuard no_grad;
  // torch: self._scale.double().reciprocal().float()
  const auto inv_scale = static_cast<float>(1.0 / static_cast<double>(scale_));
  // Per device, the sum of max|g| * 0 over its gradients: 0 when every one is finite, NaN
  // (inf * 0 or NaN) otherwise; read once per device. Checked before unscaling, as torch's
  // kernel checks each value it unscales.
  std::vector<std::pair<Device, Tensor>> non_finite;
  bool any_gradient = false;
  for (size_t i = 0; i < optimizer.parameters().size(); ++i) {
    const Tensor& p = optimizer.parameters()[i];
    Tensor g = p.grad();
    if (!g.defined()) continue;
    MG_CHECK(g.dtype() != DType::Float16,
             "GradScaler::unscale_: Attempting to unscale FP16 gradients (parameter {} of {}, "
             "shape {}): keep float32 parameters under autocast, or float32 master weights "
             "(optim::MasterWeights), and unscale those",
             i, optimizer.name(), p.shape());
    any_gradient = true;
    if (g.numel() == 0) continue;
    const Tensor probe = ops::binary_scalar(
        BinaryOp::Mul, ops::abs_max(ops::to_dtype(g, compute_dtype(g.dtype()))), 0.0);
    auto slot = std::find_if(non_finite.begin(), non_finite.end(),
                             [&](const auto& entry) { return entry.first == g.device(); });
    if (slot == non_finite.end()) {
      non_finite.emplace_back(g.device(), probe);
    } else {
      slot->second = ops::binary(BinaryOp::Add, slot->second, ops::to_dtype(probe, slot->second.dtype()));
    }
    g.mul_(static_cast<double>(inv_scale));  // in float, rounded once for a bfloat16 gradient
  }
  MG_CHECK(any_gradient || reduce_found_inf_,
           "GradScaler: No inf checks were recorded for this optimizer ({}): none of its "
           "parameters has a gradient",
           optimizer.name());
  bool found = false;
  for (const auto& [device, sum] : non_finite) {
    (void)device;
    const double v = ops::to_dtype(sum, DType::Float64).item<double>();
    found = found || !std::isfinite(v);
  }
  if (reduce_found_inf_) {
    Tensor flag = full(Shape{}, found ? 1.0 : 0.0, DType::Float32,
                       optimizer.parameters().empty() ? Device::cpu() : optimizer.parameters()[0].device());
    reduce_found_inf_(flag);
    MG_CHECK(flag.defined() && flag.numel() == 1,
             "GradScaler: reduce_found_inf must leave one element in found_inf");
    found = ops::to_dtype(flag, DType::Float64).reshape(Shape{}).item<double>() > 0.0;
  }
  state.found_inf = found;
  state.stage = Stage::Unscaled;
}

bool GradScaler::step(optim::Optimizer& optimizer) {
  if (!enabled_) {
    optimizer.step();
    return true;
  }
  OptimizerState& state = state_of(optimizer);
  MG_CHECK(state.stage != Stage::Stepped,
           "GradScaler::step: step() has already been called since the last update() ({})",
           optimizer.name());
  if (state.stage == Stage::Ready) unscale_(optimizer);
  const bool run = !state.found_inf;
  if (run) optimizer.step();
  state.stage = Stage::Stepped;
  return run;
}

void GradScaler::update() {
  if (!enabled_) return;
  bool recorded = false, found = false;
  for (const auto& [opt, state] : per_optimizer_) {
    if (state.stage == Stage::Ready) continue;
    recorded = true;
    found = found || state.found_inf;
  }
  MG_CHECK(recorded, "GradScaler::update: No inf checks were recorded prior to update()");
  // torch's _amp_update_scale_, in its float arithmetic.
  if (found) {
    scale_ = static_cast<float>(static_cast<double>(scale_) * backoff_factor_);
    growth_tracker_ = 0;
  } else if (growth_tracker_ + 1 == growth_interval_) {
    const auto grown = static_cast<float>(static_cast<double>(scale_) * growth_factor_);
    if (std::isfinite(grown)) scale_ = grown;
    growth_tracker_ = 0;
  } else {
    ++growth_tracker_;
  }
  per_optimizer_.clear();
}

void GradScaler::update(double new_scale) {
  if (!enabled_) return;
  scale_ = static_cast<float>(new_scale);
  per_optimizer_.clear();
}

double GradScaler::get_scale() const { return enabled_ ? static_cast<double>(scale_) : 1.0; }

std::map<std::string, Tensor> GradScaler::state_dict() const {
  if (!enabled_) return {};
  return {{"scale", scalar_tensor(static_cast<double>(scale_), DType::Float32)},
          {"growth_factor", scalar_tensor(growth_factor_, DType::Float64)},
          {"backoff_factor", scalar_tensor(backoff_factor_, DType::Float64)},
          {"growth_interval", scalar_tensor(static_cast<double>(growth_interval_), DType::Int64)},
          {"_growth_tracker", scalar_tensor(static_cast<double>(growth_tracker_), DType::Int64)}};
}

void GradScaler::load_state_dict(const std::map<std::string, Tensor>& state) {
  if (!enabled_) return;
  MG_CHECK(!state.empty(),
           "GradScaler::load_state_dict: The source state dict is empty, possibly because it was "
           "saved from a disabled instance of GradScaler.");
  const auto value = [&](const char* key) {
    const auto found = state.find(key);
    MG_CHECK(found != state.end() && found->second.defined() && found->second.numel() == 1,
             "GradScaler::load_state_dict: no '{}' (one value) in the state dict", key);
    return ops::to_dtype(found->second, DType::Float64).reshape(Shape{}).item<double>();
  };
  const double scale = value("scale"), growth = value("growth_factor"),
               backoff = value("backoff_factor"), interval = value("growth_interval"),
               tracker = value("_growth_tracker");
  scale_ = static_cast<float>(scale);
  growth_factor_ = growth;
  backoff_factor_ = backoff;
  growth_interval_ = static_cast<int64_t>(interval);
  growth_tracker_ = static_cast<int64_t>(tracker);
}

}  // namespace mg::amp
