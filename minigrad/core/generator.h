// The default random generator: a seed and a running offset (in Philox blocks of four
// 32-bit words). Each random tensor reserves the blocks it needs, so a run is
// reproducible after manual_seed, and CPU and CUDA tensors made in the same order are
// equal.
#pragma once

#include <cstdint>
#include <mutex>

namespace mg {

class Generator {
 public:
  explicit Generator(uint64_t seed = 67280421310721ULL) : seed_(seed) {}

  void manual_seed(uint64_t seed);
  uint64_t seed() const;
  // Reserves `blocks` Philox blocks and returns (seed, first block).
  struct Draw {
    uint64_t seed;
    uint64_t offset;
  };
  Draw reserve(uint64_t blocks);

  // The whole state, for checkpoints that resume bit-identically.
  struct State {
    uint64_t seed;
    uint64_t offset;
  };
  State state() const;
  void set_state(const State& state);

 private:
  mutable std::mutex mutex_;
  uint64_t seed_;
  uint64_t offset_ = 0;
};

Generator& default_generator();
// Seeds the default generator, as torch::manual_seed.
void manual_seed(uint64_t seed);

}  // namespace mg
