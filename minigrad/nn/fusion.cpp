#include <minigrad/nn/fusion.h>

#include <atomic>
#include <typeinfo>

#include <minigrad/nn/layers.h>

namespace mg::nn {

namespace {
// Read on every Sequential forward, from any thread; relaxed: it orders nothing else.
std::atomic<bool> enabled{true};
}  // namespace

bool fusion_enabled() { return enabled.load(std::memory_order_relaxed); }

void set_fusion_enabled(bool on) { enabled.store(on, std::memory_order_relaxed); }

Linear* fusable_linear_relu(Module& module, const Module* next) {
  if (!fusion_enabled() || next == nullptr) return nullptr;
  if (typeid(module) != typeid(Linear) || typeid(*next) != typeid(ReLU)) return nullptr;
  // The ReLU's own hooks must see its input and output: run it as a module then.
  if (next->has_forward_hooks()) return nullptr;
  auto& linear = static_cast<Linear&>(module);
  return linear.has_bias() ? &linear : nullptr;
}

}  // namespace mg::nn
