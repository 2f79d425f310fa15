// A small, learnable stand-in for Fashion-MNIST written as IDX files: class k's images
// are noise with a bright horizontal band at rows 2k+4..2k+6, so a model can reach high
// accuracy on it in one epoch. Tests of the reader and of the training binary use it.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/data/fashion_mnist.h>
#include <minigrad/data/idx.h>

namespace mg::testing {

struct SyntheticImages {
  std::vector<uint8_t> pixels;  // n * 28 * 28
  std::vector<uint8_t> labels;  // n
};

inline SyntheticImages synthetic_images(int64_t n, uint32_t seed) {
  SyntheticImages out;
  out.pixels.resize(static_cast<size_t>(n) * 28 * 28);
  out.labels.resize(static_cast<size_t>(n));
  uint32_t state = seed * 2654435761u + 1;
  auto next = [&state] {  // a tiny LCG: the data only has to be deterministic
    state = state * 1664525u + 1013904223u;
    return state >> 24;
  };
  for (int64_t i = 0; i < n; ++i) {
    const auto label = static_cast<uint8_t>(i % 10);
    out.labels[static_cast<size_t>(i)] = label;
    for (int64_t p = 0; p < 28 * 28; ++p) {
      const int64_t row = p / 28;
      const bool band = row >= 2 * label + 4 && row < 2 * label + 7;
      out.pixels[static_cast<size_t>(i * 28 * 28 + p)] =
          static_cast<uint8_t>(band ? 200 + next() % 56 : next() % 64);
    }
  }
  return out;
}

// Writes the four Fashion-MNIST files of a synthetic dataset into `dir`.
inline void write_synthetic_fashion_mnist(const std::string& dir, int64_t train, int64_t test,
                                          bool gzip) {
  const char* suffix = gzip ? ".gz" : "";
  const int64_t counts[2] = {train, test};
  const data::Split splits[2] = {data::Split::Train, data::Split::Test};
  for (int s = 0; s < 2; ++s) {
    const SyntheticImages images = synthetic_images(counts[s], static_cast<uint32_t>(s + 1));
    const auto names = data::fashion_mnist_file_names(splits[s]);
    data::write_idx_ubyte(dir + "/" + names[0] + suffix, {counts[s], 28, 28}, images.pixels, gzip);
    data::write_idx_ubyte(dir + "/" + names[1] + suffix, {counts[s]}, images.labels, gzip);
  }
}

}  // namespace mg::testing
