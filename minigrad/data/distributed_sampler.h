// DistributedSampler: each rank of a DistributedDataParallel job visits its own shard of
// the dataset, as torch.utils.data.distributed.DistributedSampler.
//
//   data::DistributedSampler sampler(train->size(), world_size, rank, /*shuffle=*/true, seed);
//   data::DataLoader loader(train, std::make_shared<data::DistributedSampler>(sampler), options);
//   for (int epoch = 0; ...) { loader.set_epoch(epoch); for (auto& batch : loader) ... }
//
// Every rank computes the same epoch order (a permutation drawn from (seed, epoch), or
// 0..n-1 without shuffle) without talking to the others, pads it by repeating its head
// until its length divides by the world size (or, with drop_last, cuts the tail), and
// takes every world_size-th index from position `rank` on. So the shards are disjoint
// apart from the padding, together cover the dataset, and all have size() indices: every
// rank runs the same number of steps, which DDP's collectives require.
//
// PyTorch's sampler.set_epoch(e) is loader.set_epoch(e) here: samplers are pure functions
// of the epoch (sampler.h), and the DataLoader passes its epoch in.
//
// The shuffled order is NOT PyTorch's. For the same seed and epoch, torch draws
// torch.randperm(n) from a generator seeded with seed + epoch (mt19937); minigrad draws a
// Fisher-Yates shuffle from Philox keyed by (seed, epoch). The structure is the same
// (padding, every world_size-th index from `rank`, drop_last), and without shuffle the
// shards are index for index PyTorch's; a shuffled run visits other examples in each
// batch, so its losses match PyTorch's only in distribution, not step by step.
#pragma once

#include <cstdint>
#include <vector>

#include <minigrad/data/sampler.h>

namespace mg::data {

class DistributedSampler : public Sampler {
 public:
  DistributedSampler(int64_t dataset_size, int64_t world_size, int64_t rank, bool shuffle = true,
                     uint64_t seed = 0, bool drop_last = false);

  // Indices per rank per epoch (num_samples in PyTorch).
  int64_t size() const override { return num_samples_; }
  // This rank's indices of epoch `epoch`.
  std::vector<int64_t> indices(int64_t epoch) const override;

  // size() * world_size: the padded (or cut) length of the epoch order.
  int64_t total_size() const { return num_samples_ * world_size_; }
  int64_t world_size() const { return world_size_; }
  int64_t rank() const { return rank_; }
  bool drop_last() const { return drop_last_; }

 private:
  int64_t dataset_size_;
  int64_t world_size_;
  int64_t rank_;
  bool shuffle_;
  uint64_t seed_;
  bool drop_last_;
  int64_t num_samples_;
};

}  // namespace mg::data
