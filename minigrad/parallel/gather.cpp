#include <minigrad/parallel/gather.h>

#include <minigrad/autograd/node.h>
#include <minigrad/parallel/comm.h>

namespace mg::parallel {
namespace {

// Backward of gather: the gradient cut into the outputs' sizes, each piece sent back to
// the device its output came from.
class GatherBackward final : public Node {
 public:
  GatherBackward(std::vector<Device> devices, std::vector<int64_t> sizes, int64_t dim)
      : Node("GatherBackward"), devices_(std::move(devices)), sizes_(std::move(sizes)), dim_(dim) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    return comm::scatter(grad_outputs[0], devices_, sizes_, dim_);
  }

 private:
  std::vector<Device> devices_;
  std::vector<int64_t> sizes_;
  int64_t dim_;
};

}  // namespace

Tensor gather(const std::vector<Tensor>& outputs, Device output_device, int64_t dim) {
  MG_CHECK(!outputs.empty(), "gather: expected at least one output to gather");
  for (size_t i = 0; i < outputs.size(); ++i)
    MG_CHECK(outputs[i].defined() && outputs[i].dim() > 0,
             "gather: output {} (on {}) is {}; gather concatenates outputs along a batch "
             "dimension, so each replica must return a tensor with at least one dimension",
             i, outputs[i].defined() ? outputs[i].device().str() : std::string("?"),
             outputs[i].defined() ? "a scalar (shape [])" : "undefined");
  dim = wrap_dim(dim, outputs[0].dim(), "gather");
  Tensor out = comm::gather(outputs, output_device, dim);
  if (needs_graph(outputs)) {
    std::vector<Device> devices;
    std::vector<int64_t> sizes;
    for (const Tensor& t : outputs) {
      devices.push_back(t.device());
      sizes.push_back(t.size(dim));
    }
    connect_node(std::make_shared<GatherBackward>(std::move(devices), std::move(sizes), dim),
                 outputs, {out});
  }
  return out;
}

}  // namespace mg::parallel
