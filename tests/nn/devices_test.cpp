// SGD and checkpoints with parameters on a "cuda" device. Without a GPU the CUDA entry
// is the host-backed stand-in of tests/core, so what runs here everywhere is the device
// routing: momentum buffers and loaded values land on each parameter's own device, and
// saving gathers from it. (tests/cuda/nn_state_test.cpp runs the same on a real GPU.)
#include "catch_compat.h"
#include "temp_dir.h"


#include <fstream>
#include <iterator>
#include <memory>
#include <string>
#include <vector>

#include "core/host_backed_cuda.h"

#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>
#include <minigrad/nn/optim/sgd.h>
#include <minigrad/nn/serialize.h>

namespace nn = mg::nn;
namespace optim = mg::optim;
using mg::Device;
using mg::Shape;
using mg::Tensor;

namespace {

// The real CUDA backend when there is a GPU, else the host-backed stand-in.
struct CudaOrStandIn {
  std::unique_ptr<mg::testing::ScopedHostBackedCuda> stand_in;
  CudaOrStandIn() {
    if (mg::backend(mg::DeviceType::CUDA).device_count() == 0)
      stand_in = std::make_unique<mg::testing::ScopedHostBackedCuda>();
  }
};

std::shared_ptr<nn::Sequential> mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(6, 5), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(5, 3)});
}

std::string read_bytes(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return std::string(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
}

void check_close(const Tensor& a, const Tensor& b) {
  const auto x = a.to_vector<float>();
  const auto y = b.to_vector<float>();
  REQUIRE(x.size() == y.size());
  for (size_t i = 0; i < x.size(); ++i) CHECK(x[i] == Approx(y[i]).margin(1e-6));
}

}  // namespace

TEST_CASE("SGD on a cuda device keeps its buffers there and follows the CPU") {
  CudaOrStandIn cuda;
  const Device gpu = Device::cuda(0);
  mg::manual_seed(31);
  const Tensor start = mg::randn(Shape{4, 6});
  Tensor cpu_p = mg::ops::clone(start).set_requires_grad(true);
  Tensor gpu_p = start.to(gpu).detach().set_requires_grad(true);
  const auto options = optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01).nesterov(true);
  optim::SGD on_cpu({cpu_p}, options);
  optim::SGD on_gpu({gpu_p}, options);
  for (int step = 0; step < 3; ++step) {
    const Tensor g = mg::randn(Shape{4, 6});
    cpu_p.set_grad(g);
    gpu_p.set_grad(g.to(gpu).detach());
    on_cpu.step();
    on_gpu.step();
  }
  CHECK(gpu_p.device() == gpu);
  CHECK(on_gpu.momentum_buffer(0).device() == gpu);
  check_close(gpu_p, cpu_p);
  check_close(on_gpu.momentum_buffer(0), on_cpu.momentum_buffer(0));
}

TEST_CASE("save from a cuda module and load into another, in place on its device") {
  CudaOrStandIn cuda;
  const Device gpu = Device::cuda(0);
  mg::testing::TempDir dir;
  mg::manual_seed(32);
  auto source = mlp();
  nn::save(*source, (dir / "cpu.safetensors"));
  source->to(gpu);
  nn::save(*source, (dir / "gpu.safetensors"));
  // The same values give the same file, wherever they lived.
  CHECK(read_bytes((dir / "gpu.safetensors")) == read_bytes((dir / "cpu.safetensors")));

  mg::manual_seed(33);
  auto target = mlp();
  target->to(gpu);
  const auto handles = target->parameters();
  nn::load(*target, (dir / "gpu.safetensors"));
  const auto loaded = target->parameters();
  const auto expected = source->parameters();
  for (size_t i = 0; i < loaded.size(); ++i) {
    CHECK(loaded[i].is_same(handles[i]));
    CHECK(loaded[i].device() == gpu);
    CHECK(loaded[i].to_vector<float>() == expected[i].to_vector<float>());
  }
}

TEST_CASE("SGD state loaded from the CPU lands on each parameter's device") {
  CudaOrStandIn cuda;
  const Device gpu = Device::cuda(0);
  Tensor on_gpu = mg::zeros(Shape{3}, mg::DType::Float32, gpu).set_requires_grad(true);
  Tensor on_cpu = mg::zeros(Shape{2}).set_requires_grad(true);
  optim::SGD sgd({on_gpu, on_cpu}, optim::SGDOptions(0.1, 0.9));
  sgd.load_state_dict({{"momentum_buffer.0", mg::ones(Shape{3})},
                       {"momentum_buffer.1", mg::full(Shape{2}, 2.0)}});
  CHECK(sgd.momentum_buffer(0).device() == gpu);
  CHECK(sgd.momentum_buffer(1).device() == Device::cpu());
  CHECK(sgd.momentum_buffer(0).to_vector<float>() == std::vector<float>(3, 1.0f));

  // The next step uses the loaded buffer: buf = 0.9 * 1 + 1 * g with g = 1, p = -0.1 * 1.9.
  on_gpu.set_grad(mg::ones(Shape{3}, mg::DType::Float32, gpu));
  sgd.step();
  check_close(on_gpu, mg::full(Shape{3}, -0.19));
}
