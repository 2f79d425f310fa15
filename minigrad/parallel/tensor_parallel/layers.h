// Megatron-LM's ColumnParallelLinear and RowParallelLinear: one Linear's weight split
// over the ranks of a tensor-parallel group (group.h), and the helper that turns an MLP
// into pairs of them.
//
//   ColumnParallelLinear(in, out)     weight [out/n, in]: rank r computes output features
//                                     r*out/n .. (r+1)*out/n of y = x W^T + b
//   RowParallelLinear(in, out)        weight [out, in/n]: rank r multiplies its slice of the
//                                     input features; the partial outputs are summed
//
// A column layer followed by a row layer (an MLP block) needs no communication between
// them: the column layer's output slice is exactly the row layer's input slice, and the
// ReLU between acts elementwise on it. The block's communication is one all-reduce in
// forward (the row layer's sum, reduce_from_parallel) and one in backward (the gradient of
// the block's input, copy_to_parallel in the column layer). docs/tensor-parallel.md.
//
// Initialisation: each layer draws a whole Linear(in, out) from the default generator,
// exactly as nn::Linear would, and keeps its shard. Ranks that seed alike hold shards of
// one and the same Linear, and a tensor-parallel model starts where its unsharded twin
// (built with the same seed) does. The full draw is transient (Megatron's CPU
// initialisation does the same); the shard is copied to the group's device.
//
// Placements (parallel/placement.h): each layer records on its parameters how they split
// the whole over "tp": a column layer's weight and bias Shard(0), a row layer's weight
// Shard(1) and its bias Replicate (with a Partial gradient under sequence parallelism);
// parallelize_mlp records Replicate on the layers it leaves whole and names them all.
//
// Widths must divide evenly over the ranks (out for the column layer, in for the row
// layer); others are refused with an mg::Error, never padded.
//
// These classes live with the rest of tensor parallelism (they need its group and
// functions, which live above nn) but are named nn::, beside nn::Linear, as in the house
// plan and Megatron.
#pragma once

#include <memory>

#include <minigrad/nn/layers.h>
#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::nn {

class ColumnParallelLinear : public Cloneable<ColumnParallelLinear> {
 public:
  // gather_output: all-gather the output slices into the whole [batch, out] on every rank
  // (for a last layer); otherwise each rank returns its slice [batch, out/n].
  ColumnParallelLinear(int64_t in_features, int64_t out_features,
                       parallel::TensorParallelGroupPtr group, bool gather_output = false,
                       bool bias = true);
  // Rank group->rank()'s shard of an existing layer. stride > 1: the output features are
  // `stride` blocks side by side (c_attn's q, k and v: 3), and the rank holds its part of
  // each block, stacked (Megatron's partition_stride; placement.h's Shard(0, stride)).
  ColumnParallelLinear(const Linear& full, parallel::TensorParallelGroupPtr group,
                       bool gather_output = false, int64_t stride = 1);

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Tensor& weight() { return parameter("weight"); }  // [out/n, in]
  Tensor& bias() { return parameter("bias"); }      // [out/n]
  bool has_bias() const { return has_bias_; }
  int64_t in_features() const { return in_features_; }
  int64_t out_features() const { return out_features_; }  // of the whole layer
  int64_t out_features_per_rank() const { return out_features_ / group_->size(); }
  bool gather_output() const { return gather_output_; }
  const parallel::TensorParallelGroupPtr& group() const { return group_; }
  int64_t stride() const { return stride_; }
  // Sequence parallelism (sequence_parallel.h): the input is this rank's positions
  // [B, T/n, in], all-gathered along T before the product in place of copy_to_parallel.
  // Off by default. An input a style has already made whole (activation_layout.h: marked
  // Replicate over this group) is taken as it is: its gradient's sum is that style's.
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }
  bool sequence_parallel() const { return sequence_parallel_; }

 private:
  int64_t in_features_, out_features_;
  bool has_bias_, gather_output_;
  int64_t stride_ = 1;
  parallel::TensorParallelGroupPtr group_;
  bool sequence_parallel_ = false;
};

class RowParallelLinear : public Cloneable<RowParallelLinear> {
 public:
  // input_is_parallel: the input is already this rank's slice [batch, in/n] (the output
  // of a ColumnParallelLinear); otherwise it is the whole [batch, in], and each rank
  // keeps its slice (scatter_to_parallel). The output is the whole [batch, out] on every
  // rank. The bias is not split: every rank adds all of it once, after the sum.
  RowParallelLinear(int64_t in_features, int64_t out_features,
                    parallel::TensorParallelGroupPtr group, bool input_is_parallel = true,
                    bool bias = true);
  RowParallelLinear(const Linear& full, parallel::TensorParallelGroupPtr group,
                    bool input_is_parallel = true);

  Tensor forward(const Tensor& input) override;
  std::string extra_repr() const override;

  Tensor& weight() { return parameter("weight"); }  // [out, in/n]
  Tensor& bias() { return parameter("bias"); }      // [out], the same on every rank
  bool has_bias() const { return has_bias_; }
  int64_t in_features() const { return in_features_; }  // of the whole layer
  int64_t out_features() const { return out_features_; }
  int64_t in_features_per_rank() const { return in_features_ / group_->size(); }
  bool input_is_parallel() const { return input_is_parallel_; }
  const parallel::TensorParallelGroupPtr& group() const { return group_; }
  // Sequence parallelism (sequence_parallel.h): the partial sums [B, T, out] are
  // reduce-scattered along T in place of the all-reduce, so the output is this rank's
  // positions [B, T/n, out] (the bias added to them). Needs input_is_parallel. Off by
  // default.
  void set_sequence_parallel(bool on);
  bool sequence_parallel() const { return sequence_parallel_; }

 private:
  int64_t in_features_, out_features_;
  bool has_bias_, input_is_parallel_;
  parallel::TensorParallelGroupPtr group_;
  bool sequence_parallel_ = false;
};

}  // namespace mg::nn

namespace mg::parallel {

// Rank group->rank()'s part of `mlp`, a Sequential of Linear and ReLU layers: its Linear
// layers taken in pairs, the first of each pair a ColumnParallelLinear and the second a
// RowParallelLinear (input_is_parallel), the ReLUs kept where they are. A Linear left
// over at the end (an odd count: often the classifier, whose 10 outputs are not worth
// splitting) stays whole on every rank: its input is the whole activation, and each rank
// computes the same output, so it needs no communication. Copies the shards (and the
// whole layers) of `mlp` onto group->device(); `mlp` itself is left as it is.
std::shared_ptr<nn::Sequential> parallelize_mlp(const nn::Sequential& mlp,
                                                const TensorParallelGroupPtr& group);

}  // namespace mg::parallel
