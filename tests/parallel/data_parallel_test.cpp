// DataParallel on CPU replicas: the central test (same numbers as the plain module),
// the single-device path, names, and the errors a user can run into.
#include "catch_compat.h"

#include "parallel/dp_check.h"

#include <thread>

#include <minigrad/minigrad.h>

using mg::Device;
using mg::Shape;
using mg::Tensor;
using mg::parallel::DataParallel;

namespace {
const std::vector<Device> kTwoCpus{Device::cpu(), Device::cpu()};
const std::vector<Device> kFourCpus{Device::cpu(), Device::cpu(), Device::cpu(), Device::cpu()};
}  // namespace

TEST_CASE("DataParallel over two CPU replicas matches the plain module in loss and grads and after SGD steps") {
  mg::manual_seed(1);
  // Uneven splits (7 = 4 + 3, 33 = 17 + 16) and a batch of one (a single replica).
  for (int64_t batch : {1, 2, 7, 30, 33}) mg::testing::check_data_parallel_matches_plain({5, 7, 3}, batch, kTwoCpus);
  mg::testing::check_data_parallel_matches_plain({13, 32, 16, 10}, 19, kTwoCpus);
}

TEST_CASE("DataParallel over four CPU replicas matches the plain module in loss and grads and after SGD steps") {
  mg::manual_seed(2);
  // 30 -> 8 8 8 6; 9 -> 3 3 3 (three replicas); 2 and 3: fewer rows than replicas.
  for (int64_t batch : {30, 9, 2, 3, 5}) mg::testing::check_data_parallel_matches_plain({5, 7, 3}, batch, kFourCpus);
  mg::testing::check_data_parallel_matches_plain({4, 16, 16, 2}, 41, kFourCpus, 4);
  mg::testing::check_data_parallel_matches_plain({20, 3}, 6, kFourCpus);
}

TEST_CASE("DataParallel over one device runs the module directly") {
  mg::manual_seed(3);
  mg::testing::check_data_parallel_matches_plain({6, 5, 4}, 10, {Device::cpu()});
  auto linear = std::make_shared<mg::nn::Linear>(3, 2);
  DataParallel dp(linear, {Device::cpu()});
  const Tensor x = mg::randn({4, 3});
  const Tensor out = dp.forward(x);
  // One device: no Scatter/Gather/Broadcast in the graph, just the module's own ops.
  REQUIRE(out.grad_fn() != nullptr);
  REQUIRE(out.grad_fn()->name() != "GatherBackward");
}

TEST_CASE("DataParallel's graph has one Scatter and one Broadcast and one Gather node") {
  mg::manual_seed(4);
  auto linear = std::make_shared<mg::nn::Linear>(3, 2);
  DataParallel dp(linear, kFourCpus);
  const Tensor x = mg::randn({10, 3}).set_requires_grad(true);
  const Tensor out = dp.forward(x);
  REQUIRE(out.grad_fn()->name() == "GatherBackward");
  REQUIRE(out.grad_fn()->next_edges().size() == 4);  // 10 rows -> 3 3 3 1
  out.sum().backward();
  // x's gradient went through ScatterBackward (gathered back); every row got ones @ W.
  const Tensor expected = mg::ones({10, 2}).matmul(linear->weight());
  mg::testing::require_close(x.grad(), expected, "input grad", 1e-6, 1e-6);
  // The bias gradient is the number of rows, summed over the replicas (not averaged).
  REQUIRE(linear->bias().grad().to_vector<float>() == std::vector<float>{10, 10});
}

TEST_CASE("DataParallel registers the wrapped module as 'module' as PyTorch does") {
  auto mlp = mg::testing::make_mlp({4, 3, 2});
  DataParallel dp(mlp, kTwoCpus);
  const auto names = dp.named_parameters();
  REQUIRE(names.size() == 4);
  REQUIRE(names[0].first == "module.0.weight");
  REQUIRE(names[3].first == "module.2.bias");
  REQUIRE(dp.module() == mlp);
  REQUIRE(dp.output_device() == Device::cpu());
  REQUIRE(dp.str().find("DataParallel(device_ids=[cpu, cpu], output_device=cpu, dim=0") == 0);
}

TEST_CASE("DataParallel without device_ids and without GPUs runs the module as it is") {
  if (!mg::parallel::visible_gpus().empty()) return;  // the GPU case is tests/cuda
  mg::manual_seed(5);
  auto linear = std::make_shared<mg::nn::Linear>(3, 2);
  DataParallel dp(linear);
  REQUIRE(dp.device_ids().empty());
  REQUIRE_FALSE(dp.output_device().has_value());
  const Tensor x = mg::randn({4, 3});
  mg::testing::require_close(dp.forward(x), linear->forward(x), "output", 0, 0);
  mg::testing::require_close(mg::parallel::data_parallel(linear, x), linear->forward(x), "output",
                             0, 0);
}

TEST_CASE("data_parallel() gives the module's output and gradients") {
  mg::manual_seed(6);
  auto mlp = mg::testing::make_mlp({5, 8, 3});
  auto reference = mlp->clone();
  const Tensor x = mg::randn({11, 5});
  const Tensor out = mg::parallel::data_parallel(mlp, x, kFourCpus);
  mg::testing::require_close(out, reference->forward(x), "output", 1e-6, 1e-6);
  out.sum().backward();
  reference->forward(x).sum().backward();
  const auto p = mlp->parameters();
  const auto q = reference->parameters();
  for (size_t k = 0; k < p.size(); ++k) mg::testing::require_close(p[k].grad(), q[k].grad(), "grad", 1e-5, 1e-6);
}

TEST_CASE("DataParallel splits along another dim when asked") {
  // A module that works on [features, batch] inputs: y = W x.
  class ColumnLinear : public mg::nn::Cloneable<ColumnLinear> {
   public:
    ColumnLinear() : Cloneable<ColumnLinear>("ColumnLinear") {
      register_parameter("weight", mg::randn({2, 3}));
    }
    Tensor forward(const Tensor& x) override { return parameter("weight").matmul(x); }
  };
  mg::manual_seed(7);
  auto m = std::make_shared<ColumnLinear>();
  DataParallel dp(m, kFourCpus, std::nullopt, 1);
  const Tensor x = mg::randn({3, 10});
  const Tensor out = dp.forward(x);
  REQUIRE(out.shape() == Shape{2, 10});
  mg::testing::require_close(out, m->parameter("weight").matmul(x), "output", 1e-6, 1e-6);
  out.sum().backward();
  const Tensor expected = mg::ones({2, 10}).matmul(x.t());
  mg::testing::require_close(m->parameter("weight").grad(), expected, "grad", 1e-5, 1e-6);
}

TEST_CASE("DataParallel nested in DataParallel still matches the plain module") {
  // The inner parallel_apply runs on a pool thread: it must not wait for the pool.
  mg::manual_seed(8);
  auto mlp = mg::testing::make_mlp({4, 6, 2});
  auto reference = mlp->clone();
  auto inner = std::make_shared<DataParallel>(mlp, kTwoCpus);
  DataParallel outer(inner, kTwoCpus);
  const Tensor x = mg::randn({9, 4});
  const Tensor out = outer.forward(x);
  mg::testing::require_close(out, reference->forward(x), "output", 1e-6, 1e-6);
  out.sum().backward();
  reference->forward(x).sum().backward();
  const auto p = mlp->parameters();
  const auto q = reference->parameters();
  for (size_t k = 0; k < p.size(); ++k) mg::testing::require_close(p[k].grad(), q[k].grad(), "grad", 1e-5, 1e-6);
}

TEST_CASE("DataParallel used from two threads at once gives each its own result") {
  mg::manual_seed(9);
  auto a = mg::testing::make_mlp({4, 6, 2});
  auto b = mg::testing::make_mlp({4, 6, 2});
  const Tensor x = mg::randn({12, 4});
  Tensor out_a, out_b;
  std::thread ta([&] { out_a = mg::parallel::data_parallel(a, x, kFourCpus); });
  std::thread tb([&] { out_b = mg::parallel::data_parallel(b, x, kFourCpus); });
  ta.join();
  tb.join();
  mg::testing::require_close(out_a, a->forward(x), "output a", 1e-6, 1e-6);
  mg::testing::require_close(out_b, b->forward(x), "output b", 1e-6, 1e-6);
}

TEST_CASE("DataParallel errors name what is wrong") {
  auto linear = std::make_shared<mg::nn::Linear>(3, 2);
  REQUIRE_THROWS_WITH(DataParallel(linear, std::vector<Device>{}),
                      MG_CONTAINS("DataParallel: device_ids is empty"));
  REQUIRE_THROWS_WITH(DataParallel(nullptr, kTwoCpus), MG_CONTAINS("DataParallel: the module is null"));
  REQUIRE_THROWS_WITH(DataParallel(linear, {Device::cpu(), Device::cuda(0)}),
                      MG_CONTAINS("DataParallel: device_ids [cpu, cuda:0] mixes device types"));
  const int gpus = static_cast<int>(mg::parallel::visible_gpus().size());
  const Device missing = Device::cuda(gpus);
  REQUIRE_THROWS_WITH(DataParallel(linear, {missing}),
                      MG_CONTAINS(fmt::format("DataParallel: device_ids[0] is {}, but", missing)));
  REQUIRE_THROWS_WITH(DataParallel(linear, kTwoCpus, missing),
                      MG_CONTAINS(fmt::format("DataParallel: output_device {} is not a visible device",
                                              missing)));

  DataParallel dp(linear, kTwoCpus);
  REQUIRE_THROWS_WITH(dp.forward(mg::zeros({0, 3})),
                      MG_CONTAINS("DataParallel: the input batch is empty (shape [0, 3], size 0 "
                                  "along dim 0); there is nothing to scatter over device_ids [cpu, cpu]"));
  REQUIRE_THROWS_WITH(dp.forward(mg::scalar_tensor(1.0)),
                      MG_CONTAINS("DataParallel: the input is a scalar (shape [])"));
  // A replica's own error comes back with the replica index and device.
  REQUIRE_THROWS_WITH(dp.forward(mg::zeros({4, 5})),
                      MG_CONTAINS("parallel_apply: replica 0 on cpu failed:"));
  REQUIRE_THROWS_WITH(mg::parallel::data_parallel(linear, mg::zeros({4, 3}), {}),
                      MG_CONTAINS("data_parallel: device_ids is empty"));
}

TEST_CASE("DataParallel of a module without parameters") {
  mg::manual_seed(10);
  DataParallel dp(std::make_shared<mg::nn::ReLU>(), kFourCpus);
  const Tensor x = mg::randn({7, 3}).set_requires_grad(true);
  const Tensor out = dp.forward(x);
  mg::testing::require_close(out, mg::relu(x), "output", 0, 0);
  out.sum().backward();
  // d relu(x) / dx: 1 where x > 0, else 0; through Gather, 4 replicas, and Scatter.
  const std::vector<float> values = x.to_vector<float>();
  const std::vector<float> grads = x.grad().to_vector<float>();
  REQUIRE(grads.size() == values.size());
  for (size_t i = 0; i < values.size(); ++i) REQUIRE(grads[i] == (values[i] > 0 ? 1.f : 0.f));
}
