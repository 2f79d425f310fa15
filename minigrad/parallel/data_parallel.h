// DataParallel: one process, several devices, one step (torch.nn.DataParallel).
//
//   forward(x):  scatter x along dim  ->  replicate the module  ->  parallel_apply
//                ->  gather the outputs on output_device
//   backward:    gather's backward scatters the gradient, each replica's backward runs
//                on its device, and Broadcast's backward sums (reduce_add) the replicas'
//                parameter gradients into the original parameters' grad on device_ids[0].
//
// Because the loss is computed on the gathered output, the summed gradient is the
// gradient of the whole batch through the plain module: a DataParallel step changes
// where the work runs, never the numbers (up to float rounding). See
// docs/data-parallel.md for the walkthrough.
#pragma once

#include <optional>
#include <vector>

#include <minigrad/nn/module.h>

namespace mg::parallel {

class DataParallel : public nn::Cloneable<DataParallel> {
 public:
  // Every visible GPU (cuda:0 .. cuda:N-1). With no GPU at all, forward calls the module
  // as it is, as PyTorch's DataParallel does.
  explicit DataParallel(nn::ModulePtr module);
  // The given devices: distinct GPUs, the same GPU several times, or CPU devices (the
  // replicas then share a device: how CI tests this). output_device defaults to
  // device_ids[0]; dim is the batch dimension to split along.
  DataParallel(nn::ModulePtr module, std::vector<Device> device_ids,
               std::optional<Device> output_device = std::nullopt, int64_t dim = 0);

  Tensor forward(const Tensor& input) override;

  // The wrapped module, registered as the child "module" (so its parameters are named
  // "module.0.weight", as in PyTorch, and a checkpoint keeps that prefix).
  nn::ModulePtr module() const { return child("module"); }
  const std::vector<Device>& device_ids() const { return device_ids_; }
  // Undefined (nullopt) when there are no devices and the module runs as is.
  std::optional<Device> output_device() const { return output_device_; }
  int64_t dim() const { return dim_; }
  std::string extra_repr() const override;

 private:
  std::vector<Device> device_ids_;
  std::optional<Device> output_device_;
  int64_t dim_;
};

// One DataParallel forward without keeping a module around (torch.nn.parallel.data_parallel).
// Without device_ids: every visible GPU, or the module as it is when there is none.
Tensor data_parallel(const nn::ModulePtr& module, const Tensor& input);
Tensor data_parallel(const nn::ModulePtr& module, const Tensor& input,
                     const std::vector<Device>& device_ids,
                     std::optional<Device> output_device = std::nullopt, int64_t dim = 0);

}  // namespace mg::parallel
