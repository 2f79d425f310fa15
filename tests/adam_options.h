// The Adam/AdamW option sets the fused-step tests walk (tests/nn on the CPU, tests/cuda
// on the GPU), and how a failing case names its options.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/core/backend.h>
#include <minigrad/nn/optim/adam.h>

namespace mg::testing {

// What the optimizer under test is, as the backend's step sees it: Adam (L2 weight
// decay) or AdamW (decoupled), weight decay 0 or not, amsgrad, maximize.
struct AdamCase {
  bool decoupled = false;
  double lr = 1e-2, beta1 = 0.9, beta2 = 0.999, eps = 1e-8, weight_decay = 0.0;
  bool amsgrad = false, maximize = false;

  // An AdamStep with these options and no tensors.
  AdamStep step() const {
    AdamStep s;
    s.lr = lr;
    s.beta1 = beta1;
    s.beta2 = beta2;
    s.eps = eps;
    s.weight_decay = weight_decay;
    s.decoupled_weight_decay = decoupled;
    s.amsgrad = amsgrad;
    s.maximize = maximize;
    return s;
  }
};

// Every combination of Adam/AdamW, weight decay 0/0.1, amsgrad and maximize, with betas
// and eps that are not the defaults (so a swapped or default constant shows).
inline std::vector<AdamCase> all_adam_cases() {
  std::vector<AdamCase> out;
  for (bool decoupled : {false, true})
    for (double weight_decay : {0.0, 0.1})
      for (bool amsgrad : {false, true})
        for (bool maximize : {false, true}) {
          AdamCase c;
          c.decoupled = decoupled;
          c.lr = 2e-2;
          c.beta1 = 0.8;
          c.beta2 = 0.95;
          c.eps = 1e-6;
          c.weight_decay = weight_decay;
          c.amsgrad = amsgrad;
          c.maximize = maximize;
          out.push_back(c);
        }
  return out;
}

inline std::string describe(const AdamCase& c) {
  return fmt::format("{} lr {} betas ({}, {}) eps {} weight_decay {} amsgrad {} maximize {}",
                     c.decoupled ? "AdamW" : "Adam", c.lr, c.beta1, c.beta2, c.eps,
                     c.weight_decay, c.amsgrad, c.maximize);
}

// The optimizer of a case: optim::Adam or optim::AdamW with its options.
inline std::unique_ptr<optim::Optimizer> make_adam(const AdamCase& c, std::vector<Tensor> params) {
  if (c.decoupled)
    return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions(c.lr)
                                                                 .betas({c.beta1, c.beta2})
                                                                 .eps(c.eps)
                                                                 .weight_decay(c.weight_decay)
                                                                 .amsgrad(c.amsgrad)
                                                                 .maximize(c.maximize));
  return std::make_unique<optim::Adam>(std::move(params), optim::AdamOptions(c.lr)
                                                              .betas({c.beta1, c.beta2})
                                                              .eps(c.eps)
                                                              .weight_decay(c.weight_decay)
                                                              .amsgrad(c.amsgrad)
                                                              .maximize(c.maximize));
}

// The Adam state accessors of an optimizer made by make_adam.
inline const optim::AdamBase& adam_of(const optim::Optimizer& o) {
  return dynamic_cast<const optim::AdamBase&>(o);
}

}  // namespace mg::testing
