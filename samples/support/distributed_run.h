// --distributed: one process per device, started by minigrad-run (or torchrun), which
// sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT:
//
//   minigrad-run --nproc-per-node 2 build/bin/train_fashion_mnist --distributed --devices cpu
//
// Each process joins the job's process group (Gloo on the CPU, NCCL on GPUs), trains a
// replica wrapped in DistributedDataParallel on its own shard of every epoch, and agrees
// with the others on what one process decides alone otherwise: whether the loss is finite,
// whether to stop at a signal, the epoch's training loss. Rank 0 alone writes files.
#pragma once

#include <memory>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/core/tensor.h>
#include <minigrad/parallel/distributed/process_group.h>

namespace mg::samples {

struct DistributedRun {
  std::shared_ptr<parallel::ProcessGroup> group;  // null: a run of one process
  int rank = 0;
  int world_size = 1;
  bool active() const { return group != nullptr; }
  bool writes_files() const { return rank == 0; }
};

// Joins the job described by the environment, waiting up to `timeout_seconds` for the
// other ranks. `devices` (those of --devices) becomes this rank's one device: the CPU, or
// the GPU of the list at LOCAL_RANK. `global_batch` must divide evenly over the ranks
// (an OptionError otherwise).
DistributedRun join_distributed_run(double timeout_seconds, int64_t global_batch,
                                    std::vector<Device>& devices);

// Sums each tensor over the ranks, in place; nothing to do in a run of one process.
void sum_over_ranks(const DistributedRun& dist, const std::vector<Tensor>& tensors);

}  // namespace mg::samples
