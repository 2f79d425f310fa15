#include <minigrad/data/sampler.h>

#include <numeric>
#include <utility>

#include <minigrad/core/error.h>
#include <minigrad/core/philox.h>

namespace mg::data {

namespace {

// 64-bit random words from Philox, keyed by the seed; the epoch selects a separate
// region of the counter space (2^40 blocks per epoch, far more than any shuffle uses).
class PermutationStream {
 public:
  PermutationStream(uint64_t seed, int64_t epoch)
      : seed_(seed), block_(static_cast<uint64_t>(epoch) << 40) {}

  uint64_t next() {
    const philox::Uint4 r = philox::philox4x32(seed_, block_++);
    return (static_cast<uint64_t>(r.x) << 32) | r.y;
  }

  // Uniform in [0, bound) without modulo bias: words below 2^64 mod bound are redrawn,
  // so every residue is equally likely.
  uint64_t below(uint64_t bound) {
    const uint64_t threshold = (0 - bound) % bound;
    uint64_t word = next();
    while (word < threshold) word = next();
    return word % bound;
  }

 private:
  uint64_t seed_;
  uint64_t block_;
};

}  // namespace

std::vector<int64_t> random_permutation(int64_t n, uint64_t seed, int64_t epoch) {
  MG_CHECK(n >= 0, "random_permutation: n must be non-negative, got {}", n);
  MG_CHECK(epoch >= 0, "random_permutation: epoch must be non-negative, got {}", epoch);
  std::vector<int64_t> perm(static_cast<size_t>(n));
  std::iota(perm.begin(), perm.end(), int64_t{0});
  PermutationStream stream(seed, epoch);
  for (int64_t i = n - 1; i > 0; --i) {
    const auto j = static_cast<int64_t>(stream.below(static_cast<uint64_t>(i) + 1));
    std::swap(perm[static_cast<size_t>(i)], perm[static_cast<size_t>(j)]);
  }
  return perm;
}

SequentialSampler::SequentialSampler(int64_t n) : n_(n) {
  MG_CHECK(n >= 0, "SequentialSampler: n must be non-negative, got {}", n);
}

std::vector<int64_t> SequentialSampler::indices(int64_t) const {
  std::vector<int64_t> out(static_cast<size_t>(n_));
  std::iota(out.begin(), out.end(), int64_t{0});
  return out;
}

RandomSampler::RandomSampler(int64_t n, uint64_t seed) : n_(n), seed_(seed) {
  // As torch's RandomSampler (and so DataLoader(shuffle=True)) over an empty dataset.
  MG_CHECK(n > 0,
           "RandomSampler: num_samples should be a positive integer value, but got "
           "num_samples={} (an empty dataset has nothing to shuffle)",
           n);
}

std::vector<int64_t> RandomSampler::indices(int64_t epoch) const {
  return random_permutation(n_, seed_, epoch);
}

}  // namespace mg::data
