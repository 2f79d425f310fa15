// optim::Adam and optim::AdamW, following torch.optim.Adam and torch.optim.AdamW (1.13+)
// step for step. Per parameter, at its step t (counted from 1):
//
//   g     = maximize ? -grad : grad
//   p     = p * (1 - lr * weight_decay)           AdamW: decoupled weight decay
//   g     = g + weight_decay * p                  Adam: L2 penalty in the gradient
//   m     = beta1 * m + (1 - beta1) * g           first moment  ("exp_avg")
//   v     = beta2 * v + (1 - beta2) * g * g       second moment ("exp_avg_sq")
//   vmax  = max(vmax, v)                          amsgrad ("max_exp_avg_sq")
//   p     = p - lr / (1 - beta1^t) * m / (sqrt(amsgrad ? vmax : v) / sqrt(1 - beta2^t) + eps)
//
// eps is added after the square root of the bias-corrected second moment, as PyTorch
// does (not inside it). m, v and vmax start at zero.
//
// step() updates every parameter of a device in one fused call (Backend::adam_step: one
// pass per tensor on the CPU, one multi-tensor kernel launch per group of tensors on
// CUDA), rounding as PyTorch's in-place ops mul_, add_, addcmul_, sqrt, div and
// addcdiv_ do one after another, so the results are those of that composition bit for
// bit (core/backend.h's AdamStep). A parameter or gradient that is not contiguous is
// updated through contiguous copies, with the same bits.
//
// The step count is host state (bias corrections are computed on the host), so a step
// inside a CUDA graph capture is refused: every replay would repeat one step's
// corrections.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <tuple>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/nn/optim/optimizer.h>

namespace mg::optim {

namespace detail {

// The options Adam and AdamW share, with chained setters that return the derived type:
// AdamOptions(1e-3).betas({0.9, 0.98}).eps(1e-8).weight_decay(0).amsgrad(false).
template <typename Self>
class AdamOptionsBase {
 public:
  Self& lr(double v) { lr_ = v; return self(); }
  Self& betas(const std::tuple<double, double>& v) { betas_ = v; return self(); }
  Self& eps(double v) { eps_ = v; return self(); }
  Self& weight_decay(double v) { weight_decay_ = v; return self(); }
  Self& amsgrad(bool v) { amsgrad_ = v; return self(); }
  Self& maximize(bool v) { maximize_ = v; return self(); }

  double lr() const { return lr_; }
  const std::tuple<double, double>& betas() const { return betas_; }
  double eps() const { return eps_; }
  double weight_decay() const { return weight_decay_; }
  bool amsgrad() const { return amsgrad_; }
  bool maximize() const { return maximize_; }

  // mg::Error (named `optimizer`) unless lr, eps and weight_decay are >= 0 and both betas
  // in [0, 1), all finite: PyTorch's rules.
  void validate(const char* optimizer) const;

 protected:
  AdamOptionsBase(double lr, double weight_decay) : lr_(lr), weight_decay_(weight_decay) {}

 private:
  Self& self() { return static_cast<Self&>(*this); }
  double lr_;
  std::tuple<double, double> betas_{0.9, 0.999};
  double eps_ = 1e-8;
  double weight_decay_;
  bool amsgrad_ = false;
  bool maximize_ = false;
};

}  // namespace detail

// torch.optim.Adam's defaults: lr 1e-3, betas (0.9, 0.999), eps 1e-8, weight_decay 0.
class AdamOptions : public detail::AdamOptionsBase<AdamOptions> {
 public:
  AdamOptions(double lr = 1e-3)  // NOLINT: implicit, as SGDOptions
      : AdamOptionsBase(lr, 0.0) {}
};

// torch.optim.AdamW's defaults: as Adam's, but weight_decay 1e-2.
class AdamWOptions : public detail::AdamOptionsBase<AdamWOptions> {
 public:
  AdamWOptions(double lr = 1e-3)  // NOLINT: implicit, as SGDOptions
      : AdamOptionsBase(lr, 1e-2) {}
};

// The state and the step Adam and AdamW share; they differ only in how weight decay
// enters the update.
class AdamBase : public Optimizer {
 public:
  void step() override;

  // Parameter `index`'s state, undefined before its first step (max_exp_avg_sq also
  // without amsgrad); its step count, 0 before the first.
  const Tensor& exp_avg(size_t index) const;
  const Tensor& exp_avg_sq(size_t index) const;
  const Tensor& max_exp_avg_sq(size_t index) const;
  int64_t step_count(size_t index) const;

  // ---- state (see Optimizer) ----
  // "step" (an int64 scalar tensor on the CPU, as PyTorch keeps its float32 one on the
  // CPU), "exp_avg", "exp_avg_sq" and, with amsgrad, "max_exp_avg_sq" (on the
  // parameter's device). A state is all of them or none; a "step" may also be a float32
  // scalar holding a whole number (a state converted from PyTorch).
  std::vector<std::string> state_names() const override;
  TensorDict state(size_t index) const override;

 protected:
  struct Hyper {
    double lr, beta1, beta2, eps, weight_decay;
    bool decoupled, amsgrad, maximize;
  };
  AdamBase(std::vector<std::vector<Tensor>> groups, const char* name);
  // Group `group`'s hyperparameters.
  virtual Hyper hyper(size_t group) const = 0;
  // After an options change: amsgrad turned on starts max_exp_avg_sq at zero for the
  // parameters that have state; turned off, drops it.
  void sync_amsgrad_state();

  void check_param_state(size_t index, const TensorDict& state,
                         const std::function<std::string(const std::string&)>& key,
                         std::vector<std::string>& problems) const override;
  void set_param_state(size_t index, const TensorDict& state) override;

 private:
  struct ParamState {
    Tensor step;  // int64 scalar on the CPU; undefined before the first step
    Tensor exp_avg, exp_avg_sq, max_exp_avg_sq;
  };
  std::vector<ParamState> state_;
};

class Adam : public AdamBase {
 public:
  Adam(std::vector<Tensor> params, AdamOptions options = {});
  // Parameter groups, each with its own options or `defaults` (see Optimizer).
  Adam(std::vector<ParamGroup<AdamOptions>> groups, AdamOptions defaults = {});

  // A group's options (the first group's by default).
  const AdamOptions& options(size_t group = 0) const;
  // Changes options between steps (a schedule); validated as at construction. Turning
  // amsgrad on starts max_exp_avg_sq from zero; turning it off drops it. set_options sets
  // every group's; set_group_options one group's.
  void set_options(AdamOptions options);
  void set_group_options(size_t group, AdamOptions options);
  double lr() const override { return options().lr(); }
  void set_lr(double lr) override;
  double group_lr(size_t group) const override { return options(group).lr(); }
  void set_group_lr(size_t group, double lr) override;
  std::unique_ptr<Optimizer> make_like(std::vector<Tensor> params) const override;

 protected:
  Hyper hyper(size_t group) const override;

 private:
  std::vector<AdamOptions> group_options_;
};

class AdamW : public AdamBase {
 public:
  AdamW(std::vector<Tensor> params, AdamWOptions options = {});
  // Parameter groups, each with its own options or `defaults` (see Optimizer).
  AdamW(std::vector<ParamGroup<AdamWOptions>> groups, AdamWOptions defaults = {});

  // A group's options (the first group's by default).
  const AdamWOptions& options(size_t group = 0) const;
  void set_options(AdamWOptions options);
  void set_group_options(size_t group, AdamWOptions options);
  double lr() const override { return options().lr(); }
  void set_lr(double lr) override;
  double group_lr(size_t group) const override { return options(group).lr(); }
  void set_group_lr(size_t group, double lr) override;
  std::unique_ptr<Optimizer> make_like(std::vector<Tensor> params) const override;

 protected:
  Hyper hyper(size_t group) const override;

 private:
  std::vector<AdamWOptions> group_options_;
};

// nanoGPT's configure_optimizers: two groups of `params`, those of 2 or more dimensions
// (the matmul and embedding weights) with `options` as given, the others (biases,
// LayerNorm's scales) with weight_decay 0. Either group may be empty.
std::vector<ParamGroup<AdamWOptions>> weight_decay_groups(const std::vector<Tensor>& params,
                                                          const AdamWOptions& options);

}  // namespace mg::optim
