// Per-epoch training metrics: the CSV a run writes with --metrics, and the history a
// checkpoint carries so that a resumed run's CSV and plot show the whole run.
//
//   epoch,train_loss,test_loss,test_accuracy,seconds
//   1,0.512345,0.421234,0.8453,6.21
//
// test_accuracy is a fraction in [0, 1]; seconds is the epoch's wall time (training
// and evaluation).
#pragma once

#include <string>
#include <vector>

namespace mg::samples {

struct EpochMetrics {
  int epoch = 0;
  double train_loss = 0.0;
  double test_loss = 0.0;
  double test_accuracy = 0.0;
  double seconds = 0.0;
};

inline constexpr const char* kMetricsHeader = "epoch,train_loss,test_loss,test_accuracy,seconds";

// The header line and one line per epoch.
std::string metrics_csv(const std::vector<EpochMetrics>& history);
// The inverse of metrics_csv; mg::Error naming `source` and the line on a malformed row.
std::vector<EpochMetrics> parse_metrics_csv(const std::string& text, const std::string& source);

}  // namespace mg::samples
