// replicate: replicas on each device whose parameters are outputs of one Broadcast node;
// its backward sums the replicas' gradients into the originals.
#include "catch_compat.h"

#include "parallel/dp_check.h"

#include <minigrad/minigrad.h>

using mg::Device;
using mg::Tensor;

using mg::testing::cpus;

namespace {

// A module with a buffer, to see buffers copied.
class Scaled : public mg::nn::Cloneable<Scaled> {
 public:
  Scaled() : Cloneable<Scaled>("Scaled") {
    register_parameter("weight", mg::randn({2, 3}));
    register_buffer("scale", mg::full({1}, 2.0));
  }
  Tensor forward(const Tensor& x) override {
    return mg::linear(x, parameter("weight")) * buffer("scale");
  }
};
}  // namespace

TEST_CASE("replicas hold the same values and only replica 0 shares memory with the originals") {
  auto mlp = mg::testing::make_mlp({4, 5, 3});
  const auto replicas = mg::parallel::replicate(mlp, cpus(3));
  REQUIRE(replicas.size() == 3);
  const auto originals = mlp->named_parameters();
  std::shared_ptr<mg::Node> broadcast;
  for (size_t i = 0; i < replicas.size(); ++i) {
    REQUIRE(replicas[i] != mlp);
    REQUIRE(replicas[i]->str() == mlp->str());
    const auto params = replicas[i]->named_parameters();
    REQUIRE(params.size() == originals.size());
    for (size_t k = 0; k < params.size(); ++k) {
      REQUIRE(params[k].first == originals[k].first);
      mg::testing::require_close(params[k].second, originals[k].second, params[k].first, 0, 0);
      // Non-leaf outputs of one Broadcast node, so gradients flow to the originals.
      REQUIRE_FALSE(params[k].second.is_leaf());
      REQUIRE(params[k].second.requires_grad());
      if (!broadcast) broadcast = params[k].second.grad_fn();
      REQUIRE(params[k].second.grad_fn() == broadcast);
      REQUIRE(params[k].second.storage().is_alias_of(originals[k].second.storage()) == (i == 0));
    }
  }
  REQUIRE(broadcast->name() == "BroadcastBackward");
  REQUIRE(broadcast->next_edges().size() == originals.size());
  REQUIRE(broadcast->outputs().size() == originals.size() * 3);
  // The original module is untouched.
  for (const auto& [name, p] : mlp->named_parameters()) REQUIRE(p.is_leaf());
}

TEST_CASE("Broadcast's backward sums every replica's gradient into the originals") {
  auto linear = std::make_shared<mg::nn::Linear>(3, 2);
  const auto replicas = mg::parallel::replicate(linear, cpus(4));
  // Each replica's loss is the sum of its bias: d/d bias = 1 per replica, 4 in all.
  Tensor loss = replicas[0]->parameter("bias").sum();
  for (size_t i = 1; i < replicas.size(); ++i) loss = loss + replicas[i]->parameter("bias").sum();
  loss.backward();
  REQUIRE(linear->bias().grad().to_vector<float>() == std::vector<float>{4, 4});
  // The weight was not used by any replica: its gradient is zeros from the reduce.
  REQUIRE(linear->weight().grad().to_vector<float>() == std::vector<float>(6, 0.f));
}

TEST_CASE("replicate copies buffers outside the graph") {
  mg::manual_seed(21);
  auto m = std::make_shared<Scaled>();
  const auto replicas = mg::parallel::replicate(m, cpus(2));
  const Tensor b0 = replicas[0]->buffer("scale");
  const Tensor b1 = replicas[1]->buffer("scale");
  REQUIRE(b0.is_same(m->buffer("scale")));
  REQUIRE_FALSE(b1.storage().is_alias_of(m->buffer("scale").storage()));
  REQUIRE(b1.to_vector<float>() == std::vector<float>{2});
  REQUIRE_FALSE(b1.requires_grad());
  const Tensor x = mg::randn({3, 3});
  mg::testing::require_close(replicas[1]->forward(x), m->forward(x), "output", 0, 0);
}

TEST_CASE("replicate builds no graph without grad mode or for frozen parameters") {
  auto linear = std::make_shared<mg::nn::Linear>(3, 2);
  {
    mg::NoGradGuard no_grad;
    for (const auto& r : mg::parallel::replicate(linear, cpus(2)))
      for (const Tensor& p : r->parameters()) REQUIRE(p.grad_fn() == nullptr);
  }
  linear->weight().set_requires_grad(false);
  const auto replicas = mg::parallel::replicate(linear, cpus(2));
  REQUIRE(replicas[1]->parameter("weight").grad_fn() == nullptr);
  REQUIRE_FALSE(replicas[1]->parameter("weight").requires_grad());
  REQUIRE(replicas[1]->parameter("bias").grad_fn() != nullptr);
  // Only the trainable parameter is an input of the node.
  REQUIRE(replicas[1]->parameter("bias").grad_fn()->next_edges().size() == 1);
}

TEST_CASE("replicate errors") {
  REQUIRE_THROWS_WITH(mg::parallel::replicate(nullptr, cpus(2)),
                      MG_CONTAINS("replicate: the module is null"));
  REQUIRE_THROWS_WITH(mg::parallel::replicate(std::make_shared<mg::nn::Linear>(2, 2), {}),
                      MG_CONTAINS("replicate: expected at least one device"));
}
