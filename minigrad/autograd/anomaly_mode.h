// Anomaly detection, as torch.autograd.detect_anomaly: while it is on, the backward
// engine checks the gradients every node returns and throws an mg::Error naming the
// first node whose backward produced a NaN or an infinity (e.g. "LogBackward: ..."),
// and forward records on every node what created it (op, inputs), so that message can
// point back at the forward computation.
//
// It costs a reduction and a host sync per gradient, so it is a debugging switch:
//
//   mg::DetectAnomalyGuard detect;   // on for this scope
//   loss.backward();                 // throws at the first non-finite gradient
//
// The flag is process-wide, not per thread: DataParallel runs replica forwards on
// worker threads, and those must record creation contexts too.
#pragma once

#include <string>
#include <vector>

#include <minigrad/core/tensor.h>

namespace mg {

class AnomalyMode {
 public:
  static bool is_enabled();
  static void set_enabled(bool enabled);
};

// Turns anomaly detection on for a scope and restores the previous setting on exit.
class DetectAnomalyGuard {
 public:
  DetectAnomalyGuard() : previous_(AnomalyMode::is_enabled()) { AnomalyMode::set_enabled(true); }
  ~DetectAnomalyGuard() { AnomalyMode::set_enabled(previous_); }
  DetectAnomalyGuard(const DetectAnomalyGuard&) = delete;
  DetectAnomalyGuard& operator=(const DetectAnomalyGuard&) = delete;

 private:
  bool previous_;
};

namespace anomaly {

// What forward knew when it created a node: its inputs' shapes, dtypes, devices and
// where each came from ("[4, 3] float32 cpu from MulBackward", "... leaf").
std::string describe_forward(const std::vector<Tensor>& inputs);

// True when `t` is a floating-point tensor holding a NaN or an infinity (any device).
bool has_non_finite(const Tensor& t);

// Throws the anomaly error for gradient `index` of `node_name`'s backward.
[[noreturn]] void report_non_finite(const std::string& node_name,
                                    const std::string& creation_context, size_t index,
                                    const Tensor& grad);

}  // namespace anomaly
}  // namespace mg
