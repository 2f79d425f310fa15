#include "training_reports.h"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <minigrad/core/files.h>

#include "svg_plot.h"

namespace mg::samples {

void write_training_reports(const TrainOptions& options, const std::vector<EpochMetrics>& history) {
  if (!options.metrics.empty())
    files::write_atomically("--metrics", options.metrics, metrics_csv(history));
  if (!options.plot.empty() && !history.empty())
    write_training_plot(
        options.plot, history,
        fmt::format("Fashion-MNIST MLP 784-{}-10, {}, batch {}", fmt::join(options.hidden, "-"),
                    optimizer_str(options), options.batch_size));
}

}  // namespace mg::samples
