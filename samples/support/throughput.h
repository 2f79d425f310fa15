// Tokens per second and model FLOPs utilisation (MFU) for a trainer's log (PaLM's MFU,
// appendix B; nanoGPT's estimate_mfu):
//
//   MFU = tokens/s x FLOPs per token / (devices x one device's dense peak)
//
// FLOPs per token is the caller's number, so any model brings its own: for the GPT
// plan::gpt_flops_per_token(config, T) = 6 N + 12 L C T, where N = 12 L C² + V C are the
// matmul parameters (the blocks' and the tied head's; embeddings and LayerNorms do no
// matmul), 6 = 2 forward + 4 backward FLOPs a parameter a token, and 12 L C T attention's
// q k^T and att v (2 x 2 T C a layer forward, twice that backward); a Llama passes its
// ModelArithmetic::flops_per_token. The tokens are the whole job's, the devices every rank's,
// so a split's MFU is the job's. Recomputation's second forward is not counted: model
// FLOPs, not hardware FLOPs.
//
// The peak: plan/devices.h's dense figure for the precision (float32 for 32-true, bfloat16
// tensor cores for the others) of the GPU the CUDA runtime names; on the CPU, or a GPU the
// table does not know, a float32 GEMM rate measured at start, which the log says it is.
//
//   ThroughputMeter meter(plan::gpt_flops_per_token(config, T), device_peak(device, precision), world);
//   meter.rate(tokens, seconds)  // "12345 tokens/s, MFU 1.2 %"
#pragma once

#include <functional>
#include <optional>
#include <string>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/plan/devices.h>

#include "precision.h"

namespace mg::samples {

// The planner's precision for a trainer's: 16-mixed as bf16-mixed (float16's dense tensor
// core rate and bytes are bfloat16's on every GPU of the table).
plan::Precision plan_precision(Precision precision);

struct PeakFlops {
  double flops = 0;         // one device's FLOP/s
  std::string description;  // what the log says it is
  bool measured = false;    // measured here, not a datasheet's
};

// The peak of a device whose table row is `row` (none: unknown, or the CPU), named
// `device_name` ("NVIDIA H100 80GB HBM3", or "" for the CPU); `measure` gives the
// fallback's rate, called only when there is no row.
PeakFlops peak_for(const std::optional<plan::DeviceSpec>& row, const std::string& device_name,
                   plan::Precision precision, const std::function<double()>& measure);
// The same for `device`: a GPU looked up by its runtime name (its float32 GEMM measured
// when the table lacks it), the CPU measured (plan::measure_cpu).
PeakFlops device_peak(Device device, Precision precision);

// The devices a run's MFU counts: each rank's distinct devices (DataParallel's "cpu,cpu" is
// one CPU, "0,1" two GPUs) times the ranks.
int devices_in_job(const std::vector<Device>& devices, int world_size);

class ThroughputMeter {
 public:
  // mg::Error naming the bad value unless flops_per_token > 0, peak.flops > 0, devices >= 1.
  // `formula`: how the caller counted its FLOPs, for describe().
  ThroughputMeter(double flops_per_token, PeakFlops peak, int devices, std::string formula = "6 N + 12 L C T");
  // The share of `devices` x peak that `tokens` in `seconds` ran at (0.012 for 1.2 %).
  double mfu(double tokens, double seconds) const;
  // "12345 tokens/s, MFU 1.2 %"
  std::string rate(double tokens, double seconds) const;
  // The line a run prints at its start: the FLOPs a token, the peak and what it is.
  std::string describe() const;

 private:
  double flops_per_token_;
  PeakFlops peak_;
  int devices_;
  std::string formula_;
};

}  // namespace mg::samples
