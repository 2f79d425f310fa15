// optim::SGD: stochastic gradient descent with momentum, dampening, weight decay and
// Nesterov momentum, following torch.optim.SGD's update rule step for step:
//
//   d_p = g + weight_decay * p                         (when weight_decay != 0)
//   buf = d_p                                          (first step: a copy)
//   buf = momentum * buf + (1 - dampening) * d_p       (later steps)
//   d_p = nesterov ? d_p + momentum * buf : buf        (when momentum != 0)
//   p   = p - lr * d_p
//
// step() updates every parameter of a device in one fused call (Backend::sgd_step: one
// pass per tensor on the CPU, one multi-tensor kernel launch on CUDA), rounding as the
// in-place ops add_ and mul_ do, so the results are those of the per-tensor ops bit for
// bit. Parameters or gradients that are not float32-contiguous (views with strides)
// take those ops (mul_, add_) one tensor at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/nn/optim/optimizer.h>

namespace mg::optim {

// Options in torch.optim.SGD's order, so SGDOptions{0.1, 0.9} reads as lr=0.1,
// momentum=0.9; or chained as in libtorch: SGDOptions(0.1).momentum(0.9).nesterov(true).
class SGDOptions {
 public:
  SGDOptions(double lr, double momentum = 0.0, double dampening = 0.0,  // NOLINT: implicit
             double weight_decay = 0.0, bool nesterov = false)
      : lr_(lr),
        momentum_(momentum),
        dampening_(dampening),
        weight_decay_(weight_decay),
        nesterov_(nesterov) {}

  SGDOptions& lr(double v) { lr_ = v; return *this; }
  SGDOptions& momentum(double v) { momentum_ = v; return *this; }
  SGDOptions& dampening(double v) { dampening_ = v; return *this; }
  SGDOptions& weight_decay(double v) { weight_decay_ = v; return *this; }
  SGDOptions& nesterov(bool v) { nesterov_ = v; return *this; }

  double lr() const { return lr_; }
  double momentum() const { return momentum_; }
  double dampening() const { return dampening_; }
  double weight_decay() const { return weight_decay_; }
  bool nesterov() const { return nesterov_; }

  // mg::Error unless lr, momentum and weight_decay are >= 0 (and finite), and, with
  // nesterov, momentum > 0 and dampening == 0 (PyTorch's rules).
  void validate() const;

 private:
  double lr_, momentum_, dampening_, weight_decay_;
  bool nesterov_;
};

class SGD : public Optimizer {
 public:
  // `params` are leaf tensors (Module::parameters()); SGD keeps handles to them and
  // updates them in place, so the module sees the new values.
  SGD(std::vector<Tensor> params, SGDOptions options);
  // Parameter groups, each with its own options or `defaults` (see Optimizer).
  SGD(std::vector<ParamGroup<SGDOptions>> groups, SGDOptions defaults);

  // One update of every parameter that has a gradient; parameters without one are
  // skipped (and their momentum buffers left as they are), as in PyTorch.
  void step() override;

  // A group's options (the first group's by default).
  const SGDOptions& options(size_t group = 0) const;
  // Changes options between steps (a learning-rate schedule); validated as at
  // construction. set_options sets every group's; set_group_options one group's.
  void set_options(SGDOptions options);
  void set_group_options(size_t group, SGDOptions options);
  double lr() const override { return options().lr(); }
  void set_lr(double lr) override;
  double group_lr(size_t group) const override { return options(group).lr(); }
  void set_group_lr(size_t group, double lr) override;
  std::unique_ptr<Optimizer> make_like(std::vector<Tensor> params) const override;

  // The momentum buffer of parameter `index`, undefined before its first step with
  // momentum.
  const Tensor& momentum_buffer(size_t index) const;

  // ---- state (see Optimizer) ----
  // "momentum_buffer" (PyTorch's state[p]["momentum_buffer"]); in state_dict() as
  // "momentum_buffer.<i>" for every parameter i that has one. Parameters without an
  // entry get no buffer on load, as after construction.
  std::vector<std::string> state_names() const override { return {"momentum_buffer"}; }
  TensorDict state(size_t index) const override;

 protected:
  void check_param_state(size_t index, const TensorDict& state,
                         const std::function<std::string(const std::string&)>& key,
                         std::vector<std::string>& problems) const override;
  void set_param_state(size_t index, const TensorDict& state) override;

 private:
  void step_unfused(size_t index);

  std::vector<Tensor> momentum_buffers_;  // one per parameter; undefined until first used
  std::vector<SGDOptions> group_options_;
};

}  // namespace mg::optim
