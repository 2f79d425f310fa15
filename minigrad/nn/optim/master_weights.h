// optim::MasterWeights: 16-bit parameters trained through float32 master copies (llm.c's
// way, and the ZeRO paper's accounting: 2 bytes of bfloat16 parameter and 2 of gradient,
// 12 of float32 master and Adam moments per parameter).
//
// Why: a bfloat16 parameter near 1 is spaced 2^-8 from the next (2^-7 above 1, 2^-8
// below); an update smaller than half that is rounded away. With learning rates of 1e-3
// and below most updates are that small, so a model stepped in bfloat16 stops learning
// (tests/nn/master_weights_test.cpp shows it: 1e-3 steps on weights of 1 vanish). The
// master copy keeps every update in float32, and the 16-bit parameter is the master
// rounded after each step, for the next forward.
//
//   model->to(DType::BFloat16);
//   optim::MasterWeights opt(model->parameters(), [](std::vector<Tensor> masters) {
//     return std::make_unique<optim::AdamW>(masters, optim::AdamWOptions(1e-3));
//   });
//   loss.backward();   // bfloat16 gradients on the model's parameters
//   opt.step();        // float32 gradients -> AdamW on the masters -> parameters rounded
//
// parameters() are the float32 masters, and the optimizer `make` builds is over them (in
// any order and groups it likes: nanoGPT's decay / no-decay split works on masters as on
// parameters), so its state (Adam's moments, SGD's momentum) is float32. Each step converts
// the model's gradients into the masters' (prepare_gradients: exact, 16 bits into 32),
// steps, and writes every stepped master back into its parameter: rounded to nearest, or
// stochastically (MasterWeightsOptions::stochastic_rounding: unbiased, E[p] = master,
// with the option's seed; llm.c's choice). amp::GradScaler and clipping act on the
// masters' float32 gradients: GradScaler::unscale_ prepares them; call
// prepare_gradients() before clipping parameters() yourself.
//
// State: state_dict() holds "master.<i>" (float32) beside the inner optimizer's entries,
// so a checkpoint of model (16-bit) and optimizer resumes the masters exactly.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/generator.h>
#include <minigrad/core/tensor.h>
#include <minigrad/nn/optim/optimizer.h>

namespace mg::optim {

struct MasterWeightsOptions {
  bool stochastic_rounding = false;
  uint64_t seed = 0;  // of the stochastic rounding's generator
};

// Builds the optimizer over the float32 masters (given in the parameters' order).
using OptimizerFactory = std::function<std::unique_ptr<Optimizer>(std::vector<Tensor> masters)>;

class MasterWeights final : public Optimizer {
 public:
  // `params`: the model's parameters (16-bit, usually; leaves on any device).
  MasterWeights(std::vector<Tensor> params, OptimizerFactory make, MasterWeightsOptions options = {});

  void step() override;
  // The masters' gradients and the model's parameters' gradients.
  void zero_grad(bool set_to_none = true) override;
  // masters[i].grad = float32(model parameter i's gradient), when those gradients changed
  // since the last call (so that unscale_ and step, one after the other, convert once).
  void prepare_gradients() override;

  double lr() const override { return inner_->lr(); }
  void set_lr(double lr) override { inner_->set_lr(lr); }
  double group_lr(size_t group) const override { return inner_->group_lr(group); }
  void set_group_lr(size_t group, double lr) override { inner_->set_group_lr(group, lr); }
  std::unique_ptr<Optimizer> make_like(std::vector<Tensor> params) const override;

  // "master", then the inner optimizer's names.
  std::vector<std::string> state_names() const override;
  TensorDict state(size_t index) const override;

  Optimizer& inner() { return *inner_; }
  // The model's parameter that parameters()[index] (a master) stands for.
  const Tensor& model_parameter(size_t index) const { return model_params_.at(index); }

 protected:
  void check_param_state(size_t index, const TensorDict& state,
                         const std::function<std::string(const std::string&)>& key,
                         std::vector<std::string>& problems) const override;
  void set_param_state(size_t index, const TensorDict& state) override;

 private:
  struct Built {
    std::vector<std::vector<Tensor>> groups;  // the masters, in the inner optimizer's groups
    std::vector<Tensor> model_params;         // in the same order
    std::unique_ptr<Optimizer> inner;
    std::string name;
  };
  static Built build(std::vector<Tensor> params, const OptimizerFactory& make);
  MasterWeights(Built built, OptimizerFactory make, MasterWeightsOptions options);

  std::vector<Tensor> model_params_;
  std::unique_ptr<Optimizer> inner_;
  OptimizerFactory make_;
  MasterWeightsOptions options_;
  Generator generator_;
  // The model gradients prepare_gradients last converted, by identity and version.
  std::vector<std::pair<const TensorImpl*, uint64_t>> prepared_from_;
};

}  // namespace mg::optim
