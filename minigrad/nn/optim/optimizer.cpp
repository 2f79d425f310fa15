#include <minigrad/nn/optim/optimizer.h>

#include <algorithm>

#include <minigrad/autograd/grad_mode.h>

namespace mg::optim {

Optimizer::Optimizer(std::vector<Tensor> params, std::string name)
    : Optimizer(std::vector<std::vector<Tensor>>{std::move(params)}, std::move(name)) {}

Optimizer::Optimizer(std::vector<std::vector<Tensor>> groups, std::string name)
    : name_(std::move(name)) {
  MG_CHECK(!groups.empty(), "{}: no parameter groups (an optimizer needs at least one)", name_);
  for (auto& group : groups) {
    group_begin_.push_back(params_.size());
    for (Tensor& p : group) params_.push_back(std::move(p));
  }
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.defined(), "{}: parameter {} is an undefined tensor", name_, i);
    MG_CHECK(p.is_leaf(),
             "{}: can't optimize a non-leaf tensor (parameter {}, shape {}); pass the "
             "module's parameters, not results of ops on them",
             name_, i, p.shape());
    MG_CHECK(is_floating_point(p.dtype()),
             "{}: parameter {} (shape {}) is {}, expected a floating-point tensor", name_, i,
             p.shape(), p.dtype());
    for (size_t j = 0; j < i; ++j)
      MG_CHECK(!params_[j].is_same(p),
               "{}: parameter {} is the same tensor as parameter {}; each would be updated "
               "twice per step",
               name_, i, j);
  }
}

void Optimizer::zero_grad(bool set_to_none) { zero_grads(params_, set_to_none); }

// ---------------------------------------------------------------- groups

void Optimizer::check_param_group(const char* method, size_t group) const {
  MG_CHECK(group < group_begin_.size(), "{}::{}: group {} out of range for {} parameter group{}",
           name_, method, group, group_begin_.size(), group_begin_.size() == 1 ? "" : "s");
}

size_t Optimizer::param_group_begin(size_t group) const {
  check_param_group("param_group_begin", group);
  return group_begin_[group];
}

size_t Optimizer::param_group_end(size_t group) const {
  check_param_group("param_group_end", group);
  return group + 1 < group_begin_.size() ? group_begin_[group + 1] : params_.size();
}

size_t Optimizer::param_group_of(size_t index) const {
  MG_CHECK(index < params_.size(), "{}::param_group_of: index {} out of range for {} parameters", name_,
           index, params_.size());
  // The last group that begins at or before `index` (empty groups begin where the next does).
  const auto after = std::upper_bound(group_begin_.begin(), group_begin_.end(), index);
  return static_cast<size_t>(after - group_begin_.begin()) - 1;
}

double Optimizer::group_lr(size_t group) const {
  check_param_group("group_lr", group);
  return lr();
}

void Optimizer::set_group_lr(size_t group, double lr) {
  check_param_group("set_group_lr", group);
  MG_CHECK(group_begin_.size() == 1,
           "{}::set_group_lr: this optimizer keeps one learning rate for its {} groups", name_,
           group_begin_.size());
  set_lr(lr);
}

void Optimizer::zero_grads(const std::vector<Tensor>& tensors, bool set_to_none) {
  NoGradGuard no_grad;
  for (const Tensor& p : tensors) {
    Tensor g = p.grad();
    if (!g.defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      g.zero_();
    }
  }
}

// ---------------------------------------------------------------- state

namespace {

std::string state_key(const std::string& name, size_t index) {
  return name + "." + std::to_string(index);
}

// The (name, parameter index) of a "<name>.<i>" key, with `name` one of `names`; false
// if the key is not one (also for "exp_avg.01", which state_dict() never writes).
bool parse_state_key(const std::string& key, const std::vector<std::string>& names,
                     std::string& name, size_t& index) {
  const size_t dot = key.rfind('.');
  if (dot == std::string::npos || dot + 1 == key.size()) return false;
  name = key.substr(0, dot);
  if (std::find(names.begin(), names.end(), name) == names.end()) return false;
  const size_t digits = key.size() - dot - 1;
  if (digits > 1 && key[dot + 1] == '0') return false;
  if (digits > 12) return false;  // no optimizer has 10^12 parameters; keeps `index` exact
  index = 0;
  for (size_t c = dot + 1; c < key.size(); ++c) {
    if (key[c] < '0' || key[c] > '9') return false;
    index = index * 10 + static_cast<size_t>(key[c] - '0');
  }
  return true;
}

}  // namespace

void Optimizer::check_like_param(size_t index, const std::string& key, const Tensor& t,
                                 std::vector<std::string>& problems) const {
  const Tensor& p = params_[index];
  if (!t.defined()) {
    problems.push_back(fmt::format("'{}' is an undefined tensor", key));
  } else if (t.shape() != p.shape() || t.dtype() != p.dtype()) {
    problems.push_back(fmt::format("'{}' has shape {} ({}), but parameter {} has shape {} ({})",
                                   key, t.shape(), t.dtype(), index, p.shape(), p.dtype()));
  }
}

void Optimizer::fail(const char* method, const std::string& source,
                     const std::vector<std::string>& problems) const {
  std::string list;
  for (const auto& s : problems) list += "\n  " + s;
  MG_FAIL("{}::{}: {} does not fit this optimizer ({} problem{}):{}", name_, method, source,
          problems.size(), problems.size() == 1 ? "" : "s", list);
}

void Optimizer::set_state(size_t index, const TensorDict& state, const std::string& source) {
  MG_CHECK(index < params_.size(), "{}::set_state: index {} out of range for {} parameters",
           name_, index, params_.size());
  if (!state.empty()) {
    std::vector<std::string> problems;
    const std::vector<std::string> names = state_names();
    TensorDict known;
    for (const auto& [name, tensor] : state) {
      if (std::find(names.begin(), names.end(), name) == names.end()) {
        problems.push_back(fmt::format("unexpected key '{}'", name));
      } else {
        known.emplace(name, tensor);
      }
    }
    check_param_state(index, known, [](const std::string& name) { return name; }, problems);
    if (!problems.empty()) fail("set_state", source, problems);
  }
  NoGradGuard no_grad;
  set_param_state(index, state);
}

TensorDict Optimizer::state_dict() const {
  TensorDict out;
  for (size_t i = 0; i < params_.size(); ++i)
    for (const auto& [name, tensor] : state(i)) out.emplace(state_key(name, i), tensor);
  return out;
}

void Optimizer::check_state_dict(const TensorDict& state, const std::string& source) const {
  std::vector<std::string> problems;
  const std::vector<std::string> names = state_names();
  std::map<size_t, TensorDict> per_param;
  for (const auto& [key, tensor] : state) {
    std::string name;
    size_t index = 0;
    if (!parse_state_key(key, names, name, index)) {
      problems.push_back(fmt::format("unexpected key '{}'", key));
    } else if (index >= params_.size()) {
      problems.push_back(fmt::format("'{}' is for parameter {}, but the optimizer has {}", key,
                                     index, params_.size()));
    } else {
      per_param[index].emplace(name, tensor);
    }
  }
  for (const auto& [index, entries] : per_param) {
    const size_t i = index;
    check_param_state(i, entries, [i](const std::string& name) { return state_key(name, i); },
                      problems);
  }
  if (!problems.empty()) fail("load_state_dict", source, problems);
}

void Optimizer::load_state_dict(const TensorDict& state, const std::string& source) {
  // Check everything before touching any state, so a bad checkpoint changes nothing.
  check_state_dict(state, source);
  const std::vector<std::string> names = state_names();
  std::vector<TensorDict> per_param(params_.size());
  for (const auto& [key, tensor] : state) {
    std::string name;
    size_t index = 0;
    parse_state_key(key, names, name, index);
    per_param[index].emplace(name, tensor);
  }
  NoGradGuard no_grad;
  for (size_t i = 0; i < params_.size(); ++i) set_param_state(i, per_param[i]);
}

}  // namespace mg::optim
