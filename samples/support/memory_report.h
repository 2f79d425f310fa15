// The end of a training run: this rank's allocator peak beside the planner's bytes for the
// same split, precision and batch (plan/planner.h), one line a rank:
//
//   memory: peak 1.23 MiB on rank 0 (dp 0 pp 0 cp 0 tp 0); the planner: 1.21 MiB (params ...,
//   grads ..., optimizer ..., activations ...), measured / planned 1.017; at the trainer's
//   moments: 1.22 MiB (always ...; the largest of: backward ..., sum ...), measured / that 1.008
//
// The second figure takes the planner's terms at the moments train_gpt holds them
// (trainer_moments.h: what it always holds and the largest of the backward's, the gradient
// sum's and the step's), in 32-true and in the 16-bit precisions over dp, tp, pp and cp
// (± recompute); elsewhere the line says it is not priced so yet. FSDP with recompute (32-true
// over Gloo), bf16-true ZeRO-3 and FSDP's MixedPrecisionPolicy (over Gloo on dp) race with
// the communication thread, so their figure is a range, "at the
// trainer's moments: 13.25 to 14.01 MiB (...; the low: ...; the high adds: ...), measured
// within that range (measured / low 1.040, measured / high 0.984)": within is 0.95 low to
// 1.05 high.
//
// The peak is the device allocator's high-water mark (cpu_max_memory_allocated, or
// cuda::max_memory_allocated: what the benches read), reset where the caller starts
// measuring (reset_peak_memory). The planner prices the training step alone: what the
// trainer keeps beside it (the whole model under --pp, kept for checkpoints; the batch)
// shows as the difference.
#pragma once

#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/core/allocator.h>

#include <minigrad/core/device.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/plan/model_arithmetic.h>
#include <minigrad/plan/planner.h>

#include "split_model.h"
#include "precision.h"

namespace mg::samples {

// "1.23 MiB": bytes as every memory line prints them.
std::string mib(double bytes);

// How a measured peak stands against a range the trainer's moments priced (a race with the
// communication thread: trainer_moments.h, mlp_formulas.h): "measured within that range
// (measured / low 1.040, measured / high 0.984)", within meaning 0.95 of the low to 1.05 of
// the high; below or above it otherwise.
std::string range_verdict(double measured, double low, double high);

// --memory-blocks: the blocks live at `rank`'s peak (cpu_live_blocks_at_peak), a line a size,
// the largest total first, with each size in float32 elements (to match against formulas):
//   memory blocks live at rank 0's peak, largest total first (14.46 MB in all):
//     5 x 774.50 KiB = 3.78 MiB (198272 floats each)
std::string live_blocks_report(int rank, const std::vector<LiveBlocks>& blocks);

// The device allocator's high-water mark since the last reset_peak_memory, and resetting it
// to what is allocated now.
std::size_t max_memory_allocated(Device device);
void reset_peak_memory(Device device);

// The planner's split for a trainer's (--dp ... --recompute; the pipeline's micro-batches
// and schedule).
plan::Split plan_split(const ModelSplit& split);

// The line above for `rank`, at its coordinates of `mesh` (null: one process), with the
// planner's bytes of its pipeline stage for rows of `batch` x `T` tokens a micro-batch step.
// The planner's refusal (a split it cannot price) is said in the line, not thrown.
// `fsdp_mp_policy`: the 16-bit casts are FSDP's MixedPrecisionPolicy's (train_gpt
// --fsdp-mp-policy), not autocast's: the second figure is a range (the gather ahead races
// with Gloo's thread), priced for the GPT's ZeRO-3 over Gloo on dp alone without recompute.
std::string memory_report(std::size_t peak_bytes, int rank, const parallel::DeviceMesh* mesh,
                          const plan::ModelArithmetic& model, const ModelSplit& split, int64_t batch, int64_t T,
                          Precision precision, bool fsdp_mp_policy = false);

}  // namespace mg::samples
