// The fusions nn::Sequential applies, decided here and nowhere else.
//
// One so far: a Linear (with bias) directly followed by a ReLU runs as one op,
// mg::linear_relu, which on CUDA is one cuBLASLt GEMM whose epilogue adds the bias and
// applies the ReLU, so the pre-activation is never written. The values and gradients are
// those of running the two modules one by one (bit for bit on the CPU), and backward is
// the unfused graph (LinearBackward, then ReluBackward): see docs/performance.md, "Small
// works", for why, and tests/nn/sequential_fusion_test.cpp.
//
// On by default. To see the plain graph, or to measure what fusion buys, turn it off
// process-wide (as torch.backends' flags), or for a scope:
//
//   mg::nn::set_fusion_enabled(false);
//   { mg::nn::FusionGuard unfused(false); model->forward(x); }   // restored on exit
//
// The setting is one for the whole process, not per thread, so DataParallel's replicas,
// which run on worker threads, follow what the caller set.
#pragma once

#include <minigrad/nn/module.h>

namespace mg::nn {

class Linear;

bool fusion_enabled();
void set_fusion_enabled(bool enabled);

// Sets fusion on or off for its scope, and restores what was set before.
class FusionGuard {
 public:
  explicit FusionGuard(bool enabled) : previous_(fusion_enabled()) { set_fusion_enabled(enabled); }
  ~FusionGuard() { set_fusion_enabled(previous_); }
  FusionGuard(const FusionGuard&) = delete;
  FusionGuard& operator=(const FusionGuard&) = delete;

 private:
  bool previous_;
};

// Sequential's question before it runs `module`, followed by `next` (null at the end):
// the Linear to run as Linear::forward_relu, taking the ReLU with it, or null to run
// `module` alone. Fused only with fusion enabled, for exactly these two types (a subclass
// may override forward, and must run as written), a Linear with a bias, and a ReLU
// without forward hooks (the Linear's hooks run around the fused op).
Linear* fusable_linear_relu(Module& module, const Module* next);

}  // namespace mg::nn
