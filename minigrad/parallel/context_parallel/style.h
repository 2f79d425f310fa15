// Context parallelism as styles of a plan (parallelize.h, dimension "cp"): each rank holds
// two chunks of every sequence (sequence_layout.h), the whole model, and attends through
// ring attention over the cp group.
//
//   ContextParallel           on a module that attends through a replaceable function
//                             (nn::AttentionHost: the GPT's CausalSelfAttention): ring
//                             attention in place of scaled_dot_product_attention (no
//                             attention dropout: train with dropout 0, or eval())
//   ContextParallelPositions  on the position embedding: its input, positions 0 .. T/cp - 1
//                             of the rank's local sequence, becomes the global positions of
//                             the rank's two chunks
//
// parallelize_module then records every parameter Replicate over cp with a Partial
// gradient (each rank saw its chunks' tokens): reduce_partial_gradients sums them. The
// inputs are cut with shard_sequence, and the loss is taken over the whole sequences by
// LossParallel (loss_parallel.h).
#pragma once

#include <string>

#include <minigrad/parallel/parallelize.h>

namespace mg::parallel {

class ContextParallel : public ParallelStyle {
 public:
  void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const override;
  std::string str() const override { return "ContextParallel()"; }
};

class ContextParallelPositions : public ParallelStyle {
 public:
  void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const override;
  std::string str() const override { return "ContextParallelPositions()"; }
};

}  // namespace mg::parallel
