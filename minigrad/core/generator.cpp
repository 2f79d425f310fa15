#include <minigrad/core/generator.h>

namespace mg {

void Generator::manual_seed(uint64_t seed) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = seed;
  offset_ = 0;
}

uint64_t Generator::seed() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return seed_;
}

Generator::Draw Generator::reserve(uint64_t blocks) {
  std::lock_guard<std::mutex> lock(mutex_);
  const Draw draw{seed_, offset_};
  offset_ += blocks;
  return draw;
}

Generator::State Generator::state() const {
  std::lock_guard<std::mutex> lock(mutex_);
  return {seed_, offset_};
}

void Generator::set_state(const State& state) {
  std::lock_guard<std::mutex> lock(mutex_);
  seed_ = state.seed;
  offset_ = state.offset;
}

Generator& default_generator() {
  static Generator generator;
  return generator;
}

void manual_seed(uint64_t seed) { default_generator().manual_seed(seed); }

}  // namespace mg
