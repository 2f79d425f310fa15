#include <minigrad/nn/optim/adam.h>

#include <algorithm>
#include <cmath>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/profiler.h>

namespace mg::optim {

namespace detail {

template <typename Self>
void AdamOptionsBase<Self>::validate(const char* optimizer) const {
  // isfinite() refuses NaN and infinities, which would silently poison every parameter.
  MG_CHECK(std::isfinite(lr_) && lr_ >= 0.0, "{}: invalid learning rate: {} (must be >= 0)",
           optimizer, lr_);
  MG_CHECK(std::isfinite(eps_) && eps_ >= 0.0, "{}: invalid epsilon value: {} (must be >= 0)",
           optimizer, eps_);
  const double beta1 = std::get<0>(betas_), beta2 = std::get<1>(betas_);
  MG_CHECK(std::isfinite(beta1) && beta1 >= 0.0 && beta1 < 1.0,
           "{}: invalid beta parameter at index 0: {} (must be in [0, 1))", optimizer, beta1);
  MG_CHECK(std::isfinite(beta2) && beta2 >= 0.0 && beta2 < 1.0,
           "{}: invalid beta parameter at index 1: {} (must be in [0, 1))", optimizer, beta2);
  MG_CHECK(std::isfinite(weight_decay_) && weight_decay_ >= 0.0,
           "{}: invalid weight_decay value: {} (must be >= 0)", optimizer, weight_decay_);
}

template class AdamOptionsBase<AdamOptions>;
template class AdamOptionsBase<AdamWOptions>;

}  // namespace detail

// ---------------------------------------------------------------- AdamBase

AdamBase::AdamBase(std::vector<std::vector<Tensor>> groups, const char* name)
    : Optimizer(std::move(groups), name) {
  state_.resize(parameters().size());
}

namespace {

Tensor zeros_for(const Tensor& p) { return zeros(p.shape(), p.dtype(), p.device()); }

}  // namespace

void AdamBase::step() {
  NoGradGuard no_grad;
  profiler::Span span(parameters().empty() ? Device::cpu() : parameters()[0].device(),
                      "{}.step", name());
  span.category("optimizer");

  // One fused update per group, device and dtype. A parameter's first state (zeros) and its new step
  // count become state only once its device's step has run, so a failed step (a
  // refused graph capture, say) leaves no state half made.
  struct Pending {
    size_t index;
    int64_t step;
    ParamState fresh;     // the zeros of a first step, else empty
    Tensor param_copy;    // a contiguous copy to write back into a strided parameter
  };
  struct DeviceStep {
    size_t group;
    Device device;
    DType dtype;
    AdamStep step;
    std::vector<Pending> pending;
  };
  std::vector<DeviceStep> steps;
  const std::vector<Tensor>& params = parameters();
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const size_t g = param_group_of(i);
    const Hyper h = hyper(g);
    auto group = std::find_if(steps.begin(), steps.end(), [&](const DeviceStep& s) {
      return s.group == g && s.device == p.device() && s.dtype == p.dtype();
    });
    if (group == steps.end()) {
      DeviceStep s{g, p.device(), p.dtype(), AdamStep{}, {}};
      s.step.lr = h.lr;
      s.step.beta1 = h.beta1;
      s.step.beta2 = h.beta2;
      s.step.eps = h.eps;
      s.step.weight_decay = h.weight_decay;
      s.step.decoupled_weight_decay = h.decoupled;
      s.step.amsgrad = h.amsgrad;
      s.step.maximize = h.maximize;
      steps.push_back(std::move(s));
      group = steps.end() - 1;
    }
    const ParamState& st = state_[i];
    Pending pending{i, 1, {}, Tensor()};
    if (st.step.defined()) {
      pending.step = st.step.item<int64_t>() + 1;
    } else {
      pending.fresh.exp_avg = zeros_for(p);
      pending.fresh.exp_avg_sq = zeros_for(p);
      if (h.amsgrad) pending.fresh.max_exp_avg_sq = zeros_for(p);
    }
    const ParamState& use = st.step.defined() ? st : pending.fresh;

    AdamTensor t;
    // The fused step wants contiguous tensors; a strided parameter steps in a copy that
    // is written back, a strided gradient is read from a copy. The bits are the same.
    if (p.is_contiguous()) {
      t.param = p;
    } else {
      pending.param_copy = ops::contiguous(p);
      t.param = pending.param_copy;
    }
    t.grad = ops::contiguous(grad);
    t.exp_avg = use.exp_avg;
    t.exp_avg_sq = use.exp_avg_sq;
    t.max_exp_avg_sq = use.max_exp_avg_sq;
    const auto step = static_cast<double>(pending.step);
    t.step_size = h.lr / (1.0 - std::pow(h.beta1, step));
    t.bias_correction2_sqrt = std::sqrt(1.0 - std::pow(h.beta2, step));
    group->step.tensors.push_back(std::move(t));
    group->pending.push_back(std::move(pending));
  }

  for (DeviceStep& s : steps) {
    backend(s.device).adam_step(s.step);
    // The fused step wrote the parameters and moments through the backend: count it as
    // the in-place update it is (core/tensor.h: bump_version), as SGD::step does.
    for (const AdamTensor& t : s.step.tensors)
      for (const Tensor* written : {&t.param, &t.exp_avg, &t.exp_avg_sq, &t.max_exp_avg_sq})
        if (written->defined()) bump_version(*written, "Adam::step");
    for (Pending& pending : s.pending) {
      ParamState& st = state_[pending.index];
      if (!st.step.defined()) {
        st = std::move(pending.fresh);
        st.step = zeros(Shape{}, DType::Int64);
      }
      *st.step.data<int64_t>() = pending.step;
      bump_version(st.step, "Adam::step");
      if (pending.param_copy.defined()) ops::copy_(params[pending.index], pending.param_copy);
    }
  }
}

const Tensor& AdamBase::exp_avg(size_t index) const {
  MG_CHECK(index < state_.size(), "{}::exp_avg: index {} out of range for {} parameters", name(),
           index, state_.size());
  return state_[index].exp_avg;
}

const Tensor& AdamBase::exp_avg_sq(size_t index) const {
  MG_CHECK(index < state_.size(), "{}::exp_avg_sq: index {} out of range for {} parameters",
           name(), index, state_.size());
  return state_[index].exp_avg_sq;
}

const Tensor& AdamBase::max_exp_avg_sq(size_t index) const {
  MG_CHECK(index < state_.size(), "{}::max_exp_avg_sq: index {} out of range for {} parameters",
           name(), index, state_.size());
  return state_[index].max_exp_avg_sq;
}

int64_t AdamBase::step_count(size_t index) const {
  MG_CHECK(index < state_.size(), "{}::step_count: index {} out of range for {} parameters",
           name(), index, state_.size());
  const Tensor& step = state_[index].step;
  return step.defined() ? step.item<int64_t>() : 0;
}

void AdamBase::sync_amsgrad_state() {
  NoGradGuard no_grad;
  for (size_t i = 0; i < state_.size(); ++i) {
    const bool amsgrad = hyper(param_group_of(i)).amsgrad;
    ParamState& st = state_[i];
    if (!st.step.defined()) continue;
    if (amsgrad && !st.max_exp_avg_sq.defined()) st.max_exp_avg_sq = zeros_for(parameters()[i]);
    if (!amsgrad) st.max_exp_avg_sq = Tensor();
  }
}

// ---------------------------------------------------------------- state

std::vector<std::string> AdamBase::state_names() const {
  return {"step", "exp_avg", "exp_avg_sq", "max_exp_avg_sq"};
}

TensorDict AdamBase::state(size_t index) const {
  MG_CHECK(index < state_.size(), "{}::state: index {} out of range for {} parameters", name(),
           index, state_.size());
  const ParamState& st = state_[index];
  if (!st.step.defined()) return {};
  TensorDict out{{"step", st.step}, {"exp_avg", st.exp_avg}, {"exp_avg_sq", st.exp_avg_sq}};
  if (st.max_exp_avg_sq.defined()) out.emplace("max_exp_avg_sq", st.max_exp_avg_sq);
  return out;
}

void AdamBase::check_param_state(size_t index, const TensorDict& state,
                                 const std::function<std::string(const std::string&)>& key,
                                 std::vector<std::string>& problems) const {
  const bool amsgrad = hyper(param_group_of(index)).amsgrad;
  for (const char* name : {"step", "exp_avg", "exp_avg_sq"})
    if (state.count(name) == 0)
      problems.push_back(fmt::format("'{}' is missing (a parameter's state is all of step, "
                                     "exp_avg, exp_avg_sq{} or none)",
                                     key(name), amsgrad ? ", max_exp_avg_sq" : ""));
  if (amsgrad && state.count("max_exp_avg_sq") == 0)
    problems.push_back(fmt::format("'{}' is missing (amsgrad is on)", key("max_exp_avg_sq")));
  if (!amsgrad && state.count("max_exp_avg_sq") != 0)
    problems.push_back(fmt::format("'{}' is given, but amsgrad is off", key("max_exp_avg_sq")));

  for (const auto& [name, tensor] : state) {
    if (name != "step") {
      check_like_param(index, key(name), tensor, problems);
      continue;
    }
    // A step count: a whole number >= 1 in an int64 scalar, or in a float32 one as
    // PyTorch keeps it.
    if (!tensor.defined() || tensor.numel() != 1 ||
        (tensor.dtype() != DType::Int64 && tensor.dtype() != DType::Float32)) {
      problems.push_back(fmt::format(
          "'{}' must be one int64 (or float32) step count, got {}", key(name),
          tensor.defined() ? fmt::format("shape {} ({})", tensor.shape(), tensor.dtype())
                           : std::string("an undefined tensor")));
      continue;
    }
    const double count = tensor.dtype() == DType::Int64
                             ? static_cast<double>(tensor.item<int64_t>())
                             : static_cast<double>(tensor.item<float>());
    // Past 2^53 the count would not be exact in the double of the bias correction.
    if (!(count >= 1.0 && count <= 9007199254740992.0 && count == std::floor(count)))
      problems.push_back(
          fmt::format("'{}' is {}, but a step count is a whole number >= 1", key(name), count));
  }
}

void AdamBase::set_param_state(size_t index, const TensorDict& state) {
  ParamState st;
  if (!state.empty()) {
    const Device device = parameters()[index].device();
    const Tensor& step = state.at("step");
    st.step = zeros(Shape{}, DType::Int64);
    *st.step.data<int64_t>() = step.dtype() == DType::Int64
                                    ? step.item<int64_t>()
                                    : static_cast<int64_t>(step.item<float>());
    st.exp_avg = ops::copy_to(state.at("exp_avg"), device);
    st.exp_avg_sq = ops::copy_to(state.at("exp_avg_sq"), device);
    const auto max = state.find("max_exp_avg_sq");
    if (max != state.end()) st.max_exp_avg_sq = ops::copy_to(max->second, device);
  }
  state_[index] = std::move(st);
}

// ---------------------------------------------------------------- Adam, AdamW

Adam::Adam(std::vector<Tensor> params, AdamOptions options)
    : AdamBase(std::vector<std::vector<Tensor>>{std::move(params)}, "Adam"),  // one group
      group_options_{options} {
  options.validate("Adam");
}

Adam::Adam(std::vector<ParamGroup<AdamOptions>> groups, AdamOptions defaults)
    : AdamBase(group_params(groups), "Adam"), group_options_(group_options(groups, defaults)) {
  for (const AdamOptions& o : group_options_) o.validate("Adam");
}

const AdamOptions& Adam::options(size_t group) const {
  check_param_group("options", group);
  return group_options_[group];
}

void Adam::set_options(AdamOptions options) {
  options.validate("Adam");
  for (AdamOptions& o : group_options_) o = options;
  sync_amsgrad_state();
}

void Adam::set_group_options(size_t group, AdamOptions options) {
  check_param_group("set_group_options", group);
  options.validate("Adam");
  group_options_[group] = options;
  sync_amsgrad_state();
}

void Adam::set_lr(double lr) {
  for (size_t g = 0; g < group_options_.size(); ++g) set_group_lr(g, lr);
}

void Adam::set_group_lr(size_t group, double lr) {
  check_param_group("set_group_lr", group);
  AdamOptions options = Adam::options(group);
  set_group_options(group, options.lr(lr));
}

std::unique_ptr<Optimizer> Adam::make_like(std::vector<Tensor> params) const {
  MG_CHECK(group_options_.size() == 1,
           "Adam::make_like: builds an optimizer of one group's options, but this one has {} "
           "groups", group_options_.size());
  return std::make_unique<Adam>(std::move(params), group_options_[0]);
}

AdamBase::Hyper Adam::hyper(size_t group) const {
  const AdamOptions& o = group_options_[group];
  return Hyper{o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(),
               o.weight_decay(), false, o.amsgrad(), o.maximize()};
}

AdamW::AdamW(std::vector<Tensor> params, AdamWOptions options)
    : AdamBase(std::vector<std::vector<Tensor>>{std::move(params)}, "AdamW"),  // one group
      group_options_{options} {
  options.validate("AdamW");
}

AdamW::AdamW(std::vector<ParamGroup<AdamWOptions>> groups, AdamWOptions defaults)
    : AdamBase(group_params(groups), "AdamW"), group_options_(group_options(groups, defaults)) {
  for (const AdamWOptions& o : group_options_) o.validate("AdamW");
}

const AdamWOptions& AdamW::options(size_t group) const {
  check_param_group("options", group);
  return group_options_[group];
}

void AdamW::set_options(AdamWOptions options) {
  options.validate("AdamW");
  for (AdamWOptions& o : group_options_) o = options;
  sync_amsgrad_state();
}

void AdamW::set_group_options(size_t group, AdamWOptions options) {
  check_param_group("set_group_options", group);
  options.validate("AdamW");
  group_options_[group] = options;
  sync_amsgrad_state();
}

void AdamW::set_lr(double lr) {
  for (size_t g = 0; g < group_options_.size(); ++g) set_group_lr(g, lr);
}

void AdamW::set_group_lr(size_t group, double lr) {
  check_param_group("set_group_lr", group);
  AdamWOptions options = AdamW::options(group);
  set_group_options(group, options.lr(lr));
}

std::unique_ptr<Optimizer> AdamW::make_like(std::vector<Tensor> params) const {
  MG_CHECK(group_options_.size() == 1,
           "AdamW::make_like: builds an optimizer of one group's options, but this one has {} "
           "groups", group_options_.size());
  return std::make_unique<AdamW>(std::move(params), group_options_[0]);
}

AdamBase::Hyper AdamW::hyper(size_t group) const {
  const AdamWOptions& o = group_options_[group];
  return Hyper{o.lr(), std::get<0>(o.betas()), std::get<1>(o.betas()), o.eps(),
               o.weight_decay(), true, o.amsgrad(), o.maximize()};
}

std::vector<ParamGroup<AdamWOptions>> weight_decay_groups(const std::vector<Tensor>& params,
                                                          const AdamWOptions& options) {
  std::vector<Tensor> decay, no_decay;
  for (const Tensor& p : params) (p.dim() >= 2 ? decay : no_decay).push_back(p);
  AdamWOptions without = options;
  without.weight_decay(0.0);
  return {ParamGroup<AdamWOptions>(std::move(decay), options),
          ParamGroup<AdamWOptions>(std::move(no_decay), without)};
}

}  // namespace mg::optim
