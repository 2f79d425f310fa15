#include <minigrad/data/distributed_sampler.h>

#include <numeric>

#include <minigrad/core/checked_math.h>
#include <minigrad/core/error.h>
#include <minigrad/core/fault_injection.h>

namespace mg::data {

DistributedSampler::DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank,
                                       bool shuffle, uint64_t seed, bool drop_last)
    : dataset_size_(dataset_size),
      world_size_(world_size),
      rank_(rank),
      shuffle_(shuffle),
      seed_(seed),
      drop_last_(drop_last) {
  MG_CHECK(dataset_size >= 0, "DistributedSampler: dataset size must be non-negative, got {}",
           dataset_size);
  MG_CHECK(world_size >= 1, "DistributedSampler: world size must be at least 1, got {}",
           world_size);
  MG_CHECK(rank >= 0 && rank < world_size,
           "DistributedSampler: rank {} is outside [0, {}) (world size {})", rank, world_size,
           world_size);
  // Without drop_last every rank gets ceil(n / world) indices (the order is padded); with
  // it, floor(n / world) (the tail is cut), as PyTorch.
  num_samples_ = drop_last ? dataset_size / world_size
                           : ceil_div(dataset_size, world_size);
}

std::vector<int64_t> DistributedSampler::indices(int64_t epoch) const {
  std::vector<int64_t> order;
  if (shuffle_) {
    order = random_permutation(dataset_size_, seed_, epoch);
  } else {
    order.resize(static_cast<size_t>(dataset_size_));
    std::iota(order.begin(), order.end(), int64_t{0});
  }
  const int64_t total = total_size();
  if (static_cast<int64_t>(order.size()) > total) {
    order.resize(static_cast<size_t>(total));  // drop_last: cut the tail
  } else if (!order.empty()) {
    // Pad by repeating the order from its start, as many times as needed.
    const size_t n = order.size();
    for (size_t i = 0; order.size() < static_cast<size_t>(total); ++i) order.push_back(order[i % n]);
  }
  std::vector<int64_t> shard;
  shard.reserve(static_cast<size_t>(num_samples_));
  int64_t first = rank_;
  // parity fault: rank r starts where its neighbour r - 1 does, so two ranks share a shard.
  if (testing::fault_is_on(testing::Fault::SamplerRankLikeNeighbour) && first > 0) --first;
  for (int64_t i = first; i < static_cast<int64_t>(order.size()); i += world_size_)
    shard.push_back(order[static_cast<size_t>(i)]);
  return shard;
}

}  // namespace mg::data
