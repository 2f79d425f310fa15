// nn::utils::clip_grad_norm_ on CUDA gradients against the same call on the CPU: the
// norms are sums in different orders (close, not equal); the clipping is a multiply by
// the same coefficient. Also gradients on two devices in one call.
#include "gpu_compare.h"

#include <limits>
#include <vector>

#include <minigrad/nn/utils/clip_grad.h>

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;

namespace {

std::vector<Tensor> params_on(Device device, const std::vector<Shape>& shapes, uint64_t seed) {
  std::vector<Tensor> params;
  for (size_t k = 0; k < shapes.size(); ++k) {
    params.push_back(zeros(shapes[k], DType::Float32, device).set_requires_grad(true));
    params.back().set_grad(random_cpu(shapes[k], seed + k).to(device));
  }
  return params;
}

}  // namespace

TEST_CASE("clip_grad_norm_ on the GPU matches the CPU, for the 2-, 1-, 3- and infinity norms") {
  const std::vector<Shape> shapes = {{1}, {33}, {4097}, {257, 300}};
  for (double norm_type : {2.0, 1.0, 3.0, std::numeric_limits<double>::infinity()}) {
    CAPTURE(norm_type);
    const auto cpu_params = params_on(Device::cpu(), shapes, 10);
    const auto gpu_params = params_on(gpu(), shapes, 10);
    const Tensor cpu_norm = nn::utils::clip_grad_norm_(cpu_params, 0.5, norm_type);
    const Tensor gpu_norm = nn::utils::clip_grad_norm_(gpu_params, 0.5, norm_type);
    REQUIRE(gpu_norm.device() == gpu());
    require_close(gpu_norm, cpu_norm, 1e-5, 0.0);
    for (size_t k = 0; k < shapes.size(); ++k) {
      INFO("gradient " << k);
      REQUIRE(gpu_params[k].grad().device() == gpu());
      require_close(gpu_params[k].grad(), cpu_params[k].grad(), 1e-5, 1e-9);
    }
  }
}

TEST_CASE("clip_grad_norm_ over gradients on the CPU and the GPU in one call") {
  const std::vector<Shape> shapes = {{33}, {4097}, {13, 17}};
  const auto reference = params_on(Device::cpu(), shapes, 20);
  auto mixed = params_on(Device::cpu(), shapes, 20);
  mixed[1] = params_on(gpu(), {shapes[1]}, 21)[0];  // the seed of shape 1 in `reference`
  const Tensor want = nn::utils::clip_grad_norm_(reference, 1.0);
  const Tensor got = nn::utils::clip_grad_norm_(mixed, 1.0);
  REQUIRE(got.device() == Device::cpu());  // the first gradient's device
  require_close(got, want, 1e-5, 0.0);
  for (size_t k = 0; k < shapes.size(); ++k) {
    INFO("gradient " << k);
    require_close(mixed[k].grad(), reference[k].grad(), 1e-5, 1e-9);
  }
}
