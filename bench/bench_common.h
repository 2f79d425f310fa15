// What minigrad-bench's modes share (bench/minigrad_bench.cpp, bench/pipeline_bench.cpp):
// the works' model, their FLOP count, and the statistics of timed steps.
#pragma once

#include <algorithm>
#include <cstdint>
#include <ctime>
#include <memory>
#include <vector>

#include <minigrad/nn/layers.h>

namespace minigrad_bench {

// Linear layers with ReLU between them (none after the last): widths {5, 2} is one Linear.
inline std::shared_ptr<mg::nn::Sequential> make_mlp(const std::vector<int64_t>& widths) {
  auto model = std::make_shared<mg::nn::Sequential>();
  for (size_t i = 0; i + 1 < widths.size(); ++i) {
    if (i > 0) model->push_back(std::make_shared<mg::nn::ReLU>());
    model->push_back(std::make_shared<mg::nn::Linear>(widths[i], widths[i + 1]));
  }
  return model;
}

// 2 * B * in * out for each of the three GEMMs of each layer.
inline double mlp_flops_per_step(const std::vector<int64_t>& widths, int64_t batch) {
  double flops = 0.0;
  for (size_t i = 0; i + 1 < widths.size(); ++i)
    flops += 6.0 * static_cast<double>(batch) * static_cast<double>(widths[i]) *
             static_cast<double>(widths[i + 1]);
  return flops;
}

inline double median(std::vector<double> values) {
  std::sort(values.begin(), values.end());
  const size_t n = values.size();
  return n % 2 ? values[n / 2] : 0.5 * (values[n / 2 - 1] + values[n / 2]);
}

inline double percentile(std::vector<double> values, double p) {
  std::sort(values.begin(), values.end());
  const auto index = static_cast<size_t>(p * static_cast<double>(values.size() - 1) + 0.5);
  return values[std::min(index, values.size() - 1)];
}

// The CPU time of the whole process (all its threads) in milliseconds.
inline double process_cpu_ms() {
  timespec t{};
  clock_gettime(CLOCK_PROCESS_CPUTIME_ID, &t);
  return static_cast<double>(t.tv_sec) * 1e3 + static_cast<double>(t.tv_nsec) * 1e-6;
}

}  // namespace minigrad_bench
