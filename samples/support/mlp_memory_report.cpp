#include "mlp_memory_report.h"

#include <optional>
#include <vector>

#include <fmt/format.h>

#include "memory_report.h"  // mib, range_verdict

namespace mg::samples {
namespace {

// "stage 0 in B2, stage 1 after B1, stage 2 done": where each stage's thread is at a moment.
std::string stage_places(const std::vector<std::string>& at) {
  std::string out;
  for (size_t s = 0; s < at.size(); ++s)
    out += fmt::format("{}stage {} {}", s == 0 ? "" : ", ", s, at[s]);
  return out;
}

}  // namespace

std::string mlp_memory_report(std::size_t peak_bytes, int rank, const MLPRun& run) {
  const std::string measured = fmt::format("memory: peak {} on rank {}", mib(static_cast<double>(peak_bytes)), rank);
  if (!run.cpu) return measured + "; the planner prices the CPU's allocator only so far";
  if (run.split.zero == 3 && run.split.pp == 1 && run.gloo) {
    if (const auto z = plan::mlp_zero3_memory(run.config, run.split, run.rank_rows, run.optimizer, run.precision)) {
      // A race with Gloo's communication thread (mlp_formulas.h): a range.
      const double data = plan::mlp_data_bytes(run.config, run.train_images, run.test_images, run.rank_rows);
      const double low = z->low.total() + data, high = z->high() + data;
      return fmt::format("{}; the planner: {:.2f} to {} (the low: params {}, masters {}, grads {}, optimizer {}, buffers {}, "
                         "activations {}, data {}; the high adds: the reduce-scatter's scratch (the {} Linear's, on "
                         "Gloo's thread) {}{} (a race with Gloo's communication thread)), {}",
                         measured, low / (1024.0 * 1024.0), mib(high), mib(z->low.params), mib(z->low.master), mib(z->low.grads),
                         mib(z->low.optimizer), mib(z->low.buffers), mib(z->low.activations), mib(data),
                         z->high_at_launch ? "first" : "second", mib(z->scratch - z->high_below_low),
                         z->high_below_low > 0
                             ? fmt::format(" (its buffers {} at {}, which is {} below the low's moment)", mib(z->scratch),
                                           z->high_at_launch ? "the first Linear's launch" : "the moment before it",
                                           mib(z->high_below_low))
                             : std::string(),
                         range_verdict(static_cast<double>(peak_bytes), low, high));
    }
  }
  if (run.precision != plan::MLPPrecision::True32) {
    // 16 bits: one device, DDP, ZeRO-1, ZeRO-2, ZeRO-3 (above) and tp over ranks so far (mlp_formulas.h).
    const std::optional<plan::RankMemory> r = plan::mlp_rank_memory(
        run.config, run.split, run.rank_rows, run.optimizer, run.devices_in_one_process, run.precision);
    if (!r) return measured + "; the planner prices 16 bits on one device, DDP, ZeRO-1, ZeRO-2, ZeRO-3 and tp over ranks only so far";
    const double planned = r->total() + plan::mlp_data_bytes(run.config, run.train_images, run.test_images, run.rank_rows);
    return fmt::format("{}; the planner: {} (params {}, masters {}, grads {}, optimizer {}, buffers {}, activations {}, "
                       "data {}), measured / planned {:.3f}",
                       measured, mib(planned), mib(r->params), mib(r->master), mib(r->grads), mib(r->optimizer),
                       mib(r->buffers), mib(r->activations),
                       mib(plan::mlp_data_bytes(run.config, run.train_images, run.test_images, run.rank_rows)),
                       static_cast<double>(peak_bytes) / planned);
  }
  if (run.devices_in_one_process > 1 && run.split.tp > 1) {
    const auto t = plan::mlp_tp_in_process_memory(run.config, run.split.tp, run.rank_rows, run.optimizer);
    if (!t) return measured + "; the planner does not price this tensor parallelism in one process";
    // The ranks' threads meet at the all-reduces (mlp_formulas.h): a range.
    const double data = plan::mlp_data_bytes(run.config, run.train_images, run.test_images, run.rank_rows);
    const double low = t->low.total() + data, high = t->high() + data;
    return fmt::format("{}; the planner: {:.2f} to {} (the low: params {}, grads {}, optimizer {}, activations {}, "
                       "data {}: the ranks' threads together in {}, one at its largest moment, the others as low "
                       "as they can be between the same two barriers; the high adds: the others at their largest "
                       "moment too ({}) {} (a race between the ranks' threads)), {}",
                       measured, low / (1024.0 * 1024.0), mib(high), mib(t->low.params), mib(t->low.grads),
                       mib(t->low.optimizer), mib(t->low.activations), mib(data),
                       t->backward ? "backward" : "forward",
                       t->backward ? "each its first Linear's output gradient, beside its weight gradient"
                                   : "each a row layer's bias-added output",
                       mib(t->racing),
                       range_verdict(static_cast<double>(peak_bytes), low, high));
  }
  const std::optional<plan::RankMemory> r =
      plan::mlp_rank_memory(run.config, run.split, run.rank_rows, run.optimizer, run.devices_in_one_process);
  const double data = plan::mlp_data_bytes(run.config, run.train_images, run.test_images, run.rank_rows);
  if (!r && run.split.pp > 1 && run.split.dp == 1 && run.split.tp == 1 && run.split.zero == 0) {
    if (const auto p = plan::mlp_pipe_memory(run.config, run.split.pp, run.rank_rows, run.split.micro_batches,
                                             run.pipe_1f1b, run.optimizer)) {
      // The stages' threads meet only at their hand-offs (mlp_formulas.h): a range.
      const double low = p->low.total() + data, high = p->high() + data;
      return fmt::format("{}; the planner: {:.2f} to {} (the low: params {}, optimizer {}, activations {} (the "
                         "stages' threads, their gradients among them, and the channels), data {}: the least the "
                         "stages can hold together at the point every run passes that needs most, {}; the high "
                         "adds: the stages at the most they can hold together ({}) {} (a race between the stages' "
                         "threads)), {}",
                         measured, low / (1024.0 * 1024.0), mib(high), mib(p->low.params), mib(p->low.optimizer),
                         mib(p->low.activations), mib(data), stage_places(p->low_at), stage_places(p->high_at),
                         mib(p->racing), range_verdict(static_cast<double>(peak_bytes), low, high));
    }
  }
  if (!r)
    return fmt::format("{}; the planner does not price {} yet", measured,
                       run.split.pp > 1 ? "this pipeline" : "ZeRO-3");
  const double planned = r->total() + data;
  return fmt::format("{}; the planner: {} (params {}, grads {}, optimizer {}, buffers {}, activations {}, data {}), "
                     "measured / planned {:.3f}",
                     measured, mib(planned), mib(r->params), mib(r->grads), mib(r->optimizer), mib(r->buffers),
                     mib(r->activations), mib(data), static_cast<double>(peak_bytes) / planned);
}

}  // namespace mg::samples
