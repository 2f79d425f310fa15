// The parallel layer on GPUs: the central test with replicas on cuda:0 once, twice and
// four times (the host communicator: NCCL refuses two ranks on one GPU), on distinct
// GPUs with NCCL when the machine has them, the streams parallel_apply runs replicas on,
// model parallelism across the host/GPU boundary, and the error for a module whose
// parameters are not on device_ids[0]. Skipped (exit 77) without a GPU.
#include "gpu_compare.h"

#include "parallel/dp_check.h"

#include <minigrad/nn/layers.h>

using mg::Device;
using mg::Tensor;
using mg::parallel::DataParallel;

namespace {

std::vector<Device> gpu0_times(size_t n) { return std::vector<Device>(n, Device::cuda(0)); }

// Checks, inside forward, that its device has the expected stream current.
class StreamProbe : public mg::nn::Cloneable<StreamProbe> {
 public:
  explicit StreamProbe(mg::Stream expected) : Cloneable<StreamProbe>("StreamProbe"), expected_(expected) {
    register_parameter("weight", mg::ones({1}, mg::DType::Float32, Device::cuda(0)));
  }
  Tensor forward(const Tensor& x) override {
    MG_CHECK(mg::current_stream(x.device()) == expected_,
             "StreamProbe: the replica on {} does not run on the expected stream", x.device());
    return x * parameter("weight");
  }

 private:
  mg::Stream expected_;
};

}  // namespace

TEST_CASE("DataParallel on cuda:0 once, twice and four times matches the plain module [gpu]") {
  mg::manual_seed(31);
  // GPU matmuls of different row counts may pick different kernels: a little looser.
  mg::testing::check_data_parallel_matches_plain({5, 7, 3}, 30, gpu0_times(1), 3, 1e-4, 1e-5);
  for (int64_t batch : {2, 7, 30, 33})
    mg::testing::check_data_parallel_matches_plain({5, 7, 3}, batch, gpu0_times(2), 3, 1e-4, 1e-5);
  for (int64_t batch : {3, 9, 30, 129})
    mg::testing::check_data_parallel_matches_plain({13, 64, 32, 10}, batch, gpu0_times(4), 3, 1e-4,
                                                   1e-5);
}

TEST_CASE("DataParallel over distinct GPUs uses NCCL and matches the plain module [gpu]") {
  const int count = mg::cuda::device_count();
  if (count < 2) return;  // one GPU: the repeated-device test above covers this machine
  std::vector<Device> gpus;
  for (int i = 0; i < count; ++i) gpus.push_back(Device::cuda(i));
#ifdef MINIGRAD_WITH_NCCL
  REQUIRE(mg::parallel::communicator_for(gpus)->name() == "nccl");
#endif
  mg::manual_seed(32);
  for (int64_t batch : {1, 5, 64, 67})
    mg::testing::check_data_parallel_matches_plain({13, 64, 10}, batch, gpus, 3, 1e-4, 1e-5);
  std::vector<Tensor> grads;
  for (int i = 0; i < count; ++i) grads.push_back(mg::full({3}, 1.0 + i, mg::DType::Float32, gpus[i]));
  const Tensor sum = mg::parallel::reduce_add(grads, gpus);
  REQUIRE(sum.device() == gpus[0]);
  REQUIRE(sum.to_vector<float>() == std::vector<float>(3, float(count * (count + 1) / 2)));
}

TEST_CASE("scatter and gather move pieces between the host and the GPU [gpu]") {
  mg::manual_seed(33);
  const Tensor x = mg::randn({10, 3}).set_requires_grad(true);  // on the host
  const auto pieces = mg::parallel::scatter(x, gpu0_times(3));
  REQUIRE(pieces.size() == 3);
  for (const Tensor& p : pieces) REQUIRE(p.device() == Device::cuda(0));
  const Tensor back = mg::parallel::gather(pieces, Device::cpu());
  REQUIRE(back.device() == Device::cpu());
  mg::cuda_test::require_close(back, x.detach(), 0, 0);
  (back * 3.0).sum().backward();
  REQUIRE(x.grad().device() == Device::cpu());
  REQUIRE(x.grad().to_vector<float>() == std::vector<float>(30, 3.f));
}

TEST_CASE("DataParallel takes host input and can gather onto the host [gpu]") {
  mg::manual_seed(34);
  auto mlp = mg::testing::make_mlp({6, 8, 4});
  auto reference = mlp->clone();  // on the host
  mlp->to(Device::cuda(0));
  DataParallel dp(mlp, gpu0_times(2), Device::cpu());
  const Tensor x = mg::randn({9, 6});
  const Tensor out = dp.forward(x);
  REQUIRE(out.device() == Device::cpu());
  mg::cuda_test::require_close(out, reference->forward(x), 1e-4, 1e-5);
}

TEST_CASE("replicas run on the compute stream or on the stream the caller chose [gpu]") {
  mg::manual_seed(35);
  const Device gpu = Device::cuda(0);
  {
    DataParallel dp(std::make_shared<StreamProbe>(mg::compute_stream(gpu)), gpu0_times(4));
    const Tensor x = mg::randn({4096, 8}, gpu);
    mg::cuda_test::require_close(dp.forward(x), x, 0, 0);
  }
  // The caller works on another stream (here the copy stream stands in for a user's
  // stream): the replicas follow it, so what they allocate is used and freed in the
  // caller's stream order.
  mg::StreamGuard guard(mg::copy_stream(gpu));
  DataParallel dp(std::make_shared<StreamProbe>(mg::copy_stream(gpu)), gpu0_times(4));
  const Tensor x = mg::randn({4096, 8}, gpu);
  mg::cuda_test::require_close(dp.forward(x), x, 0, 0);
}

TEST_CASE("a module with a parameter off device_ids[0] gets the model-parallel error [gpu]") {
  // layer1 on the GPU, layer2 left on the host: model parallel, not replicable.
  auto model = std::make_shared<mg::nn::Sequential>(std::initializer_list<mg::nn::ModulePtr>{
      std::make_shared<mg::nn::Linear>(4, 3), std::make_shared<mg::nn::Linear>(3, 2)});
  (*model)[0]->to(Device::cuda(0));
  DataParallel dp(model, gpu0_times(2));
  REQUIRE_THROWS_WITH(dp.forward(mg::randn({4, 4}, Device::cuda(0))),
                      MG_CONTAINS("DataParallel: module must have its parameters and buffers on "
                                  "device_ids[0] (cuda:0), but parameter '1.weight' is on cpu"));
  REQUIRE_THROWS_WITH(dp.forward(mg::randn({4, 4}, Device::cuda(0))),
                      MG_CONTAINS("model parallelism"));
}

TEST_CASE("model parallel across the host and the GPU gives the single-device gradients [gpu]") {
  mg::manual_seed(36);
  auto layer1 = std::make_shared<mg::nn::Linear>(10, 5);
  auto layer2 = std::make_shared<mg::nn::Linear>(5, 2);
  auto ref1 = layer1->clone();
  auto ref2 = layer2->clone();
  layer1->to(Device::cuda(0));  // layer2 stays on the host
  const Tensor x = mg::randn({64, 10});
  const Tensor targets = mg::randint(0, 2, {64});
  const Tensor h = mg::relu(layer1->forward(x.to(Device::cuda(0))));
  mg::cross_entropy(layer2->forward(h.to(Device::cpu())), targets).backward();
  mg::cross_entropy(ref2->forward(mg::relu(ref1->forward(x))), targets).backward();
  mg::cuda_test::require_close(layer1->weight().grad().to(Device::cpu()),
                               ref1->parameter("weight").grad(), 1e-4, 1e-6);
  mg::cuda_test::require_close(layer2->weight().grad(), ref2->parameter("weight").grad(), 1e-4, 1e-6);
}
