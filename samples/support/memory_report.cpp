#include "memory_report.h"

#include <algorithm>

#include <fmt/format.h>

#include <minigrad/core/allocator.h>
#include <minigrad/core/error.h>
#include <minigrad/cuda/cuda.h>

#include "throughput.h"  // plan_precision

namespace mg::samples {

namespace {

std::string mib(double bytes) { return fmt::format("{:.2f} MiB", bytes / (1024.0 * 1024.0)); }

// The share of a pipeline stage's parameters whose chunks ran a backward before the stage's
// peak (each interleaved chunk is a virtual stage of a pp x v cut).
double gone_back_share(const plan::ModelArithmetic& model, const ModelSplit& split, int stage, int64_t batch,
                       int64_t T) {
  const plan::Split s = plan_split(split);
  plan::MeshShape mesh;
  mesh.dp = s.dp;
  mesh.tp = s.tp;
  mesh.pp = s.pp;
  mesh.cp = s.cp;
  mesh.batch = batch;
  mesh.T = T;
  mesh.micro_batches = s.micro_batches;
  mesh.model_chunks = s.schedule == plan::Schedule::Interleaved ? s.virtual_stages : 1;
  const plan::PipelinePeak peak = plan::pipeline_peak(mesh, stage);
  const int v = mesh.model_chunks;
  double gone = 0, all = 0;
  for (int c = 0; c < v; ++c) {
    const double chunk = model.stage_param_elements(s.tp, s.pp * v, c * s.pp + stage);
    all += chunk;
    if (peak.gone_back[static_cast<size_t>(c)]) gone += chunk;
  }
  return gone / all;
}

}  // namespace

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
    // The planner sums every term at its largest. This trainer holds them at different
    // moments: opt->zero_grad() sets the gradients to none, and minigrad's engine adds each
    // weight's gradient into .grad at the end of backward (AccumulateGrad nodes run last),
    // so at the backward's peak no gradient is held; its dp or cp reduction
    // (reduce_partial_gradients) copies the gradients twice after backward (a flat copy and
    // the all-reduce's), when the activations are gone, instead of DDP's standing buckets;
    // and under --pp it keeps the model the pipeline was cut from (the whole single-device
    // model, its tp shard under tp) beside its stage for checkpoints. Its peak is the larger
    // of the two moments on top of what it always holds. ZeRO-2 makes its buckets' flat
    // gradients once the last block's c_proj has gone back (half its buffers, at a later
    // moment than the activations' peak: plan::gpt_zero2_released_bytes; the
    // reduce-scatter's scratch comes after, with the gradients, when the activations are
    // gone); FSDP holds its gathered units (its buffers) at the backward's peak. The 16-bit
    // precisions add what the ops keep beside the activations at 2 bytes a float (below).
    // Not priced so yet: the 16-bit precisions with tp, pp, cp or recompute or under FSDP's
    // MixedPrecisionPolicy (its casts are not autocast's), and FSDP with recomputed blocks
    // (1.22 of this on train_gpt's default GPT).
    // bf16-mixed and 16-mixed on one device or over dp (any ZeRO stage):
    // plan::gpt_bf16_mixed_extra_bytes (float32 residual stream and statistics, the linears'
    // 16-bit weight casts, a float32 backward working set, the head's float32 gradient).
    // bf16-true likewise: plan::gpt_bf16_true_extra_bytes (float32 statistics, the float32
    // backward working set, the head's bfloat16 gradient); its float32 masters are held
    // throughout, their float32 gradients only from the step's prepare_gradients to the next
    // zero_grad (half the planner's masters each).
    const auto* gpt = dynamic_cast<const plan::GPTArithmetic*>(&model);
    const bool dp_only = gpt != nullptr && split.tp == 1 && split.pp == 1 && split.cp == 1 && !split.recompute &&
                         !fsdp_mp_policy;
    const bool mixed = precision == Precision::BF16Mixed || precision == Precision::F16Mixed;
    const bool bf16_true = precision == Precision::BF16True;
    plan::PrecisionExtraBytes extra;
    double zero2_released = 0;
    if (dp_only) {
      plan::MeshShape shape;
      shape.dp = split.dp;
      shape.batch = batch;
      shape.T = T;
      if (mixed) extra = plan::gpt_bf16_mixed_extra_bytes(gpt->config(), shape, split.zero);
      if (bf16_true) extra = plan::gpt_bf16_true_extra_bytes(gpt->config(), shape, split.zero);
      if (split.zero == 2)
        zero2_released = plan::gpt_zero2_released_bytes(gpt->config(), shape,
                                                        precision == Precision::True32 ? 4 : 2, mixed);
    }
    if ((precision != Precision::True32 && !dp_only) || (split.zero == 3 && split.recompute))
      return fmt::format("{}; the planner: {} ({}), measured / planned {:.3f}; not priced at the trainer's "
                         "moments yet (16-bit precisions beyond dp or under FSDP's mixed precision policy, FSDP with "
                         "recompute)",
                         measured, mib(r.total()), parts, static_cast<double>(peak_bytes) / r.total());
    const double pb = workload.precision == plan::Precision::BF16True ? 2 : 4;
    // Gloo (the CPU's process group) has no 16-bit reduction: a 16-bit tensor is summed as a
    // float32 copy (twice its bytes: `wire`) and rounded back into its dtype on arrival.
    const bool widened = pb == 2 && split.dp > 1 && mesh != nullptr && mesh->world()->backend_name() == "gloo";
    const double wire = widened ? 4 / pb : 1;
    // The kept model is the one the pipeline was cut from: under tp, this rank's tp shard.
    const double kept = split.pp > 1 ? pb * model.stage_param_elements(split.tp, 1, 0) : 0;
    const double flat = split.zero == 2 ? r.buffers / 2 : 0;  // ZeRO-2's buckets' flat gradients
    // The dp sum: its two copies, and over Gloo in 16 bits the all-reduce's float32 wire and
    // the sum rounded back; ZeRO-2's reduce-scatter: its flat gradients and a scratch of their
    // size on the wire, and in 16 bits their widened copy, the float32 shard received and
    // the shard rounded back.
    const double reduced =
        (split.dp > 1 || split.cp > 1) && split.zero <= 1
            ? 3 * r.grads + (widened ? (wire + 1) * r.grads : 0)
        : split.zero == 2 ? r.grads + flat + wire * flat + (widened ? wire * flat + (wire + 1) * r.grads : 0)
                          : r.grads;
    // bf16-true's step: the masters' float32 gradients beside the bfloat16 ones.
    const double masters = r.master / 2;
    const double stepped = bf16_true ? r.grads + masters : 0;
    // FSDP: its gathered units, and over Gloo in 16 bits the unit being gathered ahead as
    // float32 (the whole unit and this rank's shard of it, widened) and the unit rounded back,
    // which the communication thread makes at a moment of its own: some runs' peaks hold it,
    // some not (bf16-true: 15.54 to 15.92 MiB a rank), and the figure is the most.
    const double unit = pb * model.block_param_elements(1);
    const double gathered =
        split.zero == 3 ? r.buffers + (widened ? (wire * (1 + 1.0 / split.dp) + 1) * unit : 0) : 0;
    // Under --pp a stage's activation peak is a backward late in its schedule
    // (plan::pipeline_peak); the chunks that ran a backward before it (under 1F1B, when
    // m > pp - stage micro-batches) have their gradients in .grad already.
    const double grads_at_peak = split.pp > 1 ? r.grads * gone_back_share(model, split, stage, batch, T) : 0;
    const double in_backward = std::max(r.activations + extra.total() + grads_at_peak + gathered,
                                        split.zero == 2 ? r.activations + extra.total() - zero2_released + flat : 0);
    const double trainer = r.params + (bf16_true ? masters : r.master) + r.optimizer + kept +
                           std::max({in_backward, reduced, stepped});
    const bool priced16 = mixed || bf16_true;
    return fmt::format(
        "{}; the planner: {} ({}), measured / planned {:.3f}; at the trainer's moments: {} "
        "(params, {}optimizer{} and the {} of activations {}{}{}{}{}{}gradients{} {}{}{}), measured / that {:.3f}",
        measured, mib(r.total()), parts, static_cast<double>(peak_bytes) / r.total(), mib(trainer),
        bf16_true ? "float32 masters " + mib(masters) + ", " : "",
        kept > 0 ? ", the whole model kept under --pp " + mib(kept) : "", bf16_true ? "largest" : "larger",
        mib(r.activations),
        priced16 ? fmt::format(" with {}'s float32 saved tensors {}{}, float32 backward working set {} and head gradient {}",
                               mixed ? "autocast" : "bf16-true", mib(extra.float32_saved),
                               mixed ? ", 16-bit weight casts " + mib(extra.weight_casts) : "", mib(extra.backward),
                               mib(extra.head_grad))
                 : "",
        grads_at_peak > 0 ? " with the gradients of the backwards before" : "",
        split.zero == 3 ? fmt::format(" with ZeRO-3's gathered units {}{}", mib(gathered),
                                      widened ? " (one gathered as float32 over Gloo)" : "")
                        : "",
        split.zero == 2 ? (zero2_released > 0 ? fmt::format(" (after c_proj's backward: less {}, with ZeRO-2's flat "
                                                            "gradients {})",
                                                            mib(zero2_released), mib(flat))
                                              : fmt::format(" with ZeRO-2's flat gradients {}", mib(flat)))
                        : "",
        bf16_true ? ", " : " and ",
        split.zero == 2    ? " with the buckets and their reduce-scatter's scratch"
        : reduced > r.grads ? " with their dp/cp sum's two copies"
                            : "",
        mib(reduced), widened && split.zero != 3 ? " (16-bit sums over Gloo in float32)" : "",
        bf16_true ? " and the step's gradients with the masters' float32 ones " + mib(stepped) : "",
        static_cast<double>(peak_bytes) / trainer);
  } catch (const Error& e) {
    return fmt::format("{}; the planner cannot price this split: {}", measured, e.what());
  }
}

}  // namespace mg::samples
