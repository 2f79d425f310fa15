// Deliberate faults for the parity harness (tests/parity), and nothing else.
//
// The parity table proves that every form of parallelism takes the single-device step.
// A proof that cannot fail proves nothing, so the harness switches on one of these
// faults at a time -- each a small, realistic bug in one form -- and shows that some row
// of the table then fails. Every fault is OFF unless a test sets it: no build option, no
// environment variable, no flag of any program turns one on. The library consults the
// switch at one clearly marked point per fault ("parity fault:" in a comment), outside
// the weekend's reading path; a forked rank inherits the setting of the process that
// forked it. The DataParallel fault sits in the host communicator (CPU replicas), which
// NCCL's does not share; the others are in code every device runs.
//
// It lives in core, not parallel/, because one fault sits in data/ (DistributedSampler),
// which may not include parallel/.
#pragma once

#include <string_view>

namespace mg::testing {

enum class Fault {
  None,
  // DataParallel: the replicas' gradients averaged instead of summed
  // (HostCommunicator::reduce_add divides the sum by the number of replicas).
  DataParallelGradsAveraged,
  // DistributedDataParallel: the last bucket's all-reduce is run on a copy, so its
  // gradients stay each rank's own (Reducer::launch).
  DdpLastBucketNotReduced,
  // ZeRO-1/2: step() never all-gathers the updated shards, so each rank's parameters
  // keep only its own shard's update (ZeroRedundancyOptimizer::step).
  ZeroAllGatherSkipped,
  // ZeRO-2 and FSDP: the padding of the flat gradient buffer is ones, not zeros, so it
  // counts in the sharded clipping norm (FlatParameter::new_flat).
  ShardPaddingInArithmetic,
  // Pipelines: each micro-batch's loss is weighted 1, not rows_j / rows: the micro-batch
  // losses summed instead of averaged (MicroBatches::weight).
  PipelineLossesSummed,
  // Tensor parallelism: RowParallelLinear adds its bias before the all-reduce, so once
  // per rank (RowParallelLinear::forward).
  RowParallelBiasPerRank,
  // DistributedSampler: rank r takes the shard of its neighbour r - 1 (rank 0 its own):
  // no form seeds a random generator per rank yet, and this is the closest real case of
  // a per-rank choice that must differ (DistributedSampler::indices).
  SamplerRankLikeNeighbour,
  // The GPT's tensor parallelism (the GPT's tensor-parallel rows; also
  // tests/distributed/test_gpt_tensor_parallel.cpp):
  // vocab_parallel_cross_entropy skips the all-reduce of the sum of exponentials and the
  // target logit, so each rank normalises over its own slice of the vocabulary.
  VocabParallelLossNotReduced,
  // Sequence parallelism: the gradients of the replicated parameters (LayerNorms, wpe,
  // row layers' biases) are not all-reduced over the tensor-parallel group, so each rank
  // keeps the part from its own positions (parallel/partial_gradients.cpp).
  SequenceParallelGradsNotReduced,
  // Context parallelism (the GPT's context-parallel rows; also
  // tests/distributed/test_ring_attention.cpp and test_gpt_context_parallel.cpp):
  // ring attention treats every off-diagonal causal block as full, so queries also see
  // the keys of later chunks (context_parallel/ring_attention.cpp: block_mask).
  RingAttentionFutureBlocksSeen,
  // the GPT's parameter gradients are left each cp rank's own, never summed over the
  // group (parallel/partial_gradients.cpp, and context_parallel_loss.cpp's all_reduce_gradients).
  ContextParallelGradsNotReduced,
  // Activation checkpointing (the GPT's checkpointed-blocks row, dropout on; also
  // tests/nn/checkpoint_test.cpp): the recomputation reruns a region from the generator's
  // current state, so its dropout masks differ from forward's (nn/checkpoint.cpp,
  // CheckpointBackward).
  CheckpointFreshDropout,
  // Pipelines cut by module name: a tied weight's copies (the GPT's wte on the first stage,
  // its copy lm_head.weight on the last) keep their own shares of the gradient, never
  // summed, so each steps on its own (parallel/partial_gradients.cpp skips the "tied"
  // placements).
  PipelineTiedGradNotSummed,
  // Pipelines: the last micro-batch's loss counted twice, weight 2 rows_j / rows
  // (MicroBatches::weight).
  PipelineMicroBatchCountedTwice,
  // Plans: ColwiseParallel's stride ignored, so c_attn's rows are cut as one block (a rank
  // takes q and part of k, not the q, k and v rows of its heads), while its placement still
  // says stride 3 (ColumnParallelLinear's constructor).
  ColwiseStrideIgnored,
  // Placements: ColumnParallelLinear records its weight's shard as a Replicate of a weight of
  // the shard's shape, so the readers of placements take rank 0's rows for the whole: the
  // distributed clip's norm leaves the other ranks' rows out (the MLP's tensor-parallel rows).
  PlacementReplicateWhereSharded,
};

// Every fault the parity table catches, in declaration order: all but None.
inline constexpr Fault kAllFaults[] = {
    Fault::DataParallelGradsAveraged,     Fault::DdpLastBucketNotReduced,
    Fault::ZeroAllGatherSkipped,          Fault::ShardPaddingInArithmetic,
    Fault::PipelineLossesSummed,          Fault::RowParallelBiasPerRank,
    Fault::SamplerRankLikeNeighbour,      Fault::VocabParallelLossNotReduced,
    Fault::SequenceParallelGradsNotReduced, Fault::RingAttentionFutureBlocksSeen,
    Fault::ContextParallelGradsNotReduced,  Fault::CheckpointFreshDropout,
    Fault::PipelineTiedGradNotSummed,       Fault::PipelineMicroBatchCountedTwice,
    Fault::ColwiseStrideIgnored,            Fault::PlacementReplicateWhereSharded,
};

std::string_view fault_name(Fault fault);

// The fault switched on in this process (Fault::None unless a test set one).
Fault active_fault();
inline bool fault_is_on(Fault fault) { return active_fault() == fault; }

// Switches `fault` on for this process (Fault::None: all off). For tests only.
void set_fault(Fault fault);

// Switches a fault on for a scope, and off again after it.
class FaultGuard {
 public:
  explicit FaultGuard(Fault fault) { set_fault(fault); }
  ~FaultGuard() { set_fault(Fault::None); }
  FaultGuard(const FaultGuard&) = delete;
  FaultGuard& operator=(const FaultGuard&) = delete;
};

}  // namespace mg::testing
