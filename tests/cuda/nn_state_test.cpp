// optim::SGD and safetensors checkpoints with parameters on the GPU: the same updates as
// on the CPU, and save/load/resume across devices.
#include "gpu_compare.h"
#include "temp_dir.h"


#include <string>

#include <minigrad/nn/optim/sgd.h>
#include <minigrad/nn/serialize.h>

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;
using mg::cuda_test::require_equal;

namespace {

std::shared_ptr<nn::Sequential> mlp() {
  return std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(33, 17), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(17, 5)});
}

// Gradient g = p * p - 0.5 on both copies, computed on the CPU so that only the update
// itself runs on the GPU.
void set_grad_from(const Tensor& p) {
  const Tensor host = p.to(Device::cpu()).detach();
  const Tensor g = ops::binary_scalar(BinaryOp::Add, ops::binary(BinaryOp::Mul, host, host), -0.5);
  p.set_grad(ops::copy_to(g, p.device()));
}

}  // namespace

TEST_CASE("SGD on GPU parameters follows the CPU, for every option") {
  const optim::SGDOptions cases[] = {
      optim::SGDOptions(0.1),
      optim::SGDOptions(0.1).momentum(0.9),
      optim::SGDOptions(0.1).momentum(0.9).dampening(0.5),
      optim::SGDOptions(0.05).momentum(0.8).weight_decay(0.1).nesterov(true),
  };
  for (const auto& options : cases) {
    CAPTURE(options.momentum(), options.dampening(), options.weight_decay(), options.nesterov());
    const Tensor start = random_cpu({1000, 7}, 40);
    Tensor cpu_p = ops::clone(start).set_requires_grad(true);
    Tensor gpu_p = start.to(gpu()).detach().set_requires_grad(true);
    optim::SGD cpu_sgd({cpu_p}, options);
    optim::SGD gpu_sgd({gpu_p}, options);
    for (int step = 0; step < 4; ++step) {
      set_grad_from(cpu_p);
      set_grad_from(gpu_p);
      cpu_sgd.step();
      gpu_sgd.step();
      REQUIRE(gpu_p.device() == gpu());
      // The GPU may fuse x + alpha * y into one FMA: a few ulps from the CPU.
      require_close(gpu_p, cpu_p, 1e-5, 1e-6);
    }
    if (options.momentum() != 0) {
      REQUIRE(gpu_sgd.momentum_buffer(0).device() == gpu());
      require_close(gpu_sgd.momentum_buffer(0), cpu_sgd.momentum_buffer(0), 1e-5, 1e-6);
    }
    gpu_sgd.zero_grad(/*set_to_none=*/false);
    require_equal(gpu_p.grad(), zeros({1000, 7}));
  }
}

TEST_CASE("save a GPU module, load it into a GPU module in place, bit for bit") {
  mg::testing::TempDir dir;
  manual_seed(41);
  auto saved = mlp();
  saved->to(gpu());
  nn::save(*saved, (dir / "m.safetensors"));

  manual_seed(42);
  auto restored = mlp();
  restored->to(gpu());
  const auto handles = restored->parameters();
  nn::load(*restored, (dir / "m.safetensors"));
  const auto a = saved->parameters();
  const auto b = restored->parameters();
  for (size_t i = 0; i < a.size(); ++i) {
    REQUIRE(b[i].is_same(handles[i]));
    REQUIRE(b[i].device() == gpu());
    require_equal(b[i], a[i]);
  }

  // A mismatched file leaves the GPU module as it was.
  nn::save_tensors({{"0.weight", zeros({2, 2})}}, (dir / "bad.safetensors"));
  REQUIRE_THROWS_WITH(nn::load(*restored, (dir / "bad.safetensors")),
                      MG_CONTAINS("size mismatch for '0.weight': shape [2, 2]"));
  for (size_t i = 0; i < a.size(); ++i) require_equal(b[i], a[i]);
}

TEST_CASE("SGD state saved from the GPU resumes on the GPU and on the CPU") {
  mg::testing::TempDir dir;
  const Tensor start = random_cpu({33, 5}, 43);
  Tensor p = start.to(gpu()).detach().set_requires_grad(true);
  const auto options = optim::SGDOptions(0.1).momentum(0.9).weight_decay(0.01);
  optim::SGD sgd({p}, options);
  for (int step = 0; step < 3; ++step) {
    set_grad_from(p);
    sgd.step();
  }
  nn::Checkpoint ck;
  ck.put("model.", {{"p", p}});
  ck.put("optim.", sgd.state_dict());
  nn::save_tensors(ck, (dir / "ck.safetensors"));
  set_grad_from(p);
  sgd.step();

  const nn::Checkpoint loaded = nn::load_tensors((dir / "ck.safetensors"));
  for (const Device device : {gpu(), Device::cpu()}) {
    CAPTURE(device.str());
    Tensor q = loaded.get("model.").at("p").to(device).detach().set_requires_grad(true);
    optim::SGD resumed({q}, options);
    resumed.load_state_dict(loaded.get("optim."), (dir / "ck.safetensors"));
    REQUIRE(resumed.momentum_buffer(0).device() == device);
    set_grad_from(q);
    resumed.step();
    if (device == gpu()) {
      require_equal(q, p);  // same device, same kernels: bit for bit
    } else {
      require_close(q.to(gpu()), p, 1e-5, 1e-6);
    }
  }
}
