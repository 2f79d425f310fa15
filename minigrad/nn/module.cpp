#include <minigrad/nn/module.h>

#include <algorithm>
#include <atomic>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/nn/checkpoint.h>
#include <minigrad/core/ops.h>

namespace mg::nn {
namespace {

NamedTensor* find(std::vector<NamedTensor>& entries, const std::string& name) {
  for (auto& e : entries)
    if (e.first == name) return &e;
  return nullptr;
}

uint64_t next_hook_id() {
  static std::atomic<uint64_t> next{1};
  return next.fetch_add(1, std::memory_order_relaxed);
}

}  // namespace

Tensor Module::operator()(const Tensor& input) {
  // A module set to checkpointing (nn/checkpoint.h) keeps only its input for backward.
  if (GradMode::is_enabled() && is_checkpointing(*this)) return checkpoint(*this, input);
  if (!has_forward_hooks()) return forward(input);
  return call_with_hooks(input, [this](const Tensor& x) { return forward(x); });
}

Tensor Module::forward_args(const TensorList& inputs) {
  MG_CHECK(inputs.size() == 1, "{}: forward takes one input, got {} (a module of several inputs overrides "
           "forward_args)", type_name_, inputs.size());
  return forward(inputs[0]);
}

Tensor Module::operator()(const TensorList& inputs) {
  MG_CHECK(!inputs.empty(), "{}: called with no inputs", type_name_);
  if (inputs.size() == 1) return (*this)(inputs[0]);
  // The first input goes through the hooks (and the checkpoint); the rest ride along.
  const TensorList rest(inputs.begin() + 1, inputs.end());
  const auto body = [this, rest](const Tensor& first) {
    TensorList all{first};
    all.insert(all.end(), rest.begin(), rest.end());
    return forward_args(all);
  };
  if (GradMode::is_enabled() && is_checkpointing(*this)) {
    for (size_t i = 0; i < rest.size(); ++i)
      MG_CHECK(!rest[i].requires_grad(), "{}: checkpointed with input {} requiring grad; only the first input's "
               "gradient flows through a checkpoint", type_name_, i + 1);
    return checkpoint([this, body](const Tensor& first) { return call_with_hooks(first, body); }, inputs[0]);
  }
  if (!has_forward_hooks()) return forward_args(inputs);
  return call_with_hooks(inputs[0], body);
}

Tensor Module::call_with_hooks(const Tensor& input,
                               const std::function<Tensor(const Tensor&)>& body) {
  Tensor x = input;
  for (const auto& [id, hook] : pre_hooks_) {
    Tensor replaced = hook(*this, x);
    if (replaced.defined()) x = std::move(replaced);
  }
  Tensor y = body(x);
  for (const auto& [id, hook] : post_hooks_) {
    Tensor replaced = hook(*this, x, y);
    if (replaced.defined()) y = std::move(replaced);
  }
  return y;
}

Module::HookHandle Module::register_forward_pre_hook(ForwardPreHook hook) {
  MG_CHECK(hook != nullptr, "register_forward_pre_hook: the hook of {} is empty", type_name_);
  const uint64_t id = next_hook_id();
  pre_hooks_.emplace_back(id, std::move(hook));
  return HookHandle{id};
}

Module::HookHandle Module::register_forward_hook(ForwardHook hook) {
  MG_CHECK(hook != nullptr, "register_forward_hook: the hook of {} is empty", type_name_);
  const uint64_t id = next_hook_id();
  post_hooks_.emplace_back(id, std::move(hook));
  return HookHandle{id};
}

void Module::remove_hook(HookHandle handle) {
  auto same = [&](const auto& entry) { return entry.first == handle.id; };
  pre_hooks_.erase(std::remove_if(pre_hooks_.begin(), pre_hooks_.end(), same), pre_hooks_.end());
  post_hooks_.erase(std::remove_if(post_hooks_.begin(), post_hooks_.end(), same),
                    post_hooks_.end());
}

Tensor& Module::register_parameter(const std::string& name, Tensor tensor, bool requires_grad) {
  MG_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "register_parameter: invalid name '{}' in {} (names are non-empty, without '.')", name,
           type_name_);
  MG_CHECK(find(parameters_, name) == nullptr && find(buffers_, name) == nullptr,
           "register_parameter: {} already has an entry named '{}'", type_name_, name);
  MG_CHECK(tensor.defined(), "register_parameter: '{}' in {} is an undefined tensor", name,
           type_name_);
  tensor.set_requires_grad(requires_grad);
  parameters_.emplace_back(name, std::move(tensor));
  return parameters_.back().second;
}

Tensor& Module::register_buffer(const std::string& name, Tensor tensor) {
  MG_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "register_buffer: invalid name '{}' in {}", name, type_name_);
  MG_CHECK(find(parameters_, name) == nullptr && find(buffers_, name) == nullptr,
           "register_buffer: {} already has an entry named '{}'", type_name_, name);
  buffers_.emplace_back(name, std::move(tensor));
  return buffers_.back().second;
}

void Module::add_child(const std::string& name, ModulePtr module) {
  MG_CHECK(module != nullptr, "register_module: '{}' in {} is null", name, type_name_);
  MG_CHECK(!name.empty() && name.find('.') == std::string::npos,
           "register_module: invalid name '{}' in {}", name, type_name_);
  for (const auto& c : children_)
    MG_CHECK(c.first != name, "register_module: {} already has a child named '{}'", type_name_,
             name);
  children_.emplace_back(name, std::move(module));
}

Tensor& Module::parameter(const std::string& name) {
  std::string leaf;
  Module& owner = owner_of(name, leaf);
  NamedTensor* e = find(owner.parameters_, leaf);
  MG_CHECK(e != nullptr, "{} has no parameter named '{}'", type_name_, name);
  return e->second;
}

const Tensor& Module::parameter(const std::string& name) const {
  return const_cast<Module*>(this)->parameter(name);
}

Tensor& Module::buffer(const std::string& name) {
  std::string leaf;
  Module& owner = owner_of(name, leaf);
  NamedTensor* e = find(owner.buffers_, leaf);
  MG_CHECK(e != nullptr, "{} has no buffer named '{}'", type_name_, name);
  return e->second;
}

ModulePtr Module::child(const std::string& name) const {
  for (const auto& c : children_)
    if (c.first == name) return c.second;
  MG_FAIL("{} has no child module named '{}'", type_name_, name);
}

bool Module::has_child(const std::string& name) const {
  for (const auto& c : children_)
    if (c.first == name) return true;
  return false;
}

void Module::replace_child(const std::string& dotted_name, ModulePtr module) {
  MG_CHECK(module != nullptr, "replace_child: the module for '{}' in {} is null", dotted_name, type_name_);
  std::string leaf;
  Module& owner = owner_of(dotted_name, leaf);
  for (auto& c : owner.children_)
    if (c.first == leaf) {
      c.second = std::move(module);
      return;
    }
  MG_FAIL("replace_child: {} has no child module named '{}'", type_name_, dotted_name);
}

void Module::remove_child(const std::string& dotted_name) {
  std::string leaf;
  Module& owner = owner_of(dotted_name, leaf);
  const auto it = std::find_if(owner.children_.begin(), owner.children_.end(),
                               [&](const NamedModule& c) { return c.first == leaf; });
  MG_CHECK(it != owner.children_.end(), "remove_child: {} has no child module named '{}'", type_name_,
           dotted_name);
  owner.children_.erase(it);
}

Module& Module::owner_of(const std::string& dotted_name, std::string& leaf_name) {
  const auto dot = dotted_name.find('.');
  if (dot == std::string::npos) {
    leaf_name = dotted_name;
    return *this;
  }
  return child(dotted_name.substr(0, dot))->owner_of(dotted_name.substr(dot + 1), leaf_name);
}

void Module::set_parameter(const std::string& dotted_name, Tensor tensor) {
  const Tensor old = parameter(dotted_name);
  std::vector<Tensor*> slots;
  collect_slots(true, slots);
  for (Tensor* slot : slots)
    if (slot->is_same(old)) *slot = tensor;
}

void Module::set_buffer(const std::string& dotted_name, Tensor tensor) {
  buffer(dotted_name) = std::move(tensor);
}

void Module::collect(const std::string& prefix, bool params, bool recurse,
                     std::vector<NamedTensor>& out) const {
  for (const auto& e : params ? parameters_ : buffers_) {
    const bool seen = std::any_of(out.begin(), out.end(), [&](const NamedTensor& o) {
      return o.second.defined() && o.second.is_same(e.second);
    });
    if (!seen) out.emplace_back(prefix + e.first, e.second);
  }
  if (!recurse) return;
  for (const auto& c : children_) c.second->collect(prefix + c.first + ".", params, true, out);
}

void Module::collect_slots(bool params, std::vector<Tensor*>& out) {
  for (auto& e : params ? parameters_ : buffers_) out.push_back(&e.second);
  for (auto& c : children_) c.second->collect_slots(params, out);
}

void Module::convert_tensors(const std::function<Tensor(const Tensor&)>& convert_param,
                             const std::function<Tensor(const Tensor&)>& convert_buffer) {
  for (bool params : {true, false}) {
    std::vector<Tensor*> slots;
    collect_slots(params, slots);
    std::vector<std::pair<Tensor, Tensor>> done;  // (old, new): each tensor converted once
    for (Tensor* slot : slots) {
      if (!slot->defined()) continue;
      auto found = std::find_if(done.begin(), done.end(), [&](const auto& d) { return d.first.is_same(*slot); });
      if (found == done.end()) {
        done.emplace_back(*slot, (params ? convert_param : convert_buffer)(*slot));
        found = done.end() - 1;
      }
      *slot = found->second;
    }
  }
}

std::vector<NamedTensor> Module::named_parameters(bool recurse) const {
  std::vector<NamedTensor> out;
  collect("", true, recurse, out);
  return out;
}

std::vector<Tensor> Module::parameters(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& e : named_parameters(recurse)) out.push_back(e.second);
  return out;
}

std::vector<NamedTensor> Module::named_buffers(bool recurse) const {
  std::vector<NamedTensor> out;
  collect("", false, recurse, out);
  return out;
}

std::vector<Tensor> Module::buffers(bool recurse) const {
  std::vector<Tensor> out;
  for (auto& e : named_buffers(recurse)) out.push_back(e.second);
  return out;
}

std::vector<ModulePtr> Module::children() const {
  std::vector<ModulePtr> out;
  for (const auto& c : children_) out.push_back(c.second);
  return out;
}

std::vector<std::pair<std::string, const Module*>> Module::named_modules() const {
  std::vector<std::pair<std::string, const Module*>> out{{"", this}};
  for (const auto& c : children_)
    for (auto& [name, m] : c.second->named_modules())
      out.emplace_back(name.empty() ? c.first : c.first + "." + name, m);
  return out;
}

void Module::train(bool on) {
  training_ = on;
  for (auto& c : children_) c.second->train(on);
}

void Module::to(Device device) {
  NoGradGuard no_grad;
  convert_tensors(
      [device](const Tensor& p) {
        if (p.device() == device) return p;
        const Tensor grad = p.grad();
        Tensor moved = ops::copy_to(p, device);
        moved.set_requires_grad(p.requires_grad());
        moved.set_distributed_spec(p.distributed_spec());
        if (grad.defined()) moved.set_grad(ops::copy_to(grad, device));
        return moved;
      },
      [device](const Tensor& b) { return b.device() == device ? b : ops::copy_to(b, device); });
}

void Module::to(DType dtype) {
  MG_CHECK(is_floating_point(dtype),
           "Module::to: only floating-point dtypes (float32, float64, bfloat16, float16) are "
           "accepted, got {}; "
           "integer buffers keep their dtype whatever the module's (torch: \"nn.Module.to only "
           "accepts floating point or complex dtypes\")",
           dtype);
  NoGradGuard no_grad;
  // convert_tensors converts each distinct tensor once: a tied weight stays one tensor.
  const auto wanted = [dtype](const Tensor& t) { return is_floating_point(t.dtype()) && t.dtype() != dtype; };
  convert_tensors(
      [&](const Tensor& p) {
        if (!wanted(p)) return p;
        const Tensor grad = p.grad();
        Tensor wide = ops::to_dtype(p, dtype);
        wide.set_requires_grad(p.requires_grad());
        wide.set_distributed_spec(p.distributed_spec());
        if (grad.defined()) wide.set_grad(ops::to_dtype(grad, dtype));
        return wide;
      },
      [&](const Tensor& b) { return wanted(b) ? ops::to_dtype(b, dtype) : b; });
}

void Module::zero_grad(bool set_to_none) {
  for (Tensor& p : parameters()) {
    if (!p.grad().defined()) continue;
    if (set_to_none) {
      p.set_grad(Tensor());
    } else {
      NoGradGuard no_grad;
      p.grad().zero_();
    }
  }
}

ModulePtr Module::shallow_clone() const {
  ModulePtr copy = copy_node();
  for (auto& c : copy->children_) c.second = c.second->shallow_clone();
  return copy;
}

ModulePtr Module::clone(Device device) const {
  NoGradGuard no_grad;
  ModulePtr copy = shallow_clone();
  copy->convert_tensors(
      [device](const Tensor& p) {
        Tensor fresh = ops::copy_to(p, device);
        fresh.set_requires_grad(p.requires_grad());
        fresh.set_distributed_spec(p.distributed_spec());
        return fresh;
      },
      [device](const Tensor& b) { return ops::copy_to(b, device); });
  return copy;
}

ModulePtr Module::clone() const {
  const auto params = parameters();
  return clone(params.empty() ? Device::cpu() : params.front().device());
}

std::string Module::str_indented(int indent) const {
  std::string s = type_name_ + "(" + extra_repr();
  if (children_.empty()) return s + ")";
  const std::string pad(static_cast<size_t>(indent + 2), ' ');
  s += "\n";
  for (const auto& c : children_)
    s += pad + "(" + c.first + "): " + c.second->str_indented(indent + 2) + "\n";
  return s + std::string(static_cast<size_t>(indent), ' ') + ")";
}

std::string Module::str() const { return str_indented(0); }

}  // namespace mg::nn
