#include <minigrad/core/fault_injection.h>

#include <atomic>

namespace mg::testing {

namespace {
// Read by worker threads (replicas, stages, tensor-parallel ranks) while a test sets it.
std::atomic<Fault> g_fault{Fault::None};
}  // namespace

std::string_view fault_name(Fault fault) {
  switch (fault) {
    case Fault::None: return "none";
    case Fault::DataParallelGradsAveraged: return "DataParallel: replicas' gradients averaged, not summed";
    case Fault::DdpLastBucketNotReduced: return "DDP: the last bucket never reduced";
    case Fault::ZeroAllGatherSkipped: return "ZeRO: the all-gather after the step skipped";
    case Fault::ShardPaddingInArithmetic: return "ZeRO-2/FSDP: a shard's padding in the arithmetic (the clipping norm)";
    case Fault::PipelineLossesSummed: return "pipeline: micro-batch losses summed, not averaged";
    case Fault::RowParallelBiasPerRank: return "tensor parallel: the row-parallel bias added once per rank";
    case Fault::SamplerRankLikeNeighbour: return "DistributedSampler: a rank takes its neighbour's shard";
    case Fault::VocabParallelLossNotReduced: return "vocab-parallel cross-entropy: the sum of exponentials not all-reduced";
    case Fault::SequenceParallelGradsNotReduced: return "sequence parallel: replicated parameters' gradients not all-reduced";
    case Fault::RingAttentionFutureBlocksSeen: return "ring attention: off-diagonal causal blocks taken as full";
    case Fault::ContextParallelGradsNotReduced: return "context parallel: gradients not summed over the cp group";
    case Fault::CheckpointFreshDropout: return "checkpoint: the recomputed forward draws fresh dropout masks";
    case Fault::PipelineTiedGradNotSummed: return "GPT pipeline: the tied embedding's gradient not summed between first and last stage";
    case Fault::PipelineMicroBatchCountedTwice: return "pipeline: the last micro-batch's loss counted twice";
    case Fault::ColwiseStrideIgnored: return "plan: ColwiseParallel's stride ignored (c_attn cut as one block)";
    case Fault::PlacementReplicateWhereSharded: return "placements: a sharded weight recorded as Replicate (the clip's norm)";
  }
  return "unknown";
}

Fault active_fault() { return g_fault.load(std::memory_order_relaxed); }

void set_fault(Fault fault) { g_fault.store(fault, std::memory_order_relaxed); }

}  // namespace mg::testing
