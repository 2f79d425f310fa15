#include <minigrad/parallel/scatter.h>

#include <minigrad/autograd/node.h>
#include <minigrad/parallel/comm.h>

namespace mg::parallel {
namespace {

// Backward of scatter: the pieces' gradients, concatenated on the input's device.
class ScatterBackward final : public Node {
 public:
  ScatterBackward(Device input_device, int64_t dim)
      : Node("ScatterBackward"), input_device_(input_device), dim_(dim) {}

  std::vector<Tensor> apply(std::vector<Tensor>&& grad_outputs) override {
    return {comm::gather(grad_outputs, input_device_, dim_)};
  }

 private:
  Device input_device_;
  int64_t dim_;
};

}  // namespace

std::vector<Tensor> scatter(const Tensor& input, const std::vector<Device>& devices,
                            int64_t dim) {
  MG_CHECK(!devices.empty(), "scatter: expected at least one device");
  MG_CHECK(input.dim() > 0,
           "scatter: cannot split a scalar (shape []) across devices; give the input a batch "
           "dimension");
  dim = wrap_dim(dim, input.dim(), "scatter");
  const std::vector<int64_t> sizes =
      comm::chunk_sizes(input.size(dim), static_cast<int64_t>(devices.size()));
  MG_CHECK(!sizes.empty(), "scatter: the input (shape {}) is empty along dimension {}",
           input.shape(), dim);

  std::vector<Tensor> pieces = comm::scatter(input, devices, sizes, dim);
  if (needs_graph({input})) {
    connect_node(std::make_shared<ScatterBackward>(input.device(), dim), {input}, pieces);
  }
  return pieces;
}

}  // namespace mg::parallel
