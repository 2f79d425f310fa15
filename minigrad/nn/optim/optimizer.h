// optim::Optimizer: what a training loop asks of any optimizer, as torch.optim.Optimizer
// (libtorch's torch::optim::Optimizer): one update, clearing the gradients, the learning
// rate that a schedule changes between steps, and the state a checkpoint saves. SGD is
// one; a loop written against this interface takes another without change.
#pragma once

#include <map>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg::optim {

class Optimizer {
 public:
  virtual ~Optimizer() = default;

  // One update of every parameter that has a gradient.
  virtual void step() = 0;
  // Clears the parameters' gradients (set_to_none) or fills them with zeros.
  virtual void zero_grad(bool set_to_none = true) = 0;
  // The tensors it updates, in place.
  virtual const std::vector<Tensor>& parameters() const = 0;

  // The learning rate of the next step; set_lr validates as the constructor does.
  virtual double lr() const = 0;
  virtual void set_lr(double lr) = 0;

  // ---- checkpoints: the state that resuming needs, by name ----
  virtual std::map<std::string, Tensor> state_dict() const = 0;
  // mg::Error naming `source` (a file name, for messages) if `state` does not fit; changes
  // nothing, so a caller restoring a model and its optimizer can check both first.
  virtual void check_state_dict(const std::map<std::string, Tensor>& state,
                                const std::string& source) const = 0;
  virtual void load_state_dict(const std::map<std::string, Tensor>& state,
                               const std::string& source) = 0;

 protected:
  Optimizer() = default;
  Optimizer(const Optimizer&) = default;
  Optimizer& operator=(const Optimizer&) = default;
};

}  // namespace mg::optim
