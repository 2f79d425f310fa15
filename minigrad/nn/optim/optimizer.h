// optim::Optimizer: what every optimizer here shares (libtorch's torch::optim::Optimizer).
// Code that takes "any optimizer" -- a training loop, a learning-rate schedule, ZeRO's
// sharded optimizer -- holds one of these:
//
//   std::unique_ptr<optim::Optimizer> opt = std::make_unique<optim::AdamW>(params, opts);
//   opt->zero_grad(); loss.backward(); opt->step();
//   opt->set_lr(schedule(step));
//
// Parameter groups (torch's param_groups): an optimizer may be built from several groups,
// each with options of its own (nanoGPT decays the 2-D weights and not the biases):
//
//   optim::AdamW opt({optim::ParamGroup<optim::AdamWOptions>(weights),
//                     optim::ParamGroup<optim::AdamWOptions>(biases, AdamWOptions(6e-4).weight_decay(0))},
//                    AdamWOptions(6e-4).weight_decay(0.1));
//
// parameters() is every group's parameters, group after group, and a parameter's index
// (in state(i), state_dict's "<name>.<i>", messages) counts through all of them, as
// torch's state_dict numbers them. set_lr sets every group's learning rate (what nanoGPT's
// loop does); group_lr / set_group_lr reach one group. A one-group optimizer, built from
// a plain list of tensors, is what it always was.
//
// The parameters are leaf float32 or float64 tensors (each optimizer state follows its
// parameter's dtype), held by handle and updated in place. They may
// be any tensors the caller owns -- a module's parameters, or flat 1-D views into one
// buffer (a shard: ops::narrow(flat, 0, begin, length), or flat.narrow(...) of a buffer
// that does not require grad, so that the view is a leaf) whose gradients the caller sets
// with set_grad(). Updates are elementwise, so a shard steps exactly as the same elements
// would inside the whole tensors (tests/nn/optimizer_test.cpp).
//
// State: each parameter has a few named state tensors once it has stepped (PyTorch's
// optimizer.state[p]): SGD "momentum_buffer"; Adam and AdamW "step", "exp_avg",
// "exp_avg_sq" (and "max_exp_avg_sq" with amsgrad). state(i) returns them and
// set_state(i, ...) replaces them, one parameter at a time; state_dict() names every one
// "<name>.<i>" (e.g. "exp_avg.3") for a checkpoint, and load_state_dict() restores them,
// checking everything first.
#pragma once

#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::optim {

using TensorDict = std::map<std::string, Tensor>;  // the same type as nn::TensorDict

// One entry of torch's param_groups: parameters and, optionally, options of their own
// (without them, the group takes the options the optimizer was given as its defaults).
template <typename Options>
struct ParamGroup {
  ParamGroup(std::vector<Tensor> params_in)  // NOLINT: implicit, a list of tensors is a group
      : params(std::move(params_in)) {}
  ParamGroup(std::vector<Tensor> params_in, Options options_in)
      : params(std::move(params_in)), options(std::move(options_in)) {}

  std::vector<Tensor> params;
  std::optional<Options> options;
};

class Optimizer {
 public:
  virtual ~Optimizer() = default;
  Optimizer(const Optimizer&) = delete;
  Optimizer& operator=(const Optimizer&) = delete;

  // One update of every parameter that has a gradient; parameters without one are
  // skipped (their state left as it is), as in PyTorch.
  virtual void step() = 0;
  // Clears the parameters' gradients (set_to_none) or fills them with zeros. Virtual for
  // wrappers that hold more gradients than their parameters' (ZeRO-1's full gradients).
  virtual void zero_grad(bool set_to_none = true);
  // Makes parameters()' gradients current before they are read: a no-op, except for a
  // wrapper whose parameters are copies of the model's (optim::MasterWeights converts the
  // model's 16-bit gradients into its float32 masters' here). step() and
  // amp::GradScaler::unscale_ call it; call it yourself before reading the gradients of
  // parameters() after backward (to clip them).
  virtual void prepare_gradients() {}

  const std::vector<Tensor>& parameters() const { return params_; }
  // "SGD", "Adam", "AdamW": the name in every message.
  const std::string& name() const { return name_; }

  // The learning rate, for schedules: lr() is the first group's, set_lr sets every
  // group's (validated as the options are).
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;

  // ---- parameter groups ----
  size_t param_group_count() const { return group_begin_.size(); }
  // The parameters of group `group`: indices [param_group_begin(group), param_group_end(group)) of
  // parameters().
  size_t param_group_begin(size_t group) const;
  size_t param_group_end(size_t group) const;
  // The group of parameter `index`.
  size_t param_group_of(size_t index) const;
  // One group's learning rate. The defaults serve optimizers of one group (lr(),
  // set_lr()); SGD, Adam and AdamW keep one per group.
  virtual double group_lr(size_t group) const;
  virtual void set_group_lr(size_t group, double lr);

  // A new optimizer of this kind with these options over other parameters, with no
  // state: how a wrapper builds one optimizer per shard from the one it was given. One
  // group's options only: an optimizer of several groups refuses (mg::Error).
  virtual std::unique_ptr<Optimizer> make_like(std::vector<Tensor> params) const = 0;

  // ---- state, one parameter at a time ----
  // The names a parameter's state can have, in the order state_dict() lists them.
  virtual std::vector<std::string> state_names() const = 0;
  // The live state tensors of parameter `index`, by name; empty before its first step.
  // Writing into them changes the optimizer's state.
  virtual TensorDict state(size_t index) const = 0;
  // Replaces parameter `index`'s state with copies of `state` (buffers on the
  // parameter's device; an empty dict: no state, as before the first step). Checked
  // first, as load_state_dict checks; mg::Error naming `source` otherwise.
  void set_state(size_t index, const TensorDict& state, const std::string& source = "state");

  // ---- checkpoints ----
  // Every state tensor as "<name>.<i>" (the live tensors; save them before the next step).
  TensorDict state_dict() const;
  // mg::Error listing every problem at once (unknown keys, parameters out of range,
  // shapes, dtypes, incomplete states), naming `source` (a file name, for messages).
  void check_state_dict(const TensorDict& state, const std::string& source = "state dict") const;
  // check_state_dict, then replaces every parameter's state (parameters without entries
  // get none). A bad state dict changes nothing.
  void load_state_dict(const TensorDict& state, const std::string& source = "state dict");

 protected:
  // Checks the parameters: defined, leaves, float32 or float64, no tensor twice (in any group).
  Optimizer(std::vector<Tensor> params, std::string name);
  // Parameter groups: `groups[g]` are group g's parameters (a group may be empty).
  Optimizer(std::vector<std::vector<Tensor>> groups, std::string name);

  // mg::Error naming `method` unless `group` < param_group_count().
  void check_param_group(const char* method, size_t group) const;

  // What zero_grad does, over any tensors (a wrapper's own gradients too).
  static void zero_grads(const std::vector<Tensor>& tensors, bool set_to_none);

  // Appends to `problems` what is wrong with `state` as parameter `index`'s state (names
  // without the ".<i>"; not empty). `key(name)` spells an entry's key for messages.
  virtual void check_param_state(size_t index, const TensorDict& state,
                                 const std::function<std::string(const std::string&)>& key,
                                 std::vector<std::string>& problems) const = 0;
  // Sets parameter `index`'s state to copies of `state` (checked; empty clears it). The
  // given tensors stay the caller's.
  virtual void set_param_state(size_t index, const TensorDict& state) = 0;

  // For check_param_state: a problem unless `t` has parameter `index`'s shape and dtype.
  void check_like_param(size_t index, const std::string& key, const Tensor& t,
                        std::vector<std::string>& problems) const;

 private:
  [[noreturn]] void fail(const char* method, const std::string& source,
                         const std::vector<std::string>& problems) const;

  std::vector<Tensor> params_;
  std::vector<size_t> group_begin_;  // the first parameter index of each group
  std::string name_;
};

// Splits a list of groups given as ParamGroups into their parameters and their options
// (a group without options takes `defaults`): what SGD, Adam and AdamW's constructors do.
template <typename Options>
std::vector<std::vector<Tensor>> group_params(const std::vector<ParamGroup<Options>>& groups) {
  std::vector<std::vector<Tensor>> out;
  out.reserve(groups.size());
  for (const auto& g : groups) out.push_back(g.params);
  return out;
}
template <typename Options>
std::vector<Options> group_options(const std::vector<ParamGroup<Options>>& groups,
                                   const Options& defaults) {
  std::vector<Options> out;
  out.reserve(groups.size());
  for (const auto& g : groups) out.push_back(g.options ? *g.options : defaults);
  return out;
}

}  // namespace mg::optim
