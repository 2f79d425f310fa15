// The files a run leaves for people to read: the per-epoch metrics CSV (--metrics) and
// the loss and accuracy curves as an SVG (--plot). Both are rewritten after every epoch
// (and at an interrupt), so a run stopped early still leaves them behind.
#pragma once

#include <vector>

#include "metrics.h"
#include "train_options.h"

namespace mg::samples {

void write_training_reports(const TrainOptions& options, const std::vector<EpochMetrics>& history);

}  // namespace mg::samples
