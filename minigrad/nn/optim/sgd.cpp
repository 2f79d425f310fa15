#include <minigrad/nn/optim/sgd.h>

#include <algorithm>
#include <cmath>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/profiler.h>

namespace mg::optim {

void SGDOptions::validate() const {
  // isfinite() refuses NaN and infinities, which would silently poison every parameter.
  MG_CHECK(std::isfinite(lr_) && lr_ >= 0.0, "SGD: invalid learning rate: {} (must be >= 0)",
           lr_);
  MG_CHECK(std::isfinite(momentum_) && momentum_ >= 0.0,
           "SGD: invalid momentum value: {} (must be >= 0)", momentum_);
  MG_CHECK(std::isfinite(dampening_), "SGD: invalid dampening value: {}", dampening_);
  MG_CHECK(std::isfinite(weight_decay_) && weight_decay_ >= 0.0,
           "SGD: invalid weight_decay value: {} (must be >= 0)", weight_decay_);
  MG_CHECK(!nesterov_ || (momentum_ > 0.0 && dampening_ == 0.0),
           "SGD: Nesterov momentum requires a momentum > 0 and zero dampening (got momentum={}, "
           "dampening={})",
           momentum_, dampening_);
}

SGD::SGD(std::vector<Tensor> params, SGDOptions options)
    : Optimizer(std::move(params), "SGD"), group_options_{options} {
  options.validate();
  momentum_buffers_.resize(parameters().size());
}

SGD::SGD(std::vector<ParamGroup<SGDOptions>> groups, SGDOptions defaults)
    : Optimizer(group_params(groups), "SGD"), group_options_(group_options(groups, defaults)) {
  for (const SGDOptions& o : group_options_) o.validate();
  momentum_buffers_.resize(parameters().size());
}

const SGDOptions& SGD::options(size_t group) const {
  check_param_group("options", group);
  return group_options_[group];
}

void SGD::set_options(SGDOptions options) {
  options.validate();
  for (SGDOptions& o : group_options_) o = options;
}

void SGD::set_group_options(size_t group, SGDOptions options) {
  check_param_group("set_group_options", group);
  options.validate();
  group_options_[group] = options;
}

void SGD::set_lr(double lr) {
  for (size_t g = 0; g < group_options_.size(); ++g) set_group_lr(g, lr);
}

void SGD::set_group_lr(size_t group, double lr) {
  check_param_group("set_group_lr", group);
  SGDOptions options = SGD::options(group);
  set_group_options(group, options.lr(lr));
}

std::unique_ptr<Optimizer> SGD::make_like(std::vector<Tensor> params) const {
  MG_CHECK(group_options_.size() == 1,
           "SGD::make_like: builds an optimizer of one group's options, but this one has {} "
           "groups", group_options_.size());
  return std::make_unique<SGD>(std::move(params), group_options_[0]);
}

namespace {

// Whether a parameter's update can go to Backend::sgd_step: float32 contiguous tensors
// of one shape on one device (a gradient that is a contiguous view into a bucket
// qualifies). Anything else keeps the per-tensor ops, which handle views and report
// mismatches.
bool fits_fused_step(const Tensor& p, const Tensor& grad, const Tensor& buf) {
  const auto fits = [&](const Tensor& t) {
    return t.dtype() == DType::Float32 && t.is_contiguous() && t.shape() == p.shape() &&
           t.device() == p.device();
  };
  return fits(p) && fits(grad) && (!buf.defined() || fits(buf));
}

}  // namespace

void SGD::step() {
  NoGradGuard no_grad;
  profiler::Span span(parameters().empty() ? Device::cpu() : parameters()[0].device(),
                      "{}.step", name());
  span.category("optimizer");
  // One fused update per group and device, over every parameter there that fits it.
  struct DeviceStep {
    size_t group;
    Device device;
    SgdStep step;
    std::vector<size_t> new_buffer_indices;  // kept once the step has written them
  };
  std::vector<DeviceStep> steps;
  for (size_t i = 0; i < parameters().size(); ++i) {
    const size_t g = param_group_of(i);
    const SGDOptions& options = group_options_[g];
    const bool use_momentum = options.momentum() != 0.0;
    const Tensor& p = parameters()[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const Tensor& buf = momentum_buffers_[i];
    if (!fits_fused_step(p, grad, use_momentum ? buf : Tensor())) {
      step_unfused(i);
      continue;
    }
    auto group = std::find_if(steps.begin(), steps.end(), [&](const DeviceStep& s) {
      return s.group == g && s.device == p.device();
    });
    if (group == steps.end()) {
      DeviceStep s{g, p.device(), SgdStep{}, {}};
      s.step.lr = options.lr();
      s.step.momentum = options.momentum();
      s.step.dampening = options.dampening();
      s.step.weight_decay = options.weight_decay();
      s.step.nesterov = options.nesterov();
      steps.push_back(std::move(s));
      group = steps.end() - 1;
    }
    SgdTensor t{p, grad, Tensor(), false};
    if (use_momentum) {
      t.new_buffer = !buf.defined();
      // The first step writes d_p into it without reading it.
      t.momentum_buffer = t.new_buffer ? empty(p.shape(), DType::Float32, p.device()) : buf;
      if (t.new_buffer) group->new_buffer_indices.push_back(i);
    }
    group->step.tensors.push_back(std::move(t));
  }

  for (DeviceStep& s : steps) {
    backend(s.device).sgd_step(s.step);
    // The fused step wrote the parameters and buffers through the backend: count it as
    // the in-place update it is, as add_ and mul_ would have.
    for (const SgdTensor& t : s.step.tensors) {
      bump_version(t.param, "SGD::step");
      if (t.momentum_buffer.defined()) bump_version(t.momentum_buffer, "SGD::step");
    }
    // Buffers become state only once written, so a failed step leaves none half made.
    size_t next = 0;
    for (const SgdTensor& t : s.step.tensors)
      if (t.new_buffer) momentum_buffers_[s.new_buffer_indices[next++]] = t.momentum_buffer;
  }
}

// The update of parameter i as in-place tensor ops: the reference the fused step
// reproduces, kept for parameters it does not take (non-contiguous, views).
void SGD::step_unfused(size_t i) {
  const SGDOptions& options = group_options_[param_group_of(i)];
  const double lr = options.lr();
  const double momentum = options.momentum();
  const double dampening = options.dampening();
  const double weight_decay = options.weight_decay();
  const bool nesterov = options.nesterov();

  Tensor p = parameters()[i];  // a handle: updates land in the parameter
  const Tensor grad = p.grad();

  // d_p = g + weight_decay * p, into a new tensor: the gradient itself stays as it is.
  Tensor d_p = grad;
  if (weight_decay != 0.0) d_p = ops::clone(grad).add_(p, weight_decay);

  if (momentum != 0.0) {
    Tensor& buf = momentum_buffers_[i];
    if (!buf.defined()) {
      buf = ops::clone(d_p);  // the first step starts the average at d_p itself
    } else {
      buf.mul_(momentum).add_(d_p, 1.0 - dampening);
    }
    if (nesterov) {
      // d_p + momentum * buf, out of place when d_p is still the gradient.
      if (d_p.is_same(grad)) d_p = ops::clone(grad);
      d_p.add_(buf, momentum);
    } else {
      d_p = buf;
    }
  }

  p.add_(d_p, -lr);
}

const Tensor& SGD::momentum_buffer(size_t index) const {
  MG_CHECK(index < momentum_buffers_.size(), "SGD::momentum_buffer: index {} out of range for {} "
           "parameters", index, momentum_buffers_.size());
  return momentum_buffers_[index];
}

// ---------------------------------------------------------------- state

TensorDict SGD::state(size_t index) const {
  const Tensor& buf = momentum_buffer(index);
  if (!buf.defined()) return {};
  return {{"momentum_buffer", buf}};
}

void SGD::check_param_state(size_t index, const TensorDict& state,
                            const std::function<std::string(const std::string&)>& key,
                            std::vector<std::string>& problems) const {
  for (const auto& [name, tensor] : state) check_like_param(index, key(name), tensor, problems);
}

void SGD::set_param_state(size_t index, const TensorDict& state) {
  const auto found = state.find("momentum_buffer");
  momentum_buffers_[index] = found == state.end()
                                 ? Tensor()
                                 : ops::copy_to(found->second, parameters()[index].device());
}

}  // namespace mg::optim
