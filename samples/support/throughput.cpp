#include "throughput.h"

#include <algorithm>
#include <chrono>
#include <utility>

#include <fmt/format.h>

#include <minigrad/core/error.h>
#include <minigrad/core/ops.h>
#include <minigrad/core/tensor.h>
#include <minigrad/cuda/cuda.h>
#include <minigrad/cuda/device_name.h>

namespace mg::samples {

namespace {

// A GPU the table lacks: its float32 GEMM rate (2048², the best of a few, after a warm-up),
// what 32-true's matmuls reach there; the other precisions are measured against it too
// rather than against a guess.
double measure_gpu_gemm(Device device) {
  using Clock = std::chrono::steady_clock;
  const int64_t n = 2048;
  const Tensor a = ones(Shape{n, n}, DType::Float32, device), b = ones(Shape{n, n}, DType::Float32, device);
  double best = 1e30;
  for (int k = 0; k < 4; ++k) {
    cuda::synchronize(device.index());
    const auto t0 = Clock::now();
    const Tensor c = ops::matmul(a, b);
    cuda::synchronize(device.index());
    if (k > 0) best = std::min(best, std::chrono::duration<double>(Clock::now() - t0).count());
  }
  return 2.0 * static_cast<double>(n * n * n) / best;
}

}  // namespace

plan::Precision plan_precision(Precision precision) {
  switch (precision) {
    case Precision::True32: return plan::Precision::True32;
    case Precision::BF16Mixed: return plan::Precision::BF16Mixed;
    case Precision::F16Mixed: return plan::Precision::F16Mixed;
    case Precision::BF16True: return plan::Precision::BF16True;
  }
  return plan::Precision::True32;
}

PeakFlops peak_for(const std::optional<plan::DeviceSpec>& row, const std::string& device_name,
                   plan::Precision precision, const std::function<double()>& measure) {
  PeakFlops peak;
  if (row) {
    peak.flops = row->peak_flops(precision);
    peak.description = fmt::format("{}'s dense {} peak of {:.1f} TFLOP/s ({})", row->description,
                                   precision == plan::Precision::True32    ? "float32"
                                   : precision == plan::Precision::F16Mixed ? "float16"
                                                                            : "bfloat16",
                                   peak.flops / 1e12, row->source);
    return peak;
  }
  peak.flops = measure();
  peak.measured = true;
  peak.description =
      device_name.empty()
          ? fmt::format("this CPU's measured GEMM rate of {:.1f} GFLOP/s, not a datasheet peak", peak.flops / 1e9)
          : fmt::format("this GPU's ({}, not in plan/devices.h's table) measured float32 GEMM rate of {:.1f} "
                        "GFLOP/s, not a datasheet peak",
                        device_name, peak.flops / 1e9);
  return peak;
}

PeakFlops device_peak(Device device, Precision precision) {
  const plan::Precision p = plan_precision(precision);
  if (device.is_cuda()) {
    const std::string name = cuda::get_device_name(device.index());
    return peak_for(plan::device_by_runtime_name(name), name, p, [device] { return measure_gpu_gemm(device); });
  }
  return peak_for(std::nullopt, "", p, [] { return plan::measure_cpu().fp32_flops; });
}

int devices_in_job(const std::vector<Device>& devices, int world_size) {
  std::vector<Device> distinct;
  for (const Device& d : devices)
    if (std::find(distinct.begin(), distinct.end(), d) == distinct.end()) distinct.push_back(d);
  return std::max<int>(1, static_cast<int>(distinct.size())) * std::max(1, world_size);
}

ThroughputMeter::ThroughputMeter(double flops_per_token, PeakFlops peak, int devices, std::string formula)
    : flops_per_token_(flops_per_token), peak_(std::move(peak)), devices_(devices), formula_(std::move(formula)) {
  MG_CHECK(flops_per_token_ > 0, "ThroughputMeter: flops_per_token {} must be > 0", flops_per_token_);
  MG_CHECK(peak_.flops > 0, "ThroughputMeter: the peak of {} FLOP/s must be > 0", peak_.flops);
  MG_CHECK(devices_ >= 1, "ThroughputMeter: devices {} must be >= 1", devices_);
}

double ThroughputMeter::mfu(double tokens, double seconds) const {
  if (seconds <= 0) return 0;
  return tokens / seconds * flops_per_token_ / (devices_ * peak_.flops);
}

std::string ThroughputMeter::rate(double tokens, double seconds) const {
  return fmt::format("{:.0f} tokens/s, MFU {:.1f} %", seconds > 0 ? tokens / seconds : 0.0,
                     100 * mfu(tokens, seconds));
}

std::string ThroughputMeter::describe() const {
  return fmt::format("MFU: {:.4g} MFLOP a token ({}) against {}{}", flops_per_token_ / 1e6, formula_,
                     devices_ > 1 ? fmt::format("{} x ", devices_) : "", peak_.description);
}

}  // namespace mg::samples
