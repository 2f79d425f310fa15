// The training curves as a self-contained SVG a person can open in a browser: train
// and test loss per epoch on the left, test accuracy on the right, with axes, ticks,
// labels and legends. Hand-written SVG: no plotting library, nothing to install.
#pragma once

#include <string>
#include <vector>

#include "metrics.h"

namespace mg::samples {

// The SVG document for `history` (at least one epoch), under `title`.
std::string training_plot_svg(const std::vector<EpochMetrics>& history, const std::string& title);

// training_plot_svg written to `path` with files::write_atomically (minigrad/core/files.h).
void write_training_plot(const std::string& path, const std::vector<EpochMetrics>& history,
                         const std::string& title);

// A language model's curves: train and validation loss at each evaluation, against the
// step (`x_label`), in one panel (train_gpt's --plot).
struct LossPoint {
  double x = 0, train_loss = 0, val_loss = 0;
};
std::string loss_plot_svg(const std::vector<LossPoint>& points, const std::string& x_label,
                          const std::string& title);
void write_loss_plot(const std::string& path, const std::vector<LossPoint>& points,
                     const std::string& x_label, const std::string& title);

}  // namespace mg::samples
