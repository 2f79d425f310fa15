#include "precision.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/files.h>

#include "command_line.h"

namespace mg::samples {

const std::vector<std::string>& precision_names() {
  static const std::vector<std::string> names = {"32-true", "bf16-mixed", "16-mixed", "bf16-true"};
  return names;
}

Precision parse_precision(const std::string& name) {
  const auto& names = precision_names();
  for (size_t i = 0; i < names.size(); ++i)
    if (names[i] == name) return static_cast<Precision>(i);
  throw OptionError(fmt::format("--precision {}: not one of {}", name, fmt::join(names, ", ")));
}

const char* precision_name(Precision precision) {
  return precision_names().at(static_cast<size_t>(precision)).c_str();
}

MixedPrecision::MixedPrecision(Precision precision, Device device, amp::FoundInfReducer reduce_found_inf,
                               int64_t growth_interval)
    : precision_(precision), device_(device) {
  if (precision == Precision::F16Mixed) {
    amp::GradScalerOptions options;  // torch's: 2^16, x2 after 2000 clean steps, x0.5 on inf
    options.reduce_found_inf = std::move(reduce_found_inf);
    options.growth_interval = growth_interval;
    scaler_ = std::make_unique<amp::GradScaler>(options);
  }
}

DType MixedPrecision::param_dtype() const {
  return precision_ == Precision::BF16True ? DType::BFloat16 : DType::Float32;
}

std::optional<DType> MixedPrecision::autocast_dtype() const {
  if (precision_ == Precision::BF16Mixed) return DType::BFloat16;
  if (precision_ == Precision::F16Mixed) return DType::Float16;
  return std::nullopt;
}

std::string MixedPrecision::str() const {
  switch (precision_) {
    case Precision::True32: return "32-true: float32";
    case Precision::BF16Mixed: return "bf16-mixed: float32 parameters, bfloat16 autocast";
    case Precision::F16Mixed:
      return fmt::format("16-mixed: float32 parameters, float16 autocast, loss scale {}", loss_scale());
    case Precision::BF16True: return "bf16-true: bfloat16 parameters, float32 master weights and optimizer state";
  }
  return "";
}

std::unique_ptr<AutocastGuard> MixedPrecision::autocast(bool cache_enabled) const {
  const std::optional<DType> dtype = autocast_dtype();
  if (!dtype) return nullptr;
  return std::make_unique<AutocastGuard>(device_.type(), *dtype, true, cache_enabled);
}

std::unique_ptr<optim::Optimizer> MixedPrecision::wrap_optimizer(std::vector<Tensor> params,
                                                                 const optim::OptimizerFactory& make) const {
  if (precision_ != Precision::BF16True) return make(std::move(params));
  // Rounded to nearest when written back: a resumed run continues bit for bit without a
  // rounding generator's state in the checkpoint.
  return std::make_unique<optim::MasterWeights>(std::move(params), make);
}

void MixedPrecision::unscale_(const std::vector<optim::Optimizer*>& optimizers) {
  for (optim::Optimizer* opt : optimizers) {
    if (scaler_) scaler_->unscale_(*opt);  // prepares the gradients first
    else opt->prepare_gradients();
  }
}

bool MixedPrecision::step(const std::vector<optim::Optimizer*>& optimizers) {
  if (!scaler_) {
    for (optim::Optimizer* opt : optimizers) opt->step();
    return true;
  }
  bool stepped = true;
  for (optim::Optimizer* opt : optimizers) stepped = scaler_->step(*opt) && stepped;
  scale_history_.push_back({scaler_->get_scale(), stepped});  // the scale this step's loss had
  scaler_->update();
  return stepped;
}

void MixedPrecision::write_scale_history(const std::string& flag, const std::string& path, int64_t first_step) const {
  std::string csv = "step,scale,stepped\n";
  for (size_t i = 0; i < scale_history_.size(); ++i)
    csv += fmt::format("{},{},{}\n", first_step + 1 + static_cast<int64_t>(i), scale_history_[i].scale,
                       scale_history_[i].stepped ? 1 : 0);
  files::write_atomically(flag.c_str(), path, csv);
}

std::map<std::string, Tensor> MixedPrecision::state_dict() const {
  return scaler_ ? scaler_->state_dict() : std::map<std::string, Tensor>{};
}

void MixedPrecision::load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) {
  if (!scaler_) return;
  MG_CHECK(!state.empty(), "{}: no GradScaler state ('scaler.*') to resume --precision {} with", source, name());
  scaler_->load_state_dict(state);
}

}  // namespace mg::samples
