// FlatParameter and its ShardLayout, in one process: the arithmetic of padded equal shards
// (a boundary inside a tensor, a shard of padding alone), the parameters becoming views of
// the flat buffer, and the two ways of holding the shard.
#include "catch_compat.h"

#include <cstdint>
#include <limits>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/sharded/flat_parameter.h>

using namespace mg;
using namespace mg::parallel;

TEST_CASE("ShardLayout: equal padded shards, pieces may split a tensor, a shard may be padding") {
  // w0 [2,3], b0 [2], w1 [1,2]: 10 elements on 4 ranks, shards of 3, 2 of padding.
  const ShardLayout layout = make_shard_layout({6, 2, 2}, 4);
  CHECK(layout.numel == 10);
  CHECK(layout.shard_numel == 3);
  CHECK(layout.padded_numel() == 12);
  CHECK(layout.offsets == std::vector<int64_t>{0, 6, 8});
  const auto rank1 = layout.pieces(1);
  REQUIRE(rank1.size() == 1);  // w0[3:6]
  CHECK((rank1[0].param == 0 && rank1[0].param_offset == 3 && rank1[0].shard_offset == 0 &&
         rank1[0].numel == 3));
  const auto rank2 = layout.pieces(2);  // b0, then w1[0]
  REQUIRE(rank2.size() == 2);
  CHECK((rank2[0].param == 1 && rank2[0].param_offset == 0 && rank2[0].numel == 2));
  CHECK((rank2[1].param == 2 && rank2[1].param_offset == 0 && rank2[1].shard_offset == 2 &&
         rank2[1].numel == 1));
  CHECK(layout.real_numel(3) == 1);  // w1[1], then padding

  // 5 elements on 4 ranks: shards of 2, rank 3 holds padding alone.
  const ShardLayout small = make_shard_layout({5}, 4);
  CHECK(small.shard_numel == 2);
  CHECK(small.real_numel(2) == 1);
  CHECK(small.real_numel(3) == 0);
  CHECK(small.pieces(3).empty());
  // Every element of the parameters is in exactly one rank's shard.
  int64_t covered = 0;
  for (int r = 0; r < 4; ++r) covered += layout.real_numel(r);
  CHECK(covered == layout.numel);

  REQUIRE_THROWS_WITH(make_shard_layout({4}, 0), MG_CONTAINS("world size must be at least 1"));
  REQUIRE_THROWS_WITH(make_shard_layout({-1}, 2), MG_CONTAINS("parameter 0 has -1 elements"));
  const int64_t huge = std::numeric_limits<int64_t>::max() / 2 + 1;
  REQUIRE_THROWS_WITH(make_shard_layout({huge, huge}, 2), MG_CONTAINS("more than 2^63 elements"));
}

TEST_CASE("FlatParameter: the parameters become views of one flat buffer, the shard a view or a copy") {
  manual_seed(3);
  Tensor w = randn(Shape{2, 3}), b = randn(Shape{2});
  w.set_requires_grad(true);
  b.set_requires_grad(true);
  const auto w0 = w.to_vector<float>(), b0 = b.to_vector<float>();
  Tensor module_w = w;  // what a module's registry holds: the same tensor

  // Rank 1 of 3: shards of ceil(8 / 3) = 3, elements [3, 6): w[3:6].
  FlatParameter flat({w, b}, {0, 1}, /*rank=*/1, /*world_size=*/3, ShardStorage::ViewOfFull);
  CHECK(module_w.is_same(w));
  CHECK(w.storage().is_alias_of(flat.full().storage()));
  CHECK(w.to_vector<float>() == w0);
  CHECK(b.to_vector<float>() == b0);
  CHECK(flat.full().numel() == 9);  // 8 and one element of padding
  CHECK(flat.full().to_vector<float>()[8] == 0.0f);
  CHECK(flat.shard().is_leaf());
  CHECK(flat.shard().requires_grad());
  CHECK(flat.shard().to_vector<float>() == std::vector<float>(w0.begin() + 3, w0.end()));

  // Writing the shard (an optimizer step) writes the parameter.
  {
    NoGradGuard no_grad;
    Tensor(flat.shard()).fill_(7.0);
  }
  CHECK(w.to_vector<float>()[4] == 7.0f);

  // This rank's shard of the gradients: w.grad[3:6]; a parameter without one counts as 0.
  sum(mul(w, 2.0)).backward();
  CHECK(flat.shard_of_grads().to_vector<float>() == std::vector<float>{2, 2, 2});
  CHECK(flat.slot(flat.full(), 1).to_vector<float>() == b0);

  // Separate: the shard has memory of its own; the flat buffer is freed until allocated.
  Tensor v = randn(Shape{5});
  v.set_requires_grad(true);
  const auto v0 = v.to_vector<float>();
  FlatParameter sharded({v}, {0}, /*rank=*/0, /*world_size=*/2, ShardStorage::Separate);
  CHECK_FALSE(sharded.full_is_allocated());
  CHECK(sharded.shard().to_vector<float>() == std::vector<float>(v0.begin(), v0.begin() + 3));
  REQUIRE_THROWS_WITH(v.to_vector<float>(), MG_CONTAINS("has been freed"));
  sharded.allocate_full();
  CHECK(sharded.full_is_allocated());
  sharded.free_full();
  Tensor whole = arange(0.0, 6.0, 1.0, DType::Float32);
  sharded.load_shard_from_full(whole);
  CHECK(sharded.shard().to_vector<float>() == std::vector<float>{0, 1, 2});
  REQUIRE_THROWS_WITH(sharded.load_shard_from_full(zeros(Shape{5})),
                      MG_CONTAINS("expected a flat tensor of 6 elements, got shape [5]"));
}
