// optim::Optimizer: what every optimizer here shares (libtorch's torch::optim::Optimizer,
// with one set of options instead of parameter groups). Code that takes "any optimizer"
// -- a training loop, a learning-rate schedule, ZeRO's sharded optimizer -- holds one
// of these:
//
//   std::unique_ptr<optim::Optimizer> opt = std::make_unique<optim::AdamW>(params, opts);
//   opt->zero_grad(); loss.backward(); opt->step();
//   opt->set_lr(schedule(step));
//
// The parameters are leaf float32 tensors, held by handle and updated in place. They may
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
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::optim {

using TensorDict = std::map<std::string, Tensor>;  // the same type as nn::TensorDict

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

  const std::vector<Tensor>& parameters() const { return params_; }
  // "SGD", "Adam", "AdamW": the name in every message.
  const std::string& name() const { return name_; }

  // The learning rate, for schedules; set_lr validates as the options do.
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;

  // A new optimizer of this kind with these options over other parameters, with no
  // state: how a wrapper builds one optimizer per shard from the one it was given.
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
  // Checks the parameters: defined, leaves, float32, no tensor twice.
  Optimizer(std::vector<Tensor> params, std::string name);

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
  std::string name_;
};

}  // namespace mg::optim
