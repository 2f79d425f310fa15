// Autocast: mixed precision by op, as torch.autocast. Inside an AutocastGuard(device
// type, dtype), each differentiable op that has a rule in autograd/autocast_policy.h
// casts its floating inputs first (matmul and linear to the 16-bit dtype, cross_entropy
// to float32, ...), with the differentiable to(): backward converts each gradient back to
// its input's dtype, so parameters kept in float32 get float32 gradients (nanoGPT's way:
// float32 parameters and optimizer, 16-bit GEMMs).
//
//   AutocastGuard autocast(DeviceType::CPU, DType::BFloat16);
//   Tensor loss = cross_entropy(model->forward(x), y);   // GEMMs in bfloat16, loss float32
//   // (leave the region before backward, as torch's docs say: backward follows forward's casts)
//   loss.backward();
//
// The state is per thread and per device type (a region for CUDA leaves CPU ops alone);
// regions nest, each restoring what it found. autocast_state()/set_autocast_state() carry
// it to worker threads (parallel/devices/run_per_device does, as it carries grad mode), and
// nn::checkpoint reruns a region under the state of its forward.
//
// The cast cache (torch's): within a region, the 16-bit cast of a float32 leaf that
// requires grad (a parameter) is made once and reused by every op that needs it; the cache
// is emptied when the outermost region ends. A parameter written in place inside the region
// (its version moved) is cast again rather than read stale.
#pragma once

#include <vector>

#include <minigrad/autograd/autocast_policy.h>
#include <minigrad/core/device.h>
#include <minigrad/core/dtype.h>
#include <minigrad/core/tensor.h>

namespace mg {

struct AutocastState {
  bool enabled[kNumDeviceTypes] = {false, false};
  // torch's defaults: bfloat16 on the CPU, float16 on CUDA.
  DType dtype[kNumDeviceTypes] = {DType::BFloat16, DType::Float16};
  bool cache_enabled = true;
  int depth = 0;  // regions open on this thread (the cache is emptied when it returns to 0)
};

AutocastState autocast_state();
void set_autocast_state(const AutocastState& state);
bool is_autocast_enabled(DeviceType device_type);
DType autocast_dtype(DeviceType device_type);

// torch.autocast(device_type, dtype, enabled, cache_enabled). dtype is bfloat16 or float16
// (an mg::Error otherwise). enabled = false opens a region where autocast is off for that
// device type (torch.autocast(..., enabled=False) inside another region).
class AutocastGuard {
 public:
  AutocastGuard(DeviceType device_type, DType dtype, bool enabled = true, bool cache_enabled = true);
  AutocastGuard(Device device, DType dtype, bool enabled = true, bool cache_enabled = true)
      : AutocastGuard(device.type(), dtype, enabled, cache_enabled) {}
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  AutocastState previous_;
};

// Puts `state` in place for a scope and restores the thread's own afterwards: a worker
// thread running the caller's work under the caller's regions, a checkpoint's rerun under
// its forward's.
class AutocastStateGuard {
 public:
  explicit AutocastStateGuard(const AutocastState& state) : previous_(autocast_state()) {
    set_autocast_state(state);
  }
  ~AutocastStateGuard() { set_autocast_state(previous_); }
  AutocastStateGuard(const AutocastStateGuard&) = delete;
  AutocastStateGuard& operator=(const AutocastStateGuard&) = delete;

 private:
  AutocastState previous_;
};

namespace autocast {

// The inputs of `op` as the region's policy wants them (each as it is outside a region, or
// when no rule applies): the differentiable functions call this first.
std::vector<Tensor> cast_inputs(AutocastOp op, std::vector<Tensor> inputs);
Tensor cast_input(AutocastOp op, const Tensor& input);

// Turns autocast off for the calling thread inside a function that has cast its inputs
// already and is written as other differentiable ops (the composed attention): torch runs
// an autocast op's body with autocast excluded, so its inner ops keep the dtypes it chose.
class ExcludeGuard {
 public:
  ExcludeGuard();
  ~ExcludeGuard();
  ExcludeGuard(const ExcludeGuard&) = delete;
  ExcludeGuard& operator=(const ExcludeGuard&) = delete;

 private:
  AutocastState previous_;
};

// Casts held by the cache now (for tests).
size_t cached_casts();

}  // namespace autocast

}  // namespace mg
