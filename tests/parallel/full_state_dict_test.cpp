// The full state dicts (minigrad/parallel/full_state_dict.h, full_optimizer_state.h) and
// reduce_partial_gradients in one process, over TensorParallel's ranks (no process group:
// every rank's pieces are here). The parameters gathered from any split are the single
// device's bit for bit; a dict loaded into another split gathers back to itself; the
// optimizer's state after AdamW steps is the single device's under its names; and every
// error names what is wrong: a missing name, a wrong shape, a placement that does not
// divide, pieces missing (a shard recorded as Replicate) or sent twice.
#include "catch_compat.h"
#include "parallel/dp_check.h"
#include "parallel/placement_check.h"

#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/minigrad.h>

using namespace mg;
using mg::testing::cpus;

namespace {

std::shared_ptr<nn::Sequential> mlp(uint64_t seed) {
  manual_seed(seed);
  return std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({6, 12, 6, 4}));
}

// Every rank's parameters of `tp` (their specs name them).
std::vector<nn::NamedTensor> every_rank(const parallel::TensorParallel& tp) {
  std::vector<nn::NamedTensor> out;
  for (int r = 0; r < static_cast<int>(tp.devices().size()); ++r)
    for (const auto& named : tp.shard(r)->named_parameters()) out.push_back(named);
  return out;
}

void require_bitwise(const nn::TensorDict& got, const nn::TensorDict& want) {
  REQUIRE(got.size() == want.size());
  for (const auto& [name, t] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    CHECK(got.at(name).shape() == t.shape());
    CHECK(got.at(name).contiguous().to_vector<float>() == t.contiguous().to_vector<float>());
  }
}

}  // namespace

TEST_CASE("full_state_dict in one process: any tp split gathers to the single-device state dict, bit for bit, "
          "and loads into another") {
  auto plain = mlp(5);
  const nn::TensorDict want = nn::state_dict(*plain);
  for (size_t ranks : {2u, 3u}) {
    INFO(ranks << " ranks");
    parallel::TensorParallel tp(*plain, cpus(ranks));
    require_bitwise(parallel::full_state_dict(every_rank(tp), nullptr), want);
    // Another model's split, loaded with the dict, is the first one's.
    parallel::TensorParallel other(*mlp(6), cpus(ranks));
    parallel::load_full_state_dict(every_rank(other), want);
    require_bitwise(parallel::full_state_dict(every_rank(other), nullptr), want);
  }
}

TEST_CASE("full_state_dict: a shard recorded as Replicate, and a replica recorded as nothing, are named") {
  auto plain = mlp(5);
  {
    mg::testing::FaultGuard fault(mg::testing::Fault::PlacementReplicateWhereSharded);
    parallel::TensorParallel wrong(*plain, cpus(2));
    // Rank 0's rows claim to be the whole weight: the dict holds a [6, 6] '0.weight', which
    // the single-device model refuses, naming it.
    const nn::TensorDict dict = parallel::full_state_dict(every_rank(wrong), nullptr);
    CHECK(dict.at("0.weight").shape() == Shape{6, 6});
    REQUIRE_THROWS_WITH(nn::check_state_dict(*plain, dict), MG_CONTAINS("0.weight"));
  }
  // The same whole tensor from two holders with no placement saying they are replicas.
  const Tensor a = plain->parameters()[0], b = ops::clone(a.detach());
  REQUIRE_THROWS_WITH(parallel::full_state_dict({{"w", a}, {"w", b}}, nullptr),
                      MG_CONTAINS("full_state_dict: 'w' came twice, from ranks 0 and 0 alike (w [12, 6]): a replica "
                                  "whose placement says nothing"));
  // A shard whose other rank sent nothing: half the elements.
  const Tensor half = ops::clone(a.detach().narrow(0, 0, 6));
  parallel::record_placement(half, "w", Shape{12, 6}, {"tp", nullptr, 0, 2, parallel::Placement::shard(0), false});
  REQUIRE_THROWS_WITH(parallel::full_state_dict({{"w", half}}, nullptr),
                      MG_CONTAINS("full_state_dict: the ranks sent 36 of the 72 elements of 'w' [12, 6]: some are "
                                  "missing; is a shard recorded as Replicate"));
}

TEST_CASE("load_full_state_dict: a missing name, a wrong shape, a placement that does not divide, each named, "
          "and nothing written") {
  auto plain = mlp(5);
  parallel::TensorParallel tp(*plain, cpus(2));
  const nn::TensorDict good = nn::state_dict(*mlp(9));
  nn::TensorDict bad = good;
  bad.erase("2.bias");
  bad["0.weight"] = zeros(Shape{12, 5});
  const std::vector<float> before = tp.parameters()[0].to_vector<float>();
  try {
    parallel::load_full_state_dict(every_rank(tp), bad, "bad.safetensors");
    FAIL("no error");
  } catch (const Error& e) {
    const std::string what = e.what();
    CHECK_THAT(what, MG_CONTAINS("load_full_state_dict: bad.safetensors does not fit this rank's tensors (4 problems)"));
    CHECK_THAT(what, MG_CONTAINS("'2.bias' is missing ([6] on one device)"));
    CHECK_THAT(what, MG_CONTAINS("'0.weight' is [12, 5] (float32), but the model's is [12, 6] (float32)"));
  }
  CHECK(tp.parameters()[0].to_vector<float>() == before);  // a bad dict changes nothing
  // A placement that does not divide the single-device tensor (set by hand: record_placement
  // itself refuses one).
  const Tensor odd = zeros(Shape{4, 6});
  parallel::set_spec(odd, {parallel::ParameterPiece{
                              "0.weight", Shape{12, 6}, {{"tp", nullptr, 1, 5, parallel::Placement::shard(0), false}},
                              std::nullopt}});
  REQUIRE_THROWS_WITH(parallel::load_full_state_dict({{"x", odd}}, good),
                      MG_CONTAINS("'0.weight' cannot be placed: placement of '0.weight': Shard(0) over 5 ranks does "
                                  "not divide dimension 0 of shape [12, 6] (12 is not a multiple of 5)"));
}

TEST_CASE("full_optimizer_state in one process: AdamW's state over tp shards is the single device's under its "
          "names, and loads into another split") {
  auto plain = mlp(5);
  parallel::TensorParallel tp(*plain, cpus(2));
  const auto make = [](std::vector<Tensor> params) {
    return std::make_unique<optim::AdamW>(std::move(params), optim::AdamWOptions(1e-2));
  };
  auto plain_opt = make(plain->parameters());
  auto tp_opt = make(tp.parameters());
  for (int step = 0; step < 2; ++step) {
    manual_seed(40 + step);
    const Tensor x = randn({9, 6});
    const Tensor y = randint(0, 4, {9});
    plain_opt->zero_grad();
    tp_opt->zero_grad();
    cross_entropy(plain->forward(x), y).backward();
    cross_entropy(tp.forward(x), y).backward();
    plain_opt->step();
    tp_opt->step();
  }
  std::vector<std::string> names;
  for (const auto& [name, p] : plain->named_parameters()) names.push_back(name);
  const parallel::OptimizerState want = parallel::named_optimizer_state(plain_opt->state_dict(), names);
  const parallel::OptimizerState got = parallel::full_optimizer_state(*tp_opt, {}, nullptr);
  REQUIRE(got.size() == want.size());
  for (const auto& [name, state] : want) {
    INFO(name);
    REQUIRE(got.count(name) == 1);
    for (const auto& [sname, t] : state) {
      INFO(sname);
      const Tensor g = got.at(name).at(sname);
      REQUIRE(g.shape() == t.shape());
      if (sname == "step") {
        CHECK(g.item<int64_t>() == 2);
      } else {
        // Two steps of gradients that differ by their rounding (placement_check.h's K = 12).
        const auto e = mg::testing::compare_pieces({{name, g}}, {{name, t}}, false);
        CHECK(e.worst <= 64 * mg::testing::kUnitRoundoff);
      }
    }
  }
  // The same names, the same indices: a single-device optimizer loads it.
  auto fresh_plain_opt = make(mlp(8)->parameters());
  fresh_plain_opt->load_state_dict(parallel::indexed_optimizer_state(got, names));
  // Into another split of another model: gathered back, bit for bit.
  parallel::TensorParallel other(*mlp(7), cpus(3));
  auto other_opt = make(other.parameters());
  parallel::load_full_optimizer_state(*other_opt, {}, got);
  const parallel::OptimizerState again = parallel::full_optimizer_state(*other_opt, {}, nullptr);
  for (const auto& [name, state] : got)
    for (const auto& [sname, t] : state) {
      INFO(name << " " << sname);
      const Tensor a = again.at(name).at(sname);
      if (sname == "step") CHECK(a.item<int64_t>() == t.item<int64_t>());
      else CHECK(a.to_vector<float>() == t.to_vector<float>());
    }
  // A state of the wrong shape is named, and changes nothing.
  parallel::OptimizerState bad = got;
  bad["0.weight"]["exp_avg"] = zeros(Shape{3});
  REQUIRE_THROWS_WITH(parallel::load_full_optimizer_state(*other_opt, {}, bad, "bad state"),
                      MG_CONTAINS("load_full_optimizer_state: bad state does not fit AdamW's parameters (3 "
                                  "problems):\n  'exp_avg' of '0.weight' is [3]: neither the parameter's shape [12, "
                                  "6] nor one value"));
}

TEST_CASE("reduce_partial_gradients: nothing partial, nothing done, and a Partial placement with no group is an error") {
  auto plain = mlp(5);
  parallel::TensorParallel tp(*plain, cpus(2));
  CHECK(parallel::reduce_partial_gradients(tp.parameters()) == 0);
  auto row = std::static_pointer_cast<nn::RowParallelLinear>((*std::static_pointer_cast<nn::Sequential>(tp.shard(0)))[2]);
  row->set_sequence_parallel(true);
  REQUIRE_THROWS_WITH(parallel::reduce_partial_gradients(tp.parameters()),
                      MG_CONTAINS("reduce_partial_gradients: the gradient of 2.bias [6], tp: Replicate(), gradient "
                                  "Partial (rank 0 of 2) is partial over tp, whose ranks have no process group"));
}
