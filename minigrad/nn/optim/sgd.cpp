#include <minigrad/nn/optim/sgd.h>

#include <algorithm>
#include <cmath>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/ops.h>

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
    : params_(std::move(params)), options_(options) {
  options_.validate();
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.defined(), "SGD: parameter {} is an undefined tensor", i);
    MG_CHECK(p.is_leaf(),
             "SGD: can't optimize a non-leaf tensor (parameter {}, shape {}); pass the "
             "module's parameters, not results of ops on them",
             i, p.shape());
    MG_CHECK(p.dtype() == DType::Float32, "SGD: parameter {} (shape {}) is {}, expected float32",
             i, p.shape(), p.dtype());
    for (size_t j = 0; j < i; ++j)
      MG_CHECK(!params_[j].is_same(p),
               "SGD: parameter {} is the same tensor as parameter {}; each would be updated "
               "twice per step",
               i, j);
  }
  momentum_buffers_.resize(params_.size());
}

void SGD::set_options(SGDOptions options) {
  options.validate();
  options_ = options;
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
  const bool use_momentum = options_.momentum() != 0.0;

  // One fused update per device, over every parameter there that fits it.
  struct DeviceStep {
    Device device;
    SgdStep step;
    std::vector<size_t> new_buffer_indices;  // kept once the step has written them
  };
  std::vector<DeviceStep> steps;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    const Tensor grad = p.grad();
    if (!grad.defined()) continue;
    const Tensor& buf = momentum_buffers_[i];
    if (!fits_fused_step(p, grad, use_momentum ? buf : Tensor())) {
      step_unfused(i);
      continue;
    }
    auto group = std::find_if(steps.begin(), steps.end(),
                              [&](const DeviceStep& s) { return s.device == p.device(); });
    if (group == steps.end()) {
      DeviceStep s{p.device(), SgdStep{}, {}};
      s.step.lr = options_.lr();
      s.step.momentum = options_.momentum();
      s.step.dampening = options_.dampening();
      s.step.weight_decay = options_.weight_decay();
      s.step.nesterov = options_.nesterov();
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
  const double lr = options_.lr();
  const double momentum = options_.momentum();
  const double dampening = options_.dampening();
  const double weight_decay = options_.weight_decay();
  const bool nesterov = options_.nesterov();

  Tensor& p = params_[i];
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

void SGD::zero_grad(bool set_to_none) {
  NoGradGuard no_grad;
  for (Tensor& p : params_) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      g.zero_();
    }
  }
}

const Tensor& SGD::momentum_buffer(size_t index) const {
  MG_CHECK(index < momentum_buffers_.size(), "SGD::momentum_buffer: index {} out of range for {} "
           "parameters", index, momentum_buffers_.size());
  return momentum_buffers_[index];
}

// ---------------------------------------------------------------- checkpoints

namespace {
constexpr const char* kMomentumPrefix = "momentum_buffer.";

// The parameter index of a "momentum_buffer.<i>" key, or -1 if the key is not one.
int64_t momentum_index(const std::string& key) {
  const std::string prefix = kMomentumPrefix;
  if (key.compare(0, prefix.size(), prefix) != 0 || key.size() == prefix.size()) return -1;
  int64_t index = 0;
  for (size_t c = prefix.size(); c < key.size(); ++c) {
    if (key[c] < '0' || key[c] > '9' || index > (int64_t{1} << 40)) return -1;
    index = index * 10 + (key[c] - '0');
  }
  // "momentum_buffer.01" is not what state_dict() writes.
  if (key.size() - prefix.size() > 1 && key[prefix.size()] == '0') return -1;
  return index;
}
}  // namespace

std::map<std::string, Tensor> SGD::state_dict() const {
  std::map<std::string, Tensor> state;
  for (size_t i = 0; i < momentum_buffers_.size(); ++i)
    if (momentum_buffers_[i].defined())
      state.emplace(kMomentumPrefix + std::to_string(i), momentum_buffers_[i]);
  return state;
}

void SGD::check_state_dict(const std::map<std::string, Tensor>& state,
                           const std::string& source) const {
  std::vector<std::string> problems;
  for (const auto& [key, tensor] : state) {
    const int64_t index = momentum_index(key);
    if (index < 0) {
      problems.push_back(fmt::format("unexpected key '{}'", key));
      continue;
    }
    if (static_cast<size_t>(index) >= params_.size()) {
      problems.push_back(fmt::format("'{}' is for parameter {}, but the optimizer has {}", key,
                                     index, params_.size()));
      continue;
    }
    const Tensor& p = params_[static_cast<size_t>(index)];
    if (!tensor.defined()) {
      problems.push_back(fmt::format("'{}' is an undefined tensor", key));
    } else if (tensor.shape() != p.shape() || tensor.dtype() != p.dtype()) {
      problems.push_back(fmt::format("'{}' has shape {} ({}), but parameter {} has shape {} ({})",
                                     key, tensor.shape(), tensor.dtype(), index, p.shape(),
                                     p.dtype()));
    }
  }
  if (!problems.empty()) {
    std::string list;
    for (const auto& s : problems) list += "\n  " + s;
    MG_FAIL("SGD::load_state_dict: {} does not fit this optimizer ({} problem{}):{}", source,
            problems.size(), problems.size() == 1 ? "" : "s", list);
  }
}

void SGD::load_state_dict(const std::map<std::string, Tensor>& state, const std::string& source) {
  // Check everything before touching any buffer, so a bad checkpoint changes nothing.
  check_state_dict(state, source);

  // New buffers on each parameter's device; the saved tensors stay the caller's.
  NoGradGuard no_grad;
  std::vector<Tensor> buffers(params_.size());
  for (const auto& [key, tensor] : state) {
    const auto index = static_cast<size_t>(momentum_index(key));
    buffers[index] = ops::copy_to(tensor, params_[index].device());
  }
  momentum_buffers_ = std::move(buffers);
}

}  // namespace mg::optim
