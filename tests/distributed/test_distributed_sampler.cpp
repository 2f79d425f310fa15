// DistributedSampler: PyTorch's shards (padding, drop_last), shuffling by (seed, epoch),
// and use through the DataLoader.
#include <algorithm>
#include <map>

#include "catch_compat.h"

#include <minigrad/data/dataloader.h>
#include <minigrad/data/dataset.h>
#include <minigrad/data/distributed_sampler.h>

using namespace mg;
using namespace mg::data;

namespace {

std::vector<std::vector<int64_t>> shards(int64_t n, int64_t world, bool shuffle, uint64_t seed,
                                         int64_t epoch, bool drop_last = false) {
  std::vector<std::vector<int64_t>> out;
  for (int64_t r = 0; r < world; ++r)
    out.push_back(DistributedSampler(n, world, r, shuffle, seed, drop_last).indices(epoch));
  return out;
}

}  // namespace

TEST_CASE("DistributedSampler: without shuffle, PyTorch's shards with padding") {
  // torch DistributedSampler(range(10), num_replicas=4, rank=r, shuffle=False)
  const auto s = shards(10, 4, false, 0, 0);
  REQUIRE(s[0] == std::vector<int64_t>{0, 4, 8});
  REQUIRE(s[1] == std::vector<int64_t>{1, 5, 9});
  REQUIRE(s[2] == std::vector<int64_t>{2, 6, 0});
  REQUIRE(s[3] == std::vector<int64_t>{3, 7, 1});
  REQUIRE(DistributedSampler(10, 4, 0, false).size() == 3);
  REQUIRE(DistributedSampler(10, 4, 0, false).total_size() == 12);

  // Fewer samples than ranks: the order repeats until every rank has one.
  const auto tiny = shards(3, 8, false, 0, 0);
  for (int64_t r = 0; r < 8; ++r) REQUIRE(tiny[static_cast<size_t>(r)] == std::vector<int64_t>{r % 3});
}

TEST_CASE("DistributedSampler: drop_last cuts the tail instead of padding") {
  const auto s = shards(10, 4, false, 0, 0, /*drop_last=*/true);
  REQUIRE(s[0] == std::vector<int64_t>{0, 4});
  REQUIRE(s[3] == std::vector<int64_t>{3, 7});
  REQUIRE(DistributedSampler(10, 4, 1, false, 0, true).size() == 2);
}

TEST_CASE("DistributedSampler: shuffled shards are disjoint, cover the data, and follow the epoch") {
  const int64_t n = 101, world = 4;
  const auto e0 = shards(n, world, true, 42, 0);
  std::map<int64_t, int> seen;
  for (const auto& shard : e0) {
    REQUIRE(shard.size() == 26);  // ceil(101 / 4)
    for (int64_t i : shard) ++seen[i];
  }
  REQUIRE(seen.size() == static_cast<size_t>(n));  // every sample visited
  int repeated = 0;
  for (const auto& [index, count] : seen) repeated += count - 1;
  REQUIRE(repeated == 26 * 4 - 101);  // only the padding repeats

  // The same on every call (every rank computes it alone), another order next epoch and
  // for another seed.
  REQUIRE(shards(n, world, true, 42, 0) == e0);
  REQUIRE(shards(n, world, true, 42, 1) != e0);
  REQUIRE(shards(n, world, true, 43, 0) != e0);
  std::vector<int64_t> sorted0 = e0[0];
  std::sort(sorted0.begin(), sorted0.end());
  REQUIRE(sorted0 != e0[0]);  // actually shuffled
}

TEST_CASE("DistributedSampler: a DataLoader over it yields this rank's shard in batches") {
  std::vector<float> values(10);
  for (int i = 0; i < 10; ++i) values[static_cast<size_t>(i)] = static_cast<float>(i);
  auto dataset = std::make_shared<TensorDataset>(from_vector(values, Shape{10, 1}));
  auto sampler = std::make_shared<DistributedSampler>(10, 4, 2, /*shuffle=*/false);
  DataLoaderOptions options;
  options.batch_size = 2;
  DataLoader loader(dataset, sampler, options);
  REQUIRE(loader.size() == 2);  // 3 indices: a batch of 2 and one of 1
  std::vector<float> got;
  for (const Batch& batch : loader)
    for (float v : batch.data.to_vector<float>()) got.push_back(v);
  REQUIRE(got == std::vector<float>{2, 6, 0});
}

TEST_CASE("DistributedSampler: invalid arguments name themselves") {
  REQUIRE_THROWS_WITH(DistributedSampler(10, 4, 4), MG_CONTAINS("rank 4 is outside [0, 4)"));
  REQUIRE_THROWS_WITH(DistributedSampler(10, 0, 0), MG_CONTAINS("world size must be at least 1"));
  REQUIRE_THROWS_WITH(DistributedSampler(-1, 2, 0), MG_CONTAINS("dataset size must be non-negative"));
}
