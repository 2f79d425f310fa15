// train_fashion_mnist's checkpoint: the model, the optimizer's state and where the run
// stands, in one safetensors file, so that --resume continues with the same parameters,
// momentum, shuffled order and learning rate as a run that was never stopped (bit for bit
// on the CPU). Written after every epoch with --save, and at an interrupt in mid-epoch.
//
//   tensors   model.<name>       the parameters (nn::state_dict)
//             optim.<key>        the optimizer's state_dict (SGD: momentum_buffer.<i>;
//                                AdamW: step.<i>, exp_avg.<i>, exp_avg_sq.<i>)
//             progress.loss_sum  mid-epoch only: the epoch's training loss so far
//             scaler.<key>       --precision 16-mixed: the GradScaler's state (torch's keys)
//   metadata  epoch, epoch_batches, epoch_seen, batch_size, optimizer, hidden, seed, generator_seed,
//             generator_offset, metrics (the per-epoch CSV so far), precision
//
// Under --precision bf16-true the model is bfloat16 (safetensors BF16) and the optimizer's
// state holds the float32 masters ("master.<i>", optim::MasterWeights) beside its own.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/nn/module.h>
#include <minigrad/nn/optim/optimizer.h>

#include "metrics.h"
#include "precision.h"
#include "train_options.h"
#include "training_state.h"

namespace mg::samples {

// Where a run stands: `epochs_done` whole epochs, then `batches` batches of the next one
// (a checkpoint written at an interrupt), whose training loss so far, summed over its
// `seen` examples, is `loss_sum`.
struct RunPosition {
  int epochs_done = 0;
  int64_t batches = 0;
  int64_t seen = 0;
  Tensor loss_sum;  // float32 scalar; undefined when batches == 0
  uint64_t digest = 0;  // resumed: a hash of the checkpoint's contents, which ranks compare

  // The end of epoch `epochs`: the start of the next one.
  static RunPosition after_epoch(int epochs) {
    RunPosition position;
    position.epochs_done = epochs;
    return position;
  }
};

// Writes the model's and the optimizer's state (TrainingState::model_state() and
// optimizer_state(), which under --zero every rank computes together and rank 0 writes).
void save_training_checkpoint(const std::string& path, const nn::TensorDict& model_state,
                              const nn::TensorDict& optimizer_state, const TrainOptions& options,
                              const RunPosition& position,
                              const std::vector<EpochMetrics>& history,
                              const MixedPrecision& precision);

// Loads a checkpoint written by save_training_checkpoint into the model and the optimizer
// of `state` (both checked before either changes) and the default generator; returns where
// the run stood when it was written, and fills `history`. mg::Error naming the file and the
// flag to pass when the checkpoint does not fit the options (--hidden, --batch-size), and
// naming the key and its range when a number in its metadata is out of range (a position
// past the end of an epoch of `batches_per_epoch` batches, when that is given, or more
// examples seen than its batches hold), and when it was written with another --precision
// (one from before --precision is 32-true's). `precision` takes the scaler's state.
RunPosition load_training_checkpoint(const std::string& path, TrainingState& state,
                                     const TrainOptions& options,
                                     std::vector<EpochMetrics>& history,
                                     MixedPrecision& precision,
                                     int64_t batches_per_epoch = 0);

}  // namespace mg::samples
