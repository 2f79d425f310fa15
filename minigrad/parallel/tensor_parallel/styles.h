// The tensor-parallel styles of a plan (parallelize.h), named and configured as PyTorch's
// (torch.distributed.tensor.parallel). Activations stay plain local tensors; a layout says
// what a rank's activation is of the whole one: Replicate() (all of it, the same on every
// rank), Shard(1) (its positions, sequence parallelism), Shard(-1) (its slice of the
// features).
//
//   style               applies to    what it does
//   ColwiseParallel     Linear        ColumnParallelLinear: rank r the rows r of out (of each
//                                     of `stride` blocks: c_attn's q, k, v); input Replicate()
//                                     (copy_to_parallel) or Shard(1) (all-gathered along T);
//                                     output Shard(-1) (this rank's features) or Replicate()
//   RowwiseParallel     Linear        RowParallelLinear: rank r the columns r of in; input
//                                     Shard(-1); output Replicate() (all-reduced) or
//                                     Shard(1) (reduce-scattered along T)
//                       Embedding     VocabParallelEmbedding: rank r the vocabulary rows r;
//                                     output Replicate() or Shard(1)
//   SequenceParallel    LayerNorm,    runs on this rank's positions [B, T/n, C]; its
//                       Dropout, ...  parameters whole, their gradients Partial over tp (each
//                                     rank saw its positions); a Dropout draws its own mask
//   ShardedDropout      Dropout       a dropout on a sharded activation (a rank's heads):
//                                     each rank draws its own mask
//   PrepareModuleInput  any           its input moved from one layout to another before
//                                     forward (a pre-hook): Shard(d) -> Replicate()
//                                     all-gathers, Replicate() -> Shard(d) keeps this rank's
//                                     part, Partial -> Replicate() all-reduces
//   PrepareModuleOutput any           the same, for its output (a hook)
//
// A column layer followed by a row layer (an MLP; attention's projections) needs nothing
// between them: the column layer's output slice is the row layer's input slice.
// docs/parallelize.md walks through the GPT's plan with these.
#pragma once

#include <cstdint>
#include <string>

#include <minigrad/parallel/parallelize.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

// An activation's layout in a plan: Placement's Replicate/Shard (Shard(-1): the last
// dimension), or Partial: every rank holds a share of a sum (a row layer's product before
// its all-reduce).
struct Layout {
  enum class Kind { Replicate, Shard, Partial };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;
  static Layout replicate() { return {}; }
  static Layout shard(int64_t dim) { return {Kind::Shard, dim}; }
  static Layout partial() { return {Kind::Partial, 0}; }
  bool operator==(const Layout& o) const { return kind == o.kind && (kind != Kind::Shard || dim == o.dim); }
  std::string str() const;  // "Replicate()", "Shard(1)", "Partial()"
};

class ColwiseParallel : public ParallelStyle {
 public:
  ColwiseParallel() = default;
  ColwiseParallel(Layout input, Layout output, int64_t stride = 1)
      : input_(input), output_(output), stride_(stride) {}
  void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const override;
  std::string str() const override;

 private:
  Layout input_ = Layout::replicate(), output_ = Layout::shard(-1);
  int64_t stride_ = 1;
};

class RowwiseParallel : public ParallelStyle {
 public:
  RowwiseParallel() = default;
  RowwiseParallel(Layout input, Layout output) : input_(input), output_(output) {}
  void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const override;
  std::string str() const override;

 private:
  Layout input_ = Layout::shard(-1), output_ = Layout::replicate();
};

class SequenceParallel : public ParallelStyle {
 public:
  void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const override;
  std::string str() const override { return "SequenceParallel()"; }
};

class ShardedDropout : public ParallelStyle {
 public:
  void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const override;
  std::string str() const override { return "ShardedDropout()"; }
};

class PrepareModuleInput : public ParallelStyle {
 public:
  PrepareModuleInput(Layout input, Layout desired) : input_(input), desired_(desired) {}
  void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const override;
  std::string str() const override;

 private:
  Layout input_, desired_;
};

class PrepareModuleOutput : public ParallelStyle {
 public:
  PrepareModuleOutput(Layout output, Layout desired) : output_(output), desired_(desired) {}
  void apply(nn::Module& root, const std::string& name, const ParallelContext& context) const override;
  std::string str() const override;

 private:
  Layout output_, desired_;
};

// An activation moved from layout `from` to `to` over the context's group (what the
// Prepare styles do): differentiable, each move's backward its transpose.
Tensor redistribute(const Tensor& x, Layout from, Layout to, const ParallelContext& context);

}  // namespace mg::parallel
