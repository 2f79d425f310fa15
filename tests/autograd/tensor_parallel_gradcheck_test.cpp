// The four conjugate functions of tensor parallelism (parallel/tensor_parallel/
// functions.h) against finite differences, over 2, 3 and 4 ranks in one process.
//
// A rank's function alone is not what has a gradient: copy_to_parallel's backward sums
// over the ranks. What is checked is the whole region as one function of its inputs, as
// TensorParallel (tensor_parallel_apply) runs it: every rank's thread applies the function
// to its part of the input, scaled by (rank + 1) before or after it, so that the ranks'
// contributions differ and a backward that takes one rank's part for the sum shows up.
// Replicate inputs are given whole to every rank; Shard inputs and outputs are split
// along the last dimension.
#include "catch_compat.h"
#include "gradcheck.h"

#include <functional>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/node.h>
#include <minigrad/parallel/tensor_parallel/functions.h>
#include <minigrad/parallel/tensor_parallel/tensor_parallel.h>

using namespace mg;
using parallel::Placement;
using mg::testing::random_input;

namespace {

using RankFunction = std::function<Tensor(int rank, const Tensor& x,
                                          const parallel::TensorParallelGroupPtr& group)>;

class RankModule : public nn::Cloneable<RankModule> {
 public:
  RankModule(RankFunction f, int rank, parallel::TensorParallelGroupPtr group)
      : nn::Cloneable<RankModule>("RankModule"), f_(std::move(f)), rank_(rank), group_(std::move(group)) {}
  Tensor forward(const Tensor& x) override { return f_(rank_, x, group_); }

 private:
  RankFunction f_;
  int rank_;
  parallel::TensorParallelGroupPtr group_;
};

// The region of `f` over `ranks` CPU ranks, as a function of its one input.
mg::testing::SingleOutputFn region(const RankFunction& f, int ranks, Placement in, Placement out) {
  auto group = std::make_shared<parallel::InProcessGroup>(std::vector<Device>(static_cast<size_t>(ranks), Device::cpu()));
  std::vector<nn::ModulePtr> shards;
  for (int r = 0; r < ranks; ++r) shards.push_back(std::make_shared<RankModule>(f, r, group->rank(r)));
  return [group, shards, in, out](const std::vector<Tensor>& x) {
    return parallel::tensor_parallel_apply(shards, group, x[0], in, out);
  };
}

double scale(int rank) { return static_cast<double>(rank + 1); }

// copy_to_parallel with Megatron's f done wrong: identity in backward too.
Tensor copy_without_all_reduce(const Tensor& x, const parallel::TensorParallelGroupPtr&) {
  Tensor out = x.detach();
  record_function("WrongCopyToParallelBackward", {x}, {out},
                  [](const BackwardArgs& g) { return std::vector<Tensor>{g.grad()}; });
  return out;
}

}  // namespace

TEST_CASE("gradcheck: copy_to_parallel (identity forward, all-reduce backward)") {
  for (int ranks : {2, 3, 4}) {
    INFO(ranks << " ranks");
    // The whole x on every rank; each rank's output is its own (Shard: side by side).
    const auto f = region([](int r, const Tensor& x, const parallel::TensorParallelGroupPtr& g) {
      return parallel::copy_to_parallel(x, g) * scale(r);
    }, ranks, Placement::replicate(), Placement::shard(-1));
    CHECK_GRADCHECK(f, {random_input({3, 5}, 1)});
  }
  // The same check refuses a copy whose backward does not sum over the ranks.
  const auto wrong = region([](int r, const Tensor& x, const parallel::TensorParallelGroupPtr& g) {
    return copy_without_all_reduce(x, g) * scale(r);
  }, 2, Placement::replicate(), Placement::shard(-1));
  CHECK_FALSE(mg::testing::gradcheck(wrong, {random_input({3, 5}, 1)}).ok);
}

TEST_CASE("gradcheck: reduce_from_parallel (all-reduce forward, identity backward)") {
  for (int ranks : {2, 3, 4}) {
    INFO(ranks << " ranks");
    // Rank r's slice of x, scaled, summed over the ranks: one output, the same everywhere.
    const auto f = region([](int r, const Tensor& x, const parallel::TensorParallelGroupPtr& g) {
      return parallel::reduce_from_parallel(x * scale(r), g);
    }, ranks, Placement::shard(-1), Placement::replicate());
    CHECK_GRADCHECK(f, {random_input({3, 2 * ranks}, 2)});
  }
}

TEST_CASE("gradcheck: scatter_to_parallel and gather_from_parallel along the last dimension") {
  for (int ranks : {2, 3, 4}) {
    INFO(ranks << " ranks");
    const auto scatter = region([](int r, const Tensor& x, const parallel::TensorParallelGroupPtr& g) {
      return parallel::scatter_to_parallel(x, g) * scale(r);
    }, ranks, Placement::replicate(), Placement::shard(-1));
    CHECK_GRADCHECK(scatter, {random_input({3, 2 * ranks}, 3)});
    const auto gather = region([](int r, const Tensor& x, const parallel::TensorParallelGroupPtr& g) {
      return parallel::gather_from_parallel(x * scale(r), g);
    }, ranks, Placement::shard(-1), Placement::replicate());
    CHECK_GRADCHECK(gather, {random_input({3, 2 * ranks}, 4)});
    // 3-D: the last dimension is split, the others kept.
    CHECK_GRADCHECK(gather, {random_input({2, 3, ranks}, 5)});
  }
}
