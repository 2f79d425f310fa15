// attention-bench: scaled_dot_product_attention's fused path against its composition,
// forward and backward, on one device. Prints one JSON line per (shape, causal, path) with
// the median step time, and the ratio fused / composed:
//
//   build/bin/attention-bench [--device cpu|cuda] [--steps N]
//
// Shapes: nanoGPT's small CPU configuration (batch 12, 4 heads, T 64, head 32), and longer
// sequences where the composed path's [T, T] matrices start to cost.
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <string>
#include <vector>

#include <CLI/CLI.hpp>

#include <minigrad/autograd/functions.h>
#include <minigrad/core/backend.h>
#include <minigrad/core/generator.h>
#include <minigrad/core/ops.h>

using namespace mg;

namespace {

double median_ms(const std::vector<double>& samples) {
  std::vector<double> s = samples;
  std::sort(s.begin(), s.end());
  return s[s.size() / 2];
}

double time_step(bool fused, const Shape& shape, bool causal, Device device, int steps) {
  manual_seed(1);
  std::vector<Tensor> qkv;
  for (int i = 0; i < 3; ++i) qkv.push_back(randn(shape, device).set_requires_grad(true));
  const Tensor grad = randn(shape, device);
  std::vector<double> samples;
  for (int step = 0; step < steps + 2; ++step) {
    for (Tensor& t : qkv) t.set_grad(Tensor());
    backend(device).synchronize(device.index());
    const auto start = std::chrono::steady_clock::now();
    const Tensor out = fused ? scaled_dot_product_attention_fused(qkv[0], qkv[1], qkv[2], causal)
                             : scaled_dot_product_attention_composed(qkv[0], qkv[1], qkv[2], causal);
    out.backward(grad);
    backend(device).synchronize(device.index());
    const auto end = std::chrono::steady_clock::now();
    if (step >= 2) samples.push_back(std::chrono::duration<double, std::milli>(end - start).count());
  }
  return median_ms(samples);
}

}  // namespace

int main(int argc, char** argv) {
  CLI::App app{"scaled_dot_product_attention: fused against composed, forward + backward"};
  // A flag given twice takes its last value (samples/support/command_line.h).
  app.option_defaults()->multi_option_policy(CLI::MultiOptionPolicy::TakeLast);
  std::string device_name = "cpu";
  int steps = 20;
  app.add_option("--device", device_name, "cpu, cuda or cuda:N");
  app.add_option("--steps", steps, "timed steps per case (median reported)")->check(CLI::PositiveNumber);
  CLI11_PARSE(app, argc, argv);
  const Device device(device_name);
  const std::vector<Shape> shapes{{12, 4, 64, 32}, {4, 4, 256, 32}, {2, 4, 512, 32}};
  for (const Shape& shape : shapes) {
    for (bool causal : {false, true}) {
      const double composed = time_step(false, shape, causal, device, steps);
      const double fused = time_step(true, shape, causal, device, steps);
      std::printf(
          "{\"shape\":[%lld,%lld,%lld,%lld],\"causal\":%s,\"device\":\"%s\",\"composed_ms\":%.3f,"
          "\"fused_ms\":%.3f,\"fused_over_composed\":%.3f}\n",
          static_cast<long long>(shape[0]), static_cast<long long>(shape[1]),
          static_cast<long long>(shape[2]), static_cast<long long>(shape[3]),
          causal ? "true" : "false", device.str().c_str(), composed, fused, fused / composed);
    }
  }
  return 0;
}
