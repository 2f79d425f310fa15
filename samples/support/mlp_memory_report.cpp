#include "mlp_memory_report.h"

#include <optional>

#include <fmt/format.h>

namespace mg::samples {

namespace {

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

}  // namespace

std::string mlp_memory_report(std::size_t peak_bytes, int rank, const MLPRun& run) {
  const std::string measured = fmt::format("memory: peak {} on rank {}", mib(static_cast<double>(peak_bytes)), rank);
  if (!run.cpu) return measured + "; the planner prices the CPU's allocator only so far";
  if (!run.float32) return measured + "; the planner prices 32-true only so far";
  if (run.devices_in_one_process > 1 && run.split.tp > 1)
    return measured + "; the planner does not price tensor parallelism in one process yet";
  const std::optional<plan::RankMemory> r =
      plan::mlp_rank_memory(run.config, run.split, run.rank_rows, run.optimizer, run.devices_in_one_process);
  if (!r)
    return fmt::format("{}; the planner does not price {} yet", measured,
                       run.split.pp > 1 ? "the pipeline" : "ZeRO-3");
  const double data = plan::mlp_data_bytes(run.config, run.train_images, run.test_images, run.rank_rows);
  const double planned = r->total() + data;
  return fmt::format("{}; the planner: {} (params {}, grads {}, optimizer {}, buffers {}, activations {}, data {}), "
                     "measured / planned {:.3f}",
                     measured, mib(planned), mib(r->params), mib(r->grads), mib(r->optimizer), mib(r->buffers),
                     mib(r->activations), mib(data), static_cast<double>(peak_bytes) / planned);
}

}  // namespace mg::samples
