// Where to cut a model into stages: the block partition, balance_by_size (one huge
// layer ends up alone) and balance_by_time.
#include "catch_compat.h"

#include "parallel/pipe_check.h"

using mg::Device;
using mg::Tensor;
using mg::parallel::balance_costs;

TEST_CASE("balance_costs: contiguous stages whose largest sum is as small as possible") {
  REQUIRE(balance_costs({1, 1, 1, 1}, 2) == std::vector<int64_t>{2, 2});
  REQUIRE(balance_costs({1, 1, 100, 1, 1}, 3) == std::vector<int64_t>{2, 1, 2});
  REQUIRE(balance_costs({5, 1, 1, 1, 1, 1}, 2) == std::vector<int64_t>{1, 5});
  REQUIRE(balance_costs({3, 3, 3}, 3) == std::vector<int64_t>{1, 1, 1});
  REQUIRE(balance_costs({2, 7}, 1) == std::vector<int64_t>{2});
  // The largest stage of the result is the smallest possible: check against every cut.
  const std::vector<double> costs{4, 9, 2, 2, 8, 1, 7, 3};
  const auto best = balance_costs(costs, 3);
  auto largest = [&](const std::vector<int64_t>& parts) {
    double most = 0;
    size_t i = 0;
    for (int64_t n : parts) {
      double sum = 0;
      for (int64_t k = 0; k < n; ++k) sum += costs[i++];
      most = std::max(most, sum);
    }
    return most;
  };
  for (int64_t a = 1; a < 7; ++a)
    for (int64_t b = 1; a + b < 8; ++b) REQUIRE(largest(best) <= largest({a, b, 8 - a - b}));
  REQUIRE_THROWS_WITH(balance_costs({1, 2}, 3),
                      MG_CONTAINS("balance: 2 layers cannot be cut into 3 stages"));
}

TEST_CASE("balance_by_size puts one huge layer in a stage of its own") {
  mg::manual_seed(61);
  // Small, small, huge (a 512 x 512 weight and wide activations), small, small.
  auto model = std::make_shared<mg::nn::Sequential>(std::initializer_list<mg::nn::ModulePtr>{
      std::make_shared<mg::nn::Linear>(8, 16), std::make_shared<mg::nn::Linear>(16, 512),
      std::make_shared<mg::nn::Linear>(512, 512), std::make_shared<mg::nn::Linear>(512, 16),
      std::make_shared<mg::nn::Linear>(16, 4)});
  const Tensor sample = mg::randn({32, 8});
  const auto sizes = mg::parallel::layer_sizes(model, sample);
  REQUIRE(sizes.size() == 5);
  // Layer 2: 2 x its parameters, and its 32 x 512 output.
  REQUIRE(sizes[2] >= 2.0 * (512 * 512 + 512) * 4 + 32 * 512 * 4);
  const auto balance = mg::parallel::balance_by_size(model, mg::testing::cpus(3), sample);
  REQUIRE(balance == std::vector<int64_t>{2, 1, 2});
  // The result is a balance a Pipe takes; the model trains as before.
  mg::parallel::PipeOptions options;
  options.balance = balance;
  options.chunks = 4;
  mg::parallel::Pipe pipe(model, mg::testing::cpus(3), options);
  REQUIRE(pipe.stage(1)->size() == 1);
  REQUIRE(pipe.stage(1)->named_children().front().first == "2");
  REQUIRE_THROWS_WITH(mg::parallel::balance_by_size(std::make_shared<mg::nn::Linear>(2, 2),
                                                    mg::testing::cpus(2), sample),
                      MG_CONTAINS("balance_by_size: the module must be an nn::Sequential; got Linear"));
}

TEST_CASE("balance_by_time cuts by measured time and leaves the gradients as they were") {
  mg::manual_seed(62);
  // The middle layer costs about 64 times the others.
  auto model = std::make_shared<mg::nn::Sequential>(std::initializer_list<mg::nn::ModulePtr>{
      std::make_shared<mg::nn::Linear>(32, 32), std::make_shared<mg::nn::Linear>(32, 32),
      std::make_shared<mg::nn::Linear>(32, 2048), std::make_shared<mg::nn::Linear>(2048, 32),
      std::make_shared<mg::nn::Linear>(32, 32)});
  const Tensor sample = mg::randn({64, 32});
  auto first = std::dynamic_pointer_cast<mg::nn::Linear>((*model)[0]);
  first->weight().set_grad(mg::ones({32, 32}));
  const auto times = mg::parallel::layer_times(model, sample, 5);
  REQUIRE(times.size() == 5);
  for (double t : times) REQUIRE(t > 0.0);
  REQUIRE(first->weight().grad().to_vector<float>() == std::vector<float>(32 * 32, 1.0f));
  REQUIRE_FALSE((*model)[2]->parameters()[0].grad().defined());
  const auto balance = mg::parallel::balance_by_time(model, mg::testing::cpus(2), sample, 5);
  REQUIRE(balance.size() == 2);
  REQUIRE(balance[0] + balance[1] == 5);
  // The two wide layers (2 and 3) are the expensive ones: the cut falls between them.
  REQUIRE(balance[0] == 3);
}
