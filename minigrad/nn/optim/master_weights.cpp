#include <minigrad/nn/optim/master_weights.h>

#include <utility>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::optim {

MasterWeights::Built MasterWeights::build(std::vector<Tensor> params, const OptimizerFactory& make) {
  MG_CHECK(make != nullptr, "MasterWeights: the optimizer factory is empty");
  std::vector<Tensor> masters;
  masters.reserve(params.size());
  for (size_t i = 0; i < params.size(); ++i) {
    const Tensor& p = params[i];
    MG_CHECK(p.defined() && is_floating_point(p.dtype()),
             "MasterWeights: parameter {} is {}; expected a floating-point tensor", i,
             p.defined() ? fmt::format("{} (shape {})", p.dtype(), p.shape()) : "undefined");
    NoGradGuard no_grad;
    // A copy of its own even for a float32 parameter: the masters are the optimizer's.
    Tensor master = p.dtype() == DType::Float32 ? ops::clone(p) : ops::to_dtype(p, DType::Float32);
    master.set_requires_grad(true);
    masters.push_back(master);
  }
  Built built;
  built.inner = make(masters);
  MG_CHECK(built.inner != nullptr, "MasterWeights: the optimizer factory returned no optimizer");
  const Optimizer& inner = *built.inner;
  // The inner optimizer's parameters must be the masters, each once, in any order.
  MG_CHECK(inner.parameters().size() == masters.size(),
           "MasterWeights: the optimizer has {} parameters, but there are {} masters (build it "
           "over the masters it is given)",
           inner.parameters().size(), masters.size());
  std::vector<bool> used(masters.size(), false);
  for (size_t g = 0; g < inner.param_group_count(); ++g) {
    std::vector<Tensor> group;
    for (size_t j = inner.param_group_begin(g); j < inner.param_group_end(g); ++j) {
      const Tensor& m = inner.parameters()[j];
      size_t k = 0;
      while (k < masters.size() && !masters[k].is_same(m)) ++k;
      MG_CHECK(k < masters.size() && !used[k],
               "MasterWeights: the optimizer's parameter {} is not one of the masters it was "
               "given (or it is there twice)",
               j);
      used[k] = true;
      group.push_back(m);
      built.model_params.push_back(params[k]);
    }
    built.groups.push_back(std::move(group));
  }
  built.name = "MasterWeights(" + inner.name() + ")";
  return built;
}

MasterWeights::MasterWeights(std::vector<Tensor> params, OptimizerFactory make,
                             MasterWeightsOptions options)
    : MasterWeights(build(std::move(params), make), make, options) {}

MasterWeights::MasterWeights(Built built, OptimizerFactory make, MasterWeightsOptions options)
    : Optimizer(std::move(built.groups), std::move(built.name)),
      model_params_(std::move(built.model_params)),
      inner_(std::move(built.inner)),
      make_(std::move(make)),
      options_(options),
      generator_(options.seed) {}

void MasterWeights::prepare_gradients() {
  std::vector<std::pair<const TensorImpl*, uint64_t>> now;
  now.reserve(model_params_.size());
  for (const Tensor& p : model_params_) {
    const Tensor g = p.grad();
    now.emplace_back(g.impl(), g.defined() ? g.version() : 0);
  }
  if (now == prepared_from_) return;  // converted already (unscale_, then step)
  NoGradGuard no_grad;
  for (size_t i = 0; i < model_params_.size(); ++i) {
    const Tensor g = model_params_[i].grad();
    const Tensor& master = parameters()[i];
    if (!g.defined()) {
      master.set_grad(Tensor());
      continue;
    }
    Tensor wide = g.dtype() == DType::Float32 ? ops::clone(g) : ops::to_dtype(g, DType::Float32);
    if (wide.device() != master.device()) wide = ops::copy_to(wide, master.device());
    master.set_grad(wide);
  }
  prepared_from_ = std::move(now);
}

void MasterWeights::step() {
  prepare_gradients();
  inner_->step();
  NoGradGuard no_grad;
  // Every master that stepped (it had a gradient) is rounded into its parameter.
  for (size_t i = 0; i < model_params_.size(); ++i) {
    const Tensor& master = parameters()[i];
    const Tensor& p = model_params_[i];
    if (!master.grad().defined()) continue;
    Tensor value;
    if (p.dtype() == DType::Float32 || p.dtype() == DType::Float64) {
      value = ops::to_dtype(master, p.dtype());
    } else if (options_.stochastic_rounding) {
      const auto draw = generator_.reserve((static_cast<uint64_t>(master.numel()) + 3) / 4);
      value = ops::round_stochastic(master, p.dtype(), draw.seed, draw.offset);
    } else {
      value = ops::to_dtype(master, p.dtype());  // nearest, ties to even
    }
    ops::copy_(p, value.device() == p.device() ? value : ops::copy_to(value, p.device()));
  }
  prepared_from_.clear();  // the next step converts the gradients anew
}

void MasterWeights::zero_grad(bool set_to_none) {
  zero_grads(parameters(), set_to_none);
  zero_grads(model_params_, set_to_none);
  prepared_from_.clear();
}

std::unique_ptr<Optimizer> MasterWeights::make_like(std::vector<Tensor> params) const {
  const Optimizer* inner = inner_.get();
  return std::make_unique<MasterWeights>(
      std::move(params), [inner](std::vector<Tensor> masters) { return inner->make_like(std::move(masters)); },
      options_);
}

std::vector<std::string> MasterWeights::state_names() const {
  std::vector<std::string> names{"master"};
  for (const std::string& n : inner_->state_names()) names.push_back(n);
  return names;
}

TensorDict MasterWeights::state(size_t index) const {
  TensorDict s = inner_->state(index);
  s["master"] = parameters().at(index);
  return s;
}

void MasterWeights::check_param_state(size_t index, const TensorDict& state,
                                      const std::function<std::string(const std::string&)>& key,
                                      std::vector<std::string>& problems) const {
  TensorDict rest;
  for (const auto& [name, tensor] : state) {
    if (name == "master") {
      check_like_param(index, key(name), tensor, problems);  // float32, the parameter's shape
    } else {
      rest[name + "." + std::to_string(index)] = tensor;
    }
  }
  if (state.count("master") == 0) problems.push_back(fmt::format("{}: missing", key("master")));
  if (rest.empty()) return;
  try {
    inner_->check_state_dict(rest, "the inner optimizer's state");
  } catch (const Error& e) {
    problems.push_back(e.what());
  }
}

void MasterWeights::set_param_state(size_t index, const TensorDict& state) {
  TensorDict rest = state;
  const auto master = rest.find("master");
  if (master != rest.end()) {
    NoGradGuard no_grad;
    const Tensor& m = parameters()[index];
    ops::copy_(m, master->second.device() == m.device() ? master->second
                                                        : ops::copy_to(master->second, m.device()));
    rest.erase(master);
  }
  inner_->set_state(index, rest, "MasterWeights state");
}

}  // namespace mg::optim
