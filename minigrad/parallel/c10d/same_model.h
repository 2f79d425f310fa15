// What every data-parallel wrapper (DistributedDataParallel, ZeroRedundancyOptimizer,
// fully_shard) does first: check that all ranks built the same model, then
// start them from rank 0's values.
#pragma once

#include <string>
#include <vector>

#include <minigrad/nn/module.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

// Every rank runs the same three collectives whatever it finds, so a mismatch makes all
// ranks fail together (mg::Error starting with `who`, naming the first tensor that differs
// on that rank), instead of leaving some waiting in the next collective.
void check_same_shapes_across_ranks(ProcessGroup& group,
                                    const std::vector<nn::NamedTensor>& tensors,
                                    const std::string& who);

// In place: every rank's tensors become rank 0's (one coalesced broadcast per dtype).
void broadcast_from_rank0(ProcessGroup& group, const std::vector<Tensor>& tensors);

// PyTorch's _sync_module_states: the two steps above over a module's parameters and
// buffers, so that every replica starts as rank 0's (DistributedDataParallel starts this
// way; fully_shard runs the two steps on each unit's parameters).
void sync_module_states(ProcessGroup& group, const nn::Module& module, const std::string& who);

}  // namespace mg::parallel
