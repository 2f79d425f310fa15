#include <minigrad/parallel/replicate.h>

#include <minigrad/autograd/node.h>
#include <minigrad/core/profiler.h>
#include <minigrad/parallel/comm.h>
#include <minigrad/parallel/devices/communicator.h>

namespace mg::parallel {
namespace {

// The node joining the original parameters to their replicas. Its outputs are ordered
// replica by replica: output i * P + k is parameter k of replica i.
class BroadcastBackward final : public Node {
 public:
  BroadcastBackward(std::vector<Device> devices, size_t num_params)
      : Node("BroadcastBackward"), devices_(std::move(devices)), num_params_(num_params) {}

  // reduce_add: replica i's P gradients are flattened into one buffer, the N buffers are
  // summed onto devices[0] by the communicator, and the sum is cut back into P views.
  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    std::vector<std::vector<Tensor>> per_replica(devices_.size());
    for (size_t i = 0; i < devices_.size(); ++i)
      per_replica[i].assign(grad_outputs.begin() + static_cast<std::ptrdiff_t>(i * num_params_),
                            grad_outputs.begin() + static_cast<std::ptrdiff_t>((i + 1) * num_params_));
    return comm::reduce_add_coalesced(per_replica, devices_, 0);
  }

 private:
  std::vector<Device> devices_;
  size_t num_params_;
};

}  // namespace

std::vector<nn::ModulePtr> replicate(const nn::ModulePtr& module,
                                     const std::vector<Device>& devices) {
  MG_CHECK(module != nullptr, "replicate: the module is null");
  MG_CHECK(!devices.empty(), "replicate: expected at least one device");
  profiler::Span span("replicate");
  span.category("data_parallel").arg("replicas", devices.size());
  const std::vector<nn::NamedTensor> params = module->named_parameters();
  const std::vector<nn::NamedTensor> buffers = module->named_buffers();
  for (const auto& [name, p] : params)
    MG_CHECK(p.device() == devices[0],
             "replicate: parameter '{}' is on {}, but replicas are copied from devices[0] ({})",
             name, p.device(), devices[0]);
  for (const auto& [name, b] : buffers)
    MG_CHECK(b.device() == devices[0],
             "replicate: buffer '{}' is on {}, but replicas are copied from devices[0] ({})", name,
             b.device(), devices[0]);

  // Every parameter travels in one coalesced broadcast; buffers in another.
  std::vector<Tensor> values;
  for (const auto& named : params) values.push_back(named.second);
  std::vector<std::vector<Tensor>> param_copies = broadcast_coalesced(values, devices);
  values.clear();
  for (const auto& named : buffers) values.push_back(named.second);
  const std::vector<std::vector<Tensor>> buffer_copies = broadcast_coalesced(values, devices);

  // The differentiable part: parameters that require grad, while grad mode is on.
  std::vector<size_t> differentiable;
  for (size_t k = 0; k < params.size(); ++k)
    if (needs_graph({params[k].second})) differentiable.push_back(k);
  if (!differentiable.empty()) {
    std::vector<Tensor> inputs, outputs;
    for (size_t k : differentiable) inputs.push_back(params[k].second);
    for (size_t i = 0; i < devices.size(); ++i) {
      for (size_t k : differentiable) {
        // Replica 0 shares the original's memory, through a tensor of its own that can
        // carry grad_fn = Broadcast.
        if (i == 0) param_copies[0][k] = params[k].second.detach();
        outputs.push_back(param_copies[i][k]);
      }
    }
    connect_node(std::make_shared<BroadcastBackward>(devices, differentiable.size()), inputs,
                 outputs);
  }

  std::vector<nn::ModulePtr> replicas;
  replicas.reserve(devices.size());
  for (size_t i = 0; i < devices.size(); ++i) {
    nn::ModulePtr replica = module->shallow_clone();
    for (size_t k = 0; k < params.size(); ++k) replica->set_parameter(params[k].first, param_copies[i][k]);
    for (size_t k = 0; k < buffers.size(); ++k) replica->set_buffer(buffers[k].first, buffer_copies[i][k]);
    replicas.push_back(std::move(replica));
  }
  return replicas;
}

}  // namespace mg::parallel
