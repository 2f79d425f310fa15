// CUDAGraph: a whole training step (forward, cross-entropy, backward, SGD with momentum)
// captured once and replayed gives the parameters of the same number of eager steps, with
// the gradients made and dropped inside the graph (the allocator's capture path); and
// misuse is an mg::Error that says what to do.
#include "gpu_compare.h"

#include <cmath>

#include <minigrad/cuda/graph.h>
#include <minigrad/nn/layers.h>
#include <minigrad/nn/optim/sgd.h>

using namespace mg;
using mg::cuda_test::gpu;
using mg::cuda_test::random_cpu;
using mg::cuda_test::require_close;

namespace {

std::shared_ptr<nn::Sequential> make_mlp() {
  manual_seed(41);
  auto model = std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
      std::make_shared<nn::Linear>(33, 64), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(64, 17), std::make_shared<nn::ReLU>(),
      std::make_shared<nn::Linear>(17, 5)});
  model->to(gpu());
  return model;
}

struct Trainer {
  std::shared_ptr<nn::Sequential> model = make_mlp();
  optim::SGD sgd{model->parameters(), optim::SGDOptions(0.05).momentum(0.9)};
  Tensor x = random_cpu({29, 33}, 7).to(gpu());
  Tensor y;
  Trainer() {
    manual_seed(8);
    y = randint(0, 5, {29}).to(gpu());
  }
  // One step; the gradients are dropped at its end, so none outlives a captured step.
  Tensor step() {
    Tensor loss = cross_entropy(model->forward(x), y);
    loss.backward();
    sgd.step();
    sgd.zero_grad(/*set_to_none=*/true);
    return loss;
  }
};

}  // namespace

TEST_CASE("CUDAGraph: a captured training step replayed equals the eager steps") {
  constexpr int kSteps = 6;
  Trainer eager;
  for (int i = 0; i < kSteps; ++i) eager.step();

  Trainer graphed;
  graphed.step();  // outside the capture: momentum buffers and cuBLAS state are made here
  Tensor static_loss = zeros({}, DType::Float32, gpu());
  cuda::synchronize();
  cuda::CUDAGraph graph;
  graph.capture_begin();
  CHECK(graph.is_capturing());
  {
    Tensor loss = graphed.step();  // recorded, not run
    NoGradGuard no_grad;
    static_loss.copy_(loss);
  }
  graph.capture_end();
  CHECK(graph.is_ready());
  for (int i = 1; i < kSteps; ++i) graph.replay();
  cuda::synchronize();

  const auto p_eager = eager.model->parameters(), p_graph = graphed.model->parameters();
  REQUIRE(p_eager.size() == p_graph.size());
  for (size_t i = 0; i < p_eager.size(); ++i) require_close(p_graph[i], p_eager[i], 1e-6, 1e-7);
  // The loss of the last replay is the eager run's last loss.
  const float last_eager = [&] {
    NoGradGuard no_grad;
    return cross_entropy(eager.model->forward(eager.x), eager.y).item<float>();
  }();
  const float last_graph = [&] {
    NoGradGuard no_grad;
    return cross_entropy(graphed.model->forward(graphed.x), graphed.y).item<float>();
  }();
  CHECK(last_graph == Approx(last_eager).epsilon(1e-6));
  CHECK(std::isfinite(static_loss.item<float>()));

  // New inputs written in place are seen by the next replay.
  const Tensor before = ops::clone(p_graph[0]);
  graphed.x.copy_(random_cpu({29, 33}, 99).to(gpu()));
  graph.replay();
  cuda::synchronize();
  CHECK_FALSE(p_graph[0].to_vector<float>() == before.to_vector<float>());

  graph.reset();
  CHECK_FALSE(graph.is_ready());
  REQUIRE_THROWS_WITH(graph.replay(), MG_CONTAINS("CUDAGraph::replay: nothing to replay"));
}

TEST_CASE("CUDAGraph: misuse is an error that says what to do") {
  cuda::CUDAGraph graph;
  REQUIRE_THROWS_WITH(graph.capture_end(), MG_CONTAINS("CUDAGraph::capture_end: no capture is in progress"));
  REQUIRE_THROWS_WITH(graph.replay(), MG_CONTAINS("call capture_begin() and capture_end() first"));
  REQUIRE_THROWS_WITH(graph.capture_begin(cuda::device_count() + 3),
                      MG_CONTAINS("is not a visible device"));

  const Tensor a = random_cpu({8, 8}, 1).to(gpu());
  Tensor b = zeros({8, 8}, DType::Float32, gpu());
  graph.capture_begin();
  REQUIRE_THROWS_WITH(graph.capture_begin(), MG_CONTAINS("a capture is already in progress"));
  REQUIRE_THROWS_WITH(graph.reset(), MG_CONTAINS("a capture is in progress"));
  b.copy_(matmul(a, a));  // the product's own memory is the graph's, freed inside it
  graph.capture_end();
  REQUIRE_THROWS_WITH(graph.capture_begin(), MG_CONTAINS("already holds a capture; call reset() first"));
  graph.replay();
  cuda::synchronize();
  require_close(b.to(Device::cpu()), matmul(a.to(Device::cpu()), a.to(Device::cpu())), 1e-5, 1e-5);
}

TEST_CASE("CUDAGraph: a capture left open by an exception is discarded by the destructor") {
  const Tensor a = random_cpu({4, 4}, 2).to(gpu());
  {
    cuda::CUDAGraph graph;
    graph.capture_begin();
    Tensor b = add(a, a);
  }  // destroyed while capturing
  // The stream is usable again: eager work runs and gives the right answer.
  Tensor c = add(a, a);
  require_close(c.to(Device::cpu()), add(a.to(Device::cpu()), a.to(Device::cpu())), 0.0, 0.0);
}
