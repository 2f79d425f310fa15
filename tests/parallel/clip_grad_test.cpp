// parallel::clip_grad_norm_ (minigrad/parallel/clip_grad.h) in one process, over
// TensorParallel's ranks on CPU devices (no process group: every rank's shards are here):
// the norm is the single-device model's, every gradient is scaled as the single device
// scales it, the naive clip over every rank's tensors (each replica counted once per rank)
// is not; a weight recorded as Replicate where it is sharded (the parity fault) makes the
// norm wrong; and the errors. Tolerances: parallel/placement_check.h.
#include <cmath>
#include <limits>

#include "catch_compat.h"
#include "parallel/dp_check.h"
#include "parallel/placement_check.h"

#include <minigrad/core/fault_injection.h>
#include <minigrad/minigrad.h>

using namespace mg;
using mg::testing::cpus;

namespace {

// The plain MLP and its tensor-parallel twin over `ranks` CPU devices after one backward
// on the same batch. 6-8-6-4: a column/row pair, then a Linear left whole (replicated),
// beside the row layer's replicated bias.
struct Twins {
  std::shared_ptr<nn::Sequential> plain;
  std::shared_ptr<parallel::TensorParallel> tp;
};

Twins backward_both(int ranks) {
  manual_seed(21);
  Twins t;
  t.plain = std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({6, 8, 6, 4}));
  t.tp = std::make_shared<parallel::TensorParallel>(*t.plain, cpus(static_cast<size_t>(ranks)));
  manual_seed(22);
  const Tensor x = randn({9, 6});
  const Tensor y = randint(0, 4, {9});
  cross_entropy(t.plain->forward(x), y).backward();
  cross_entropy(t.tp->forward(x), y).backward();
  return t;
}

}  // namespace

TEST_CASE("parallel::clip_grad_norm_ in one process: the single-device norm and clipped gradients, each "
          "element counted once") {
  const double inf = std::numeric_limits<double>::infinity();
  for (int ranks : {2, 4}) {
    for (double norm_type : {2.0, 1.0, 3.0, inf}) {
      INFO(ranks << " ranks, norm " << norm_type);
      Twins t = backward_both(ranks);
      // K = 9: the batch's rows summed into a weight's gradient (the widest sum here).
      const auto tol = mg::testing::clip_tolerance(mg::testing::elements_of(t.plain->named_parameters()), 9);
      // Counted: every rank's column weight and bias and row weight, rank 0's replicas.
      CHECK(parallel::counted_gradients(t.tp->parameters()).size() == static_cast<size_t>(3 * ranks + 3));
      // The naive clip counts the replicated gradients once per rank: a larger norm.
      std::vector<Tensor> every_rank_grad;
      for (const Tensor& p : t.tp->parameters()) every_rank_grad.push_back(p.grad());
      const double naive = nn::utils::get_total_norm(every_rank_grad, norm_type).item<float>();

      const double want = nn::utils::clip_grad_norm_(t.plain->parameters(), 0.05, norm_type).item<float>();
      const double total = parallel::clip_grad_norm_(t.tp->parameters(), nullptr, 0.05, norm_type).item<float>();
      REQUIRE(want > 0.05);  // so the clip scales
      CHECK(std::fabs(total - want) / want <= tol.norm);
      if (!std::isinf(norm_type)) CHECK(naive > want * (1 + 100 * tol.norm));
      // Every clipped piece of every rank against its part of the single device's.
      std::vector<nn::NamedTensor> split;
      for (int r = 0; r < ranks; ++r)
        for (const auto& named : t.tp->shard(r)->named_parameters()) split.push_back(named);
      const auto e = mg::testing::compare_pieces(split, mg::testing::by_name(*t.plain, true), true);
      INFO(e.where);
      CHECK(e.compared == mg::testing::elements_of(t.plain->named_parameters()) +
                              (ranks - 1) * (6 + 24 + 4));  // the replicas: 2.bias, 3.weight, 3.bias
      CHECK(e.worst <= tol.gradient);
    }
  }
}

TEST_CASE("parallel::clip_grad_norm_: a sharded weight recorded as Replicate counts rank 0's rows alone") {
  Twins right = backward_both(2);
  const double want = parallel::clip_grad_norm_(right.tp->parameters(), nullptr, 0.05).item<float>();
  Twins wrong;
  {
    mg::testing::FaultGuard fault(mg::testing::Fault::PlacementReplicateWhereSharded);
    wrong = backward_both(2);
  }
  const double got = parallel::clip_grad_norm_(wrong.tp->parameters(), nullptr, 0.05).item<float>();
  // The first layer's weight gradient is most of the norm: leaving rank 1's rows out shows.
  CHECK(got < want * 0.999);
}

TEST_CASE("parallel::clip_grad_norm_: norm 0 with no gradients, and the errors of its arguments") {
  Twins t = backward_both(2);
  REQUIRE_THROWS_WITH(parallel::clip_grad_norm_(t.tp->parameters(), nullptr, -1.0),
                      MG_CONTAINS("clip_grad_norm_: max_norm must be >= 0, got -1"));
  REQUIRE_THROWS_WITH(parallel::clip_grad_norm_(t.tp->parameters(), nullptr, 1.0, 0.0),
                      MG_CONTAINS("clip_grad_norm_: norm_type must be > 0 or infinity, got 0"));
  REQUIRE_THROWS_WITH(parallel::clip_grad_norm_({Tensor()}, nullptr, 1.0),
                      MG_CONTAINS("clip_grad_norm_: parameter 0 is an undefined tensor"));
  const Tensor bad = t.tp->parameters()[0];
  Tensor(bad.grad()).fill_(NAN);
  const std::vector<float> before = t.tp->parameters()[1].grad().to_vector<float>();
  REQUIRE_THROWS_WITH(parallel::clip_grad_norm_(t.tp->parameters(), nullptr, 1.0, 2.0, true),
                      MG_CONTAINS("the total norm of order 2 of the gradients is nan"));
  CHECK(t.tp->parameters()[1].grad().to_vector<float>() == before);  // nothing scaled
  t.tp->zero_grad();
  CHECK(parallel::clip_grad_norm_(t.tp->parameters(), nullptr, 1.0).item<float>() == 0.0f);
}
