// --distributed: one process per device, started by minigrad-run (or torchrun), which
// sets RANK, WORLD_SIZE, LOCAL_RANK, MASTER_ADDR and MASTER_PORT:
//
//   minigrad-run --nproc-per-node 2 build/bin/train_fashion_mnist --distributed --devices cpu
//
// Each process joins the job's process group (Gloo on the CPU, NCCL on GPUs), trains a
// replica wrapped in DistributedDataParallel on its own shard of every epoch, and agrees
// with the others on what one process decides alone otherwise: whether the loss is finite,
// whether to stop at a signal, the epoch's training loss. Rank 0 alone writes files.
//
// With --tensor-parallel N the ranks form a DeviceMesh (dp = world / N) x N: each group
// of N neighbouring ranks shares the layers of one model, and data parallelism runs
// across the groups: the data is split over dp ranks, not over all of them.
#pragma once

#include <memory>
#include <vector>

#include <minigrad/core/device.h>
#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::samples {

struct DistributedRun {
  std::shared_ptr<parallel::ProcessGroup> group;  // every rank; null: a run of one process
  int rank = 0;
  int world_size = 1;
  // The ranks that split the data (all of them without tensor parallelism), this rank's
  // place among them, and the group that averages the gradients over them.
  std::shared_ptr<parallel::ProcessGroup> data_group;
  int data_rank = 0;
  int data_ranks = 1;
  // With --tensor-parallel: the ranks that share this rank's layers; null otherwise.
  std::shared_ptr<parallel::ProcessGroup> tensor_group;
  bool active() const { return group != nullptr; }
  bool writes_files() const { return rank == 0; }
};

// Joins the job described by the environment (Gloo on the CPU, NCCL on GPUs), waiting up
// to `timeout_seconds` for the other ranks. `devices` (those of --devices) becomes this
// rank's one device: the CPU, or the GPU of the list at LOCAL_RANK. The whole job is its
// group; train_gpt's split builds its mesh over it (split_model.h).
DistributedRun join_job(double timeout_seconds, std::vector<Device>& devices);

// join_job, then train_fashion_mnist's groups: `tensor_parallel` must divide the number of
// ranks, and `global_batch` the data-parallel ranks (an OptionError otherwise).
DistributedRun join_distributed_run(double timeout_seconds, int64_t global_batch,
                                    int tensor_parallel, std::vector<Device>& devices);

// Sums each tensor over the ranks, in place; nothing to do in a run of one process.
void sum_over_ranks(const DistributedRun& dist, const std::vector<Tensor>& tensors);
// The same over the data-parallel ranks: with tensor parallelism the ranks of one group
// see the same examples, which must be counted once.
void sum_over_data_ranks(const DistributedRun& dist, const std::vector<Tensor>& tensors);

}  // namespace mg::samples
