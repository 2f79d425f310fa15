// The SGD option sets the fused-step tests walk (tests/nn on the CPU, tests/cuda on the
// GPU), and how a failing case names its options.
#pragma once

#include <string>
#include <vector>

#include <fmt/format.h>

#include <minigrad/nn/optim/sgd.h>

namespace mg::testing {

// Every valid combination of momentum 0/0.9, dampening 0/0.1, weight_decay 0/1e-2 and
// nesterov (which needs momentum and no dampening), at lr 0.05.
inline std::vector<optim::SGDOptions> all_sgd_options() {
  std::vector<optim::SGDOptions> out;
  for (double momentum : {0.0, 0.9})
    for (double dampening : {0.0, 0.1})
      for (double weight_decay : {0.0, 1e-2})
        for (bool nesterov : {false, true}) {
          if (nesterov && (momentum == 0.0 || dampening != 0.0)) continue;
          out.emplace_back(0.05, momentum, dampening, weight_decay, nesterov);
        }
  return out;
}

inline std::string describe(const optim::SGDOptions& o) {
  return fmt::format("lr {} momentum {} dampening {} weight_decay {} nesterov {}", o.lr(),
                     o.momentum(), o.dampening(), o.weight_decay(), o.nesterov());
}

}  // namespace mg::testing
