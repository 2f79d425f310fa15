// Samplers: which dataset indices an epoch visits, and in what order.
//
// A sampler is a pure function of the epoch: indices(epoch) is the same list every
// time it is asked, on every machine. That is what makes shuffling reproducible from
// a seed, lets a resumed run continue with the very order it stopped in, and lets a
// DistributedSampler give each rank its own shard of one permutation that all ranks
// agree on without talking to each other.
#pragma once

#include <cstdint>
#include <vector>

namespace mg::data {

class Sampler {
 public:
  virtual ~Sampler() = default;
  // How many indices indices(epoch) returns (the same for every epoch).
  virtual int64_t size() const = 0;
  // The indices of epoch `epoch`, in visiting order.
  virtual std::vector<int64_t> indices(int64_t epoch) const = 0;
};

// 0, 1, ..., n-1 every epoch (evaluation, the DataParallel tutorial).
class SequentialSampler : public Sampler {
 public:
  explicit SequentialSampler(int64_t n);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;

 private:
  int64_t n_;
};

// A permutation of 0..n-1 drawn from (seed, epoch): a new order each epoch, the same
// order for the same seed and epoch. n > 0: an empty dataset is refused, as torch's
// RandomSampler refuses num_samples=0 (a SequentialSampler of 0 gives no batch).
class RandomSampler : public Sampler {
 public:
  RandomSampler(int64_t n, uint64_t seed);
  int64_t size() const override { return n_; }
  std::vector<int64_t> indices(int64_t epoch) const override;
  uint64_t seed() const { return seed_; }

 private:
  int64_t n_;
  uint64_t seed_;
};

// A uniformly random permutation of 0..n-1 determined by (seed, epoch) alone: a
// Fisher-Yates shuffle fed by Philox (core/philox.h), so it does not depend on the
// standard library's std::shuffle, which differs between implementations.
std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch);

}  // namespace mg::data
