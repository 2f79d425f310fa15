#include "memory_report.h"

#include <algorithm>

#include <fmt/format.h>

#include <minigrad/core/allocator.h>
#include <minigrad/core/error.h>
#include <minigrad/cuda/cuda.h>

#include "throughput.h"  // plan_precision
#include "trainer_moments.h"

namespace mg::samples {

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

std::string range_verdict(double measured, double low, double high) {
  const char* where = measured < 0.95 * low    ? "below that range"
                      : measured > 1.05 * high ? "above that range"
                                               : "within that range";
  return fmt::format("measured {} (measured / low {:.3f}, measured / high {:.3f})", where, measured / low,
                     measured / high);
}

std::size_t max_memory_allocated(Device device) {
  return device.is_cuda() ? cuda::max_memory_allocated(device.index()) : cpu_max_memory_allocated();
}

std::string live_blocks_report(int rank, const std::vector<LiveBlocks>& blocks) {
  std::size_t total = 0;
  for (const LiveBlocks& b : blocks) total += b.bytes * static_cast<std::size_t>(b.count);
  std::string out = fmt::format("memory blocks live at rank {}'s peak, largest total first ({} in all):\n", rank,
                                mib(static_cast<double>(total)));
  for (const LiveBlocks& b : blocks)
    out += fmt::format("  {} x {} = {} ({} floats each)\n", b.count, format_bytes(b.bytes),
                       mib(static_cast<double>(b.bytes * static_cast<std::size_t>(b.count))),
                       static_cast<double>(b.bytes) / 4);
  return out;
}

void reset_peak_memory(Device device) {
  if (device.is_cuda()) cuda::reset_peak_memory_stats(device.index());
  else cpu_reset_peak_memory_stats();
}

plan::Split plan_split(const ModelSplit& s) {
  plan::Split p;
  p.dp = s.dp;
  p.tp = s.tp;
  p.pp = s.pp;
  p.cp = s.cp;
  p.sequence_parallel = s.sequence_parallel;
  p.zero = s.zero;
  p.micro_batches = s.pp > 1 ? (s.micro_batches > 0 ? s.micro_batches : s.pp) : 0;
  p.schedule = s.interleaved ? plan::Schedule::Interleaved : plan::Schedule::OneFOneB;
  p.virtual_stages = s.interleaved ? s.model_chunks : 2;
  p.recompute = s.recompute;
  return p;
}

std::string memory_report(std::size_t peak_bytes, int rank, const parallel::DeviceMesh* mesh,
                          const plan::ModelArithmetic& model, const ModelSplit& split, int64_t batch, int64_t T,
                          Precision precision, bool fsdp_mp_policy) {
  const int stage = mesh ? mesh->rank("pp") : 0;
  const std::string measured =
      fmt::format("memory: peak {} on rank {}{}", mib(static_cast<double>(peak_bytes)), rank,
                  mesh ? fmt::format(" (dp {} pp {} cp {} tp {})", mesh->rank("dp"), stage, mesh->rank("cp"),
                                     mesh->rank("tp"))
                       : "");
  plan::Workload workload;
  workload.batch = batch;
  workload.seq_len = T;
  workload.precision = plan_precision(precision);
  try {
    // The device only prices time; the bytes are the device's own.
    const plan::Plan p = plan::plan_model(model, plan_split(split), workload, plan::device_table().front());
    MG_CHECK(stage >= 0 && static_cast<size_t>(stage) < p.stages.size(), "memory_report: stage {} outside the {} stages",
             stage, p.stages.size());
    const plan::RankMemory& r = p.stages[static_cast<size_t>(stage)];
    std::string parts = fmt::format("params {}, grads {}", mib(r.params), mib(r.grads));
    if (r.master > 0) parts += ", masters " + mib(r.master);
    parts += ", optimizer " + mib(r.optimizer);
    if (r.buffers > 0) parts += ", buffers " + mib(r.buffers);
    parts += ", activations " + mib(r.activations);
    // The planner sums every term at its largest; the trainer holds them at moments of
    // their own (trainer_moments.h).
    const bool gloo = mesh != nullptr && mesh->world()->backend_name() == "gloo";
    const auto moments = trainer_moments(r, model, split, stage, batch, T, precision, fsdp_mp_policy, gloo);
    const std::string planned = fmt::format("{}; the planner: {} ({}), measured / planned {:.3f}", measured,
                                            mib(r.total()), parts, static_cast<double>(peak_bytes) / r.total());
    if (!moments)
      return planned + "; not priced at the trainer's moments yet (FSDP over NCCL, a model whose formulas do "
                       "not price the 16-bit precisions)";
    const double measured_bytes = static_cast<double>(peak_bytes);
    if (moments->is_range()) {  // a race with the communication thread (trainer_moments.h)
      const double low = moments->low(), high = moments->high();
      return fmt::format("{}; at the trainer's moments: {:.2f} to {} ({}), {}", planned, low / (1024.0 * 1024.0),
                         mib(high), moments->describe_range(), range_verdict(measured_bytes, low, high));
    }
    return fmt::format("{}; at the trainer's moments: {} ({}), measured / that {:.3f}", planned,
                       mib(moments->peak()), moments->describe(), measured_bytes / moments->peak());
  } catch (const Error& e) {
    return fmt::format("{}; the planner cannot price this split: {}", measured, e.what());
  }
}

}  // namespace mg::samples
