// nn::Module: a tree of modules, each owning named parameters and buffers.
//
// As in PyTorch, parameters live in the module's registry (an ordered list of names),
// and subclasses read them through it (Linear::weight() is parameter("weight")). That
// is what lets clone() and DataParallel's replicate() build a copy of the tree and swap
// in other tensors without the subclass knowing.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/core/dtype.h>
#include <minigrad/core/tensor.h>

namespace mg::nn {

class Module;
using ModulePtr = std::shared_ptr<Module>;
using NamedTensor = std::pair<std::string, Tensor>;
using NamedModule = std::pair<std::string, ModulePtr>;
using TensorList = std::vector<Tensor>;

class Module {
 public:
  explicit Module(std::string type_name = "Module") : type_name_(std::move(type_name)) {}
  virtual ~Module() = default;

  // The one-input interface every module implements.
  virtual Tensor forward(const Tensor& input) = 0;
  // forward between this module's hooks, as calling a module in PyTorch. Containers
  // (Sequential, DataParallel, the distributed wrappers) call their children this way.
  Tensor operator()(const Tensor& input);

  // Several inputs, PyTorch's forward(*args): a module that takes more than one tensor (the
  // Llama: token ids and their positions) overrides forward_args too; the default takes
  // exactly one. Called as module({x, positions}): the hooks see the first input -- the one a
  // pre-hook may replace and a forward hook is given, as PyTorch's styles and FSDP read
  // args[0] -- and the others pass through as they are. Under checkpointing (nn/checkpoint.h)
  // the first input's gradient flows; the others must not require grad (positions, masks).
  // (Its own name, not a forward overload, so that a subclass's forward hides nothing.)
  virtual Tensor forward_args(const TensorList& inputs);
  Tensor operator()(const TensorList& inputs);

  // ---- forward hooks (PyTorch's register_forward_pre_hook / register_forward_hook) ----
  // A pre-hook runs before forward and may replace its input; a hook runs after and may
  // replace its output: returning an undefined Tensor keeps what it was given. Hooks run
  // in registration order; each registration returns a handle for remove_hook.
  // (fully_shard gathers a unit's parameters in one and frees them in the
  // other.) Copies of a module (clone, shallow_clone) keep its hooks, as PyTorch's do.
  using ForwardPreHook = std::function<Tensor(Module& module, const Tensor& input)>;
  using ForwardHook =
      std::function<Tensor(Module& module, const Tensor& input, const Tensor& output)>;
  struct HookHandle {
    uint64_t id = 0;
  };
  HookHandle register_forward_pre_hook(ForwardPreHook hook);
  HookHandle register_forward_hook(ForwardHook hook);
  // Removes a hook of this module; a handle already removed (or of another module) is
  // ignored, as PyTorch's RemovableHandle.remove().
  void remove_hook(HookHandle handle);
  bool has_forward_hooks() const { return !pre_hooks_.empty() || !post_hooks_.empty(); }
  // `body` in forward's place between the hooks: for a caller that runs this module's
  // forward fused with what follows (Sequential's Linear+ReLU, nn/fusion.h).
  Tensor call_with_hooks(const Tensor& input, const std::function<Tensor(const Tensor&)>& body);

  // ---- registration ----
  Tensor& register_parameter(const std::string& name, Tensor tensor, bool requires_grad = true);
  Tensor& register_buffer(const std::string& name, Tensor tensor);
  template <typename M>
  std::shared_ptr<M> register_module(const std::string& name, std::shared_ptr<M> module) {
    add_child(name, module);
    return module;
  }

  // ---- lookup: own entries by name; dotted names ("layers.0.weight") reach children ----
  Tensor& parameter(const std::string& name);
  const Tensor& parameter(const std::string& name) const;
  Tensor& buffer(const std::string& name);
  ModulePtr child(const std::string& name) const;
  bool has_child(const std::string& name) const;
  // Replaces an existing parameter or buffer (dotted name) with another tensor. A tied
  // parameter (one tensor held by several modules, as the GPT's wte and lm_head) is one
  // parameter: every entry of this tree that held it gets the new tensor.
  void set_parameter(const std::string& dotted_name, Tensor tensor);
  void set_buffer(const std::string& dotted_name, Tensor tensor);
  // Puts `module` in the place of the existing child at `dotted_name` ("h.0.attn.c_attn"),
  // under the same name and in the same position, hooks and all of its own (how a form of
  // parallelism swaps a Linear for its shard: parallel/parallelize.h).
  void replace_child(const std::string& dotted_name, ModulePtr module);
  // Removes the child at `dotted_name`: a model whose forward passes absent children
  // through then runs without it (a pipeline stage: parallel/pipeline/split_module.h).
  void remove_child(const std::string& dotted_name);

  // ---- traversal, in registration order (children after own entries) ----
  // A tensor held by several entries (a tied weight) is listed once, under the first
  // name, as torch's named_parameters() lists it (remove_duplicate=True).
  std::vector<Tensor> parameters(bool recurse = true) const;
  std::vector<NamedTensor> named_parameters(bool recurse = true) const;
  std::vector<Tensor> buffers(bool recurse = true) const;
  std::vector<NamedTensor> named_buffers(bool recurse = true) const;
  std::vector<ModulePtr> children() const;
  const std::vector<NamedModule>& named_children() const { return children_; }
  // This module (named "") and every descendant, depth first.
  std::vector<std::pair<std::string, const Module*>> named_modules() const;

  // ---- state ----
  void train(bool on = true);
  void eval() { train(false); }
  bool is_training() const { return training_; }
  // Moves every parameter and buffer to `device` in place (parameters stay leaves and
  // keep requires_grad; existing gradients move with them). Tied parameters stay tied.
  void to(Device device);
  // Converts every floating-point parameter and buffer to `dtype` (any float: bfloat16 for
  // a model trained in 16 bits through optim::MasterWeights) in
  // place, as torch's module.to(dtype): parameters stay leaves and keep requires_grad,
  // existing gradients are converted with them, int64 buffers are left as they are, and a
  // tensor registered under several names (a tied weight) stays one tensor. mg::Error for
  // an integer dtype (torch: "nn.Module.to only accepts floating point or complex dtypes").
  void to(DType dtype);
  // Gradients of all parameters: cleared (set_to_none) or filled with zeros.
  void zero_grad(bool set_to_none = true);

  // ---- copies ----
  // A deep copy on `device`: new parameter and buffer tensors (leaves, same
  // requires_grad), no gradients; tied parameters tied again in the copy.
  ModulePtr clone(Device device) const;
  ModulePtr clone() const;
  // A copy of the module tree whose parameters and buffers are the same tensors as
  // this one's; replicate() then swaps in the broadcast copies.
  ModulePtr shallow_clone() const;

  // ---- printing, as PyTorch: Sequential(\n  (0): Linear(in_features=...) ...) ----
  const std::string& type_name() const { return type_name_; }
  virtual std::string extra_repr() const { return ""; }
  std::string str() const;

 protected:
  Module(const Module&) = default;
  Module& operator=(const Module&) = default;
  // A copy of this object alone (registries copied as handles); see Cloneable.
  virtual ModulePtr copy_node() const = 0;

 private:
  void add_child(const std::string& name, ModulePtr module);
  Module& owner_of(const std::string& dotted_name, std::string& leaf_name);
  void collect(const std::string& prefix, bool params, bool recurse,
               std::vector<NamedTensor>& out) const;
  // Every registry slot of this tree, parameters or buffers (ties included, each slot once).
  void collect_slots(bool params, std::vector<Tensor*>& out);
  // The entries of every module in this tree moved or copied by `convert`, each distinct
  // tensor once, so that ties survive (to, clone).
  void convert_tensors(const std::function<Tensor(const Tensor&)>& convert_param,
                       const std::function<Tensor(const Tensor&)>& convert_buffer);
  std::string str_indented(int indent) const;

  std::string type_name_;
  std::vector<NamedTensor> parameters_;
  std::vector<NamedTensor> buffers_;
  std::vector<NamedModule> children_;
  std::vector<std::pair<uint64_t, ForwardPreHook>> pre_hooks_;
  std::vector<std::pair<uint64_t, ForwardHook>> post_hooks_;
  bool training_ = true;
};

// Subclasses derive from Cloneable<Self> to get copy_node() for free:
//   class Linear : public nn::Cloneable<Linear> { ... };
template <typename Derived>
class Cloneable : public Module {
 public:
  using Module::Module;

 protected:
  ModulePtr copy_node() const override {
    return std::make_shared<Derived>(static_cast<const Derived&>(*this));
  }
};

}  // namespace mg::nn
