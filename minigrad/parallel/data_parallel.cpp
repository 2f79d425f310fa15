#include <minigrad/parallel/data_parallel.h>

#include <minigrad/core/backend.h>
#include <minigrad/core/stream.h>
#include <minigrad/parallel/devices/communicator.h>
#include <minigrad/parallel/devices/device_list.h>
#include <minigrad/parallel/gather.h>
#include <minigrad/parallel/parallel_apply.h>
#include <minigrad/parallel/replicate.h>
#include <minigrad/parallel/scatter.h>

namespace mg::parallel {
namespace {

void check_output_device(Device output_device, const char* what) {
  if (output_device.is_cpu()) return;  // gathering onto the host is always possible
  const int count = backend(DeviceType::CUDA).device_count();
  MG_CHECK(output_device.index() < count,
           "{}: output_device {} is not a visible device ({} CUDA device{} visible)", what,
           output_device, count, count == 1 ? " is" : "s are");
}

// Every parameter and buffer must start on device_ids[0], where replicate broadcasts
// from and where reduce_add leaves the gradients. A module split over devices on purpose
// is model parallel, which DataParallel cannot replicate; say so.
void check_module_devices(const nn::Module& module, Device source) {
  auto check = [&](const std::vector<nn::NamedTensor>& entries, const char* kind) {
    for (const auto& [name, t] : entries)
      MG_CHECK(t.device() == source,
               "DataParallel: module must have its parameters and buffers on device_ids[0] "
               "({}), but {} '{}' is on {}. Move the module there first (module->to({})); if "
               "its layers are on different devices on purpose (model parallelism), call it "
               "directly instead of wrapping it in DataParallel: each replica must fit on one "
               "device",
               source, kind, name, t.device(), source);
  };
  check(module.named_parameters(), "parameter");
  check(module.named_buffers(), "buffer");
}

// The four steps, shared by DataParallel::forward and data_parallel().
Tensor run_data_parallel(const nn::ModulePtr& module, const Tensor& input,
                         const std::vector<Device>& device_ids, Device output_device,
                         int64_t dim) {
  check_module_devices(*module, device_ids[0]);
  MG_CHECK(input.defined(), "DataParallel: the input is an undefined tensor");
  MG_CHECK(input.dim() > 0,
           "DataParallel: the input is a scalar (shape []); it needs a batch dimension to split "
           "over device_ids {}",
           device_list_str(device_ids));
  const int64_t batch_dim = wrap_dim(dim, input.dim(), "DataParallel");
  MG_CHECK(input.size(batch_dim) > 0,
           "DataParallel: the input batch is empty (shape {}, size 0 along dim {}); there is "
           "nothing to scatter over device_ids {}",
           input.shape(), batch_dim, device_list_str(device_ids));

  if (device_ids.size() == 1) {
    // One device: no replicas, no threads; the module runs on the input moved there.
    const Device device = device_ids[0];
    const Tensor x = input.device() == device ? input : input.to(device);
    Tensor out;
    {
      DeviceGuard guard(device);
      out = (*module)(x);
    }
    return out.device() == output_device ? out : out.to(output_device);
  }

  // (1) scatter: as many pieces as there are rows, at most one per device.
  const std::vector<Tensor> inputs = scatter(input, device_ids, batch_dim);
  const std::vector<Device> used(device_ids.begin(),
                                 device_ids.begin() + static_cast<std::ptrdiff_t>(inputs.size()));
  // (2) replicate onto the devices that got a piece.
  const std::vector<nn::ModulePtr> replicas = replicate(module, used);
  // (3) every replica's forward at once.
  const std::vector<Tensor> outputs = parallel_apply(replicas, inputs, used);
  // (4) gather.
  return gather(outputs, output_device, batch_dim);
}

}  // namespace

DataParallel::DataParallel(nn::ModulePtr module)
    : Cloneable<DataParallel>("DataParallel"), device_ids_(visible_gpus()), dim_(0) {
  MG_CHECK(module != nullptr, "DataParallel: the module is null");
  // No GPU: device_ids_ stays empty and forward runs the module as it is, like PyTorch.
  if (!device_ids_.empty()) output_device_ = device_ids_[0];
  register_module("module", std::move(module));
}

DataParallel::DataParallel(nn::ModulePtr module, std::vector<Device> device_ids,
                           std::optional<Device> output_device, int64_t dim)
    : Cloneable<DataParallel>("DataParallel"),
      device_ids_(std::move(device_ids)),
      output_device_(output_device),
      dim_(dim) {
  MG_CHECK(module != nullptr, "DataParallel: the module is null");
  check_device_list(device_ids_, "DataParallel");
  if (!output_device_) output_device_ = device_ids_[0];
  check_output_device(*output_device_, "DataParallel");
  register_module("module", std::move(module));
}

Tensor DataParallel::forward(const Tensor& input) {
  const nn::ModulePtr wrapped = module();
  if (device_ids_.empty()) return (*wrapped)(input);
  return run_data_parallel(wrapped, input, device_ids_, *output_device_, dim_);
}

std::string DataParallel::extra_repr() const {
  if (device_ids_.empty()) return "device_ids=[] (no GPU: the module runs as is)";
  return fmt::format("device_ids={}, output_device={}, dim={}", device_list_str(device_ids_),
                     *output_device_, dim_);
}

Tensor data_parallel(const nn::ModulePtr& module, const Tensor& input) {
  MG_CHECK(module != nullptr, "data_parallel: the module is null");
  const std::vector<Device> gpus = visible_gpus();
  if (gpus.empty()) return (*module)(input);
  return data_parallel(module, input, gpus);
}

Tensor data_parallel(const nn::ModulePtr& module, const Tensor& input,
                     const std::vector<Device>& device_ids, std::optional<Device> output_device,
                     int64_t dim) {
  MG_CHECK(module != nullptr, "data_parallel: the module is null");
  check_device_list(device_ids, "data_parallel");
  const Device output = output_device ? *output_device : device_ids[0];
  check_output_device(output, "data_parallel");
  return run_data_parallel(module, input, device_ids, output, dim);
}

}  // namespace mg::parallel
