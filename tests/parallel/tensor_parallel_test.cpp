// Tensor parallelism in one process, over CPU devices: the column/row split of an MLP
// equals the plain model (loss, gradients, parameters after SGD steps) over 2 and 4
// shards; a missing all-reduce makes that comparison fail; an MLP block costs two
// all-reduces per step; the shards are those of one Linear initialisation; and the errors.
#include "catch_compat.h"

#include "parallel/tp_check.h"

#include <minigrad/minigrad.h>

using namespace mg;
using mg::testing::cpus;

namespace {

// A module that calls a function: rank r's part of a test region.
class Lambda : public nn::Cloneable<Lambda> {
 public:
  explicit Lambda(std::function<Tensor(const Tensor&)> f) : nn::Cloneable<Lambda>("Lambda"), f_(std::move(f)) {}
  Tensor forward(const Tensor& x) override { return f_(x); }

 private:
  std::function<Tensor(const Tensor&)> f_;
};

}  // namespace

TEST_CASE("TensorParallel: an MLP split over 2 and 4 CPU shards trains as the plain model") {
  // Odd batch sizes and odd unsplit widths (7 inputs, 5 and 3 outputs); the split widths
  // (12, 8) divide by 2 and 4. {9, 8, 4, 5}: three Linear layers, the last one whole.
  for (const std::vector<int64_t>& widths :
       {std::vector<int64_t>{7, 12, 5, 8, 3}, std::vector<int64_t>{9, 8, 4, 5}}) {
    for (size_t shards : {2u, 4u}) {
      for (int64_t batch : {5, 11}) {
        INFO(fmt::format("widths {}, {} shards, batch {}", fmt::join(widths, "-"), shards, batch));
        const auto m = mg::testing::tensor_parallel_against_plain(widths, batch, cpus(shards), 3);
        INFO(m.where);
        REQUIRE(m.ok());
      }
    }
  }
}

TEST_CASE("TensorParallel: a column layer that gathers and a row layer that scatters train as the plain model") {
  for (size_t shards : {2u, 4u}) {
    INFO(shards << " shards");
    const auto m = mg::testing::tensor_parallel_against_plain(
        {7, 12, 5}, 9, cpus(shards), 3, mg::testing::shard_with_gather_and_scatter);
    INFO(m.where);
    REQUIRE(m.ok());
  }
}

TEST_CASE("TensorParallel: a column layer without the backward all-reduce fails the comparison") {
  // The same check as above must catch the bug, for 2 and 4 shards: the first block's
  // gradients come out as one rank's part of the sum.
  for (size_t shards : {2u, 4u}) {
    INFO(shards << " shards");
    const auto right = mg::testing::tensor_parallel_against_plain({7, 12, 5, 8, 3}, 5, cpus(shards));
    INFO(right.where);
    REQUIRE(right.ok());
    const auto wrong = mg::testing::tensor_parallel_against_plain(
        {7, 12, 5, 8, 3}, 5, cpus(shards), 3, mg::testing::shard_without_backward_all_reduce);
    INFO(wrong.where);
    REQUIRE_FALSE(wrong.ok());
    REQUIRE(wrong.worst > 100.0);  // not a rounding matter
  }
}

TEST_CASE("TensorParallel: an MLP block costs one all-reduce in forward and one in backward") {
  manual_seed(3);
  // Linear(6,8) ReLU Linear(8,6) ReLU Linear(6,8) ReLU Linear(8,4): two blocks. The data
  // needs no gradient, so the first block's backward all-reduce is not run at all.
  auto plain = std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({6, 8, 6, 8, 4}));
  parallel::TensorParallel tp(*plain, cpus(2));
  const int64_t batch = 5;
  const Tensor x = randn({batch, 6});
  const Tensor y = randint(0, 4, {batch});

  Tensor out;
  {
    NoGradGuard no_grad;  // evaluation: the forward all-reduces only
    out = tp.forward(x);
  }
  for (int r = 0; r < 2; ++r) {
    const auto s = tp.group()->rank(r)->stats();
    REQUIRE(s.all_reduces == 2);
    REQUIRE(s.all_gathers == 0);
    REQUIRE(s.all_reduce_bytes == batch * (6 + 4) * 4);  // the [5, 6] and [5, 4] partial sums
    tp.group()->rank(r)->reset_stats();
  }
  cross_entropy(tp.forward(x), y).backward();
  for (int r = 0; r < 2; ++r) {
    const auto s = tp.group()->rank(r)->stats();
    // forward: 2 (one per block); backward: 1 (the second block's input gradient, [5, 6]).
    REQUIRE(s.all_reduces == 3);
    REQUIRE(s.all_reduce_bytes == batch * (6 + 4 + 6) * 4);
    tp.group()->rank(r)->reset_stats();
  }

  // An input that requires grad: both blocks' backward all-reduces run, 2 per block.
  const Tensor xg = randn({batch, 6}).set_requires_grad(true);
  cross_entropy(tp.forward(xg), y).backward();
  for (int r = 0; r < 2; ++r) REQUIRE(tp.group()->rank(r)->stats().all_reduces == 4);
  REQUIRE(xg.grad().defined());
  // ... and the input's gradient is the plain model's.
  const Tensor xp = xg.detach().set_requires_grad(true);
  cross_entropy(plain->forward(xp), y).backward();
  mg::testing::require_close(xg.grad(), xp.grad(), "input gradient", 1e-5, 1e-6);
}

TEST_CASE("ColumnParallelLinear and RowParallelLinear hold the shards of one Linear's initialisation") {
  auto group = std::make_shared<parallel::InProcessGroup>(cpus(4));
  manual_seed(11);
  nn::Linear full(6, 8);
  for (int r = 0; r < 4; ++r) {
    manual_seed(11);  // the ranks of a job seed alike
    nn::ColumnParallelLinear column(6, 8, group->rank(r));
    REQUIRE(column.weight().shape() == Shape{2, 6});
    mg::testing::require_close(column.weight(), full.weight().narrow(0, 2 * r, 2), "column weight", 0, 0);
    mg::testing::require_close(column.bias(), full.bias().narrow(0, 2 * r, 2), "column bias", 0, 0);
    REQUIRE(column.weight().requires_grad());
    REQUIRE(column.weight().is_leaf());
  }
  manual_seed(12);
  nn::Linear full_row(8, 6);
  for (int r = 0; r < 4; ++r) {
    manual_seed(12);
    nn::RowParallelLinear row(8, 6, group->rank(r));
    REQUIRE(row.weight().shape() == Shape{6, 2});
    mg::testing::require_close(row.weight(), full_row.weight().narrow(1, 2 * r, 2), "row weight", 0, 0);
    mg::testing::require_close(row.bias(), full_row.bias(), "row bias (whole on every rank)", 0, 0);
  }
  // The shards are copies: the full layer is left as it is.
  nn::ColumnParallelLinear from_full(full, group->rank(1));
  NoGradGuard no_grad;
  from_full.weight().fill_(0.0);
  REQUIRE(full.weight().narrow(0, 2, 2).to_vector<float>() != std::vector<float>(12, 0.0f));
}

TEST_CASE("Tensor parallelism refuses widths that do not divide over the ranks, and other misuse") {
  auto group = std::make_shared<parallel::InProcessGroup>(cpus(4));
  REQUIRE_THROWS_WITH(nn::ColumnParallelLinear(6, 10, group->rank(0)),
                      MG_CONTAINS("ColumnParallelLinear: out_features = 10 is not divisible by the "
                                  "tensor-parallel size 4: every rank holds an equal shard (no "
                                  "padding), so choose a width that is a multiple of 4"));
  REQUIRE_THROWS_WITH(nn::RowParallelLinear(6, 8, group->rank(0)),
                      MG_CONTAINS("RowParallelLinear: in_features = 6 is not divisible by the "
                                  "tensor-parallel size 4"));
  REQUIRE_THROWS_WITH(nn::ColumnParallelLinear(6, 8, nullptr),
                      MG_CONTAINS("ColumnParallelLinear: the tensor-parallel group is null"));

  // An MLP whose hidden width does not divide: refused when it is split.
  auto odd = std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({5, 6, 3}));
  REQUIRE_THROWS_WITH(parallel::TensorParallel(*odd, cpus(4)),
                      MG_CONTAINS("ColumnParallelLinear: out_features = 6 is not divisible by the "
                                  "tensor-parallel size 4"));
  nn::Sequential nested{std::make_shared<nn::Linear>(4, 4),
                        std::make_shared<nn::Sequential>(std::initializer_list<nn::ModulePtr>{
                            std::make_shared<nn::ReLU>()})};
  REQUIRE_THROWS_WITH(parallel::parallelize_mlp(nested, group->rank(0)),
                      MG_CONTAINS("parallelize_mlp: layer '1' is a Sequential; only a Sequential of "
                                  "Linear and ReLU layers can be split into column/row pairs"));

  auto even = std::static_pointer_cast<nn::Sequential>(mg::testing::make_mlp({5, 8, 3}));
  parallel::TensorParallel tp(*even, cpus(2));
  // Both ranks get the wrong input; the error is the first to fail, which either may be.
  REQUIRE_THROWS_WITH(tp.forward(randn({3, 4})),
                      MG_CONTAINS("TensorParallel: rank ") &&
                          MG_CONTAINS(" on cpu failed: ColumnParallelLinear(5, 8): expected an "
                                      "input of shape [..., 5], got [3, 4] (in-process rank ") &&
                          MG_CONTAINS(" of [cpu, cpu] (host))"));
  REQUIRE_THROWS_WITH(parallel::TensorParallel({tp.shard(0)}, tp.group()),
                      MG_CONTAINS("TensorParallel: got 1 shards for a group of 2 ranks ([cpu, cpu])"));
  REQUIRE_THROWS_WITH(parallel::copy_to_parallel(randn({2}), nullptr),
                      MG_CONTAINS("copy_to_parallel: the tensor-parallel group is null"));
  REQUIRE_THROWS_WITH(parallel::scatter_to_parallel(randn({2, 3}), tp.group()->rank(0)),
                      MG_CONTAINS("scatter_to_parallel: the last dimension of shape [2, 3] = 3 is "
                                  "not divisible by the tensor-parallel size 2"));
}

TEST_CASE("InProcessGroup: a failing or absent rank ends every rank's collective with an error") {
  auto group = std::make_shared<parallel::InProcessGroup>(cpus(3));
  auto shards = [&](std::function<Tensor(int, const Tensor&)> body) {
    std::vector<nn::ModulePtr> out;
    for (int r = 0; r < 3; ++r)
      out.push_back(std::make_shared<Lambda>([body, r](const Tensor& x) { return body(r, x); }));
    return out;
  };
  auto all_reduce = [&](int r, const Tensor& x) { return group->rank(r)->all_reduce(x); };

  // Rank 1 fails before its all-reduce: ranks 0 and 2, waiting in theirs, are released.
  REQUIRE_THROWS_WITH(parallel::tensor_parallel_apply(shards([&](int r, const Tensor& x) {
                        MG_CHECK(r != 1, "rank 1 gives up");
                        return all_reduce(r, x);
                      }), group, ones({2})),
                      MG_CONTAINS("TensorParallel: rank 1 on cpu failed:") &&
                          MG_CONTAINS("rank 1 gives up"));
  // The group works again afterwards.
  const Tensor sum = parallel::tensor_parallel_apply(shards(all_reduce), group, ones({2}));
  REQUIRE(sum.to_vector<float>() == std::vector<float>{3, 3});

  // Ranks that call different collectives, or tensors that do not match.
  REQUIRE_THROWS_WITH(parallel::tensor_parallel_apply(shards([&](int r, const Tensor& x) {
                        return r == 2 ? group->rank(r)->all_gather(x) : all_reduce(r, x);
                      }), group, ones({2})),
                      MG_CONTAINS("every rank must call the same collectives in the same order"));
  REQUIRE_THROWS_WITH(parallel::tensor_parallel_apply(shards([&](int r, const Tensor& x) {
                        return all_reduce(r, r == 1 ? ones({3}) : x);
                      }), group, ones({2})),
                      MG_CONTAINS("host all_reduce: rank 1 has a float32 tensor of shape [3], but "
                                  "rank 0 has float32 [2]"));
  const Tensor gathered = parallel::tensor_parallel_apply(shards([&](int r, const Tensor& x) {
                            return group->rank(r)->all_gather(x * static_cast<double>(r));
                          }), group, ones({2}));
  REQUIRE(gathered.shape() == Shape{3, 2});
  REQUIRE(gathered.to_vector<float>() == std::vector<float>{0, 0, 1, 1, 2, 2});

  // A rank that never comes: the collective gives up after the group's timeout.
  parallel::InProcessGroup lonely(cpus(2), std::chrono::milliseconds(200));
  REQUIRE_THROWS_WITH(lonely.rank(0)->all_reduce(ones({1})),
                      MG_CONTAINS("all_reduce (in-process rank 0 of [cpu, cpu]): rank 0 waited 200 "
                                  "ms for rank(s) 1, which never called all_reduce"));
  REQUIRE_THROWS_WITH(lonely.rank(1)->all_reduce(ones({1})), MG_CONTAINS("abandoned because"));
  lonely.clear_abort();
  REQUIRE_THROWS_WITH(lonely.rank(2), MG_CONTAINS("InProcessGroup: rank 2 is outside [0, 2)"));
}
