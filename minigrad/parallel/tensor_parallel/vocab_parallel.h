// Megatron-LM's VocabParallelEmbedding and vocab_parallel_cross_entropy: the vocabulary
// split over the ranks of a tensor-parallel group, so that neither the embedding table
// [V, C] nor the logits [B, T, V] (the largest activation of a GPT: V = 50304 against
// C = 768) is ever whole on one rank.
//
//   VocabParallelEmbedding     rank r holds rows r*V/n .. (r+1)*V/n of the table. A token
//                              outside them looks up zeros; one all-reduce (sum) adds the
//                              ranks' lookups, exactly one of which is the token's row.
//   vocab_parallel_cross_entropy(logits_local [.., V/n], targets [..])
//                              the mean cross-entropy over the whole vocabulary from each
//                              rank's slice of the logits, which are never gathered:
//                                m   = max over the vocabulary (all-gather of the ranks'
//                                      row maxima: a constant for the exponentials' range)
//                                S   = sum_v exp(z_v - m)    (each rank its slice, summed)
//                                z_t = the target's logit - m (from the rank that owns t)
//                                loss = mean over rows with target != ignore_index of
//                                       log S - z_t
//                              S and z_t travel in one all-reduce of 2 numbers per row.
//                              Backward needs no communication: rank r's gradient is
//                              softmax - onehot(t) on its own columns.
//
// Both are compositions of differentiable ops (embedding, masked_fill, exp, sum, log) and
// the conjugate reduce_from_parallel (functions.h), so autograd derives their backward:
// the ops a CUDA device runs are the same kernels as the single-device GPT's.
//
// The embedding records its table's placement, Shard(0) over "tp" (parallel/placement.h).
//
// V must divide by the group's size: minigrad refuses (an mg::Error naming the vocabulary
// size and a multiple to use) rather than pad the table, as nanoGPT's own 50304 (GPT-2's
// 50257 padded up to a multiple of 64) already shows how to choose one.
#pragma once

#include <memory>

#include <minigrad/nn/transformer_layers.h>
#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::nn {

class VocabParallelEmbedding : public Cloneable<VocabParallelEmbedding> {
 public:
  // Rank group->rank()'s rows of `full` (copied onto group->device()).
  VocabParallelEmbedding(const Embedding& full, parallel::TensorParallelGroupPtr group);

  // idx (int64, any shape [...]) -> [..., C], the whole lookup on every rank (one
  // all-reduce); with sequence parallelism ([B, T] indices) this rank's positions
  // [B, T/n, C] of it (one reduce-scatter along T instead).
  Tensor forward(const Tensor& idx) override;
  std::string extra_repr() const override;

  Tensor& weight() { return parameter("weight"); }  // [V/n, C]
  int64_t num_embeddings() const { return num_embeddings_; }  // V, of the whole table
  int64_t embedding_dim() const { return embedding_dim_; }
  int64_t vocab_start() const { return vocab_start_; }  // this rank's first row
  int64_t vocab_per_rank() const { return num_embeddings_ / group_->size(); }
  const parallel::TensorParallelGroupPtr& group() const { return group_; }
  void set_sequence_parallel(bool on) { sequence_parallel_ = on; }
  bool sequence_parallel() const { return sequence_parallel_; }

 private:
  int64_t num_embeddings_, embedding_dim_, vocab_start_;
  parallel::TensorParallelGroupPtr group_;
  bool sequence_parallel_ = false;
};

}  // namespace mg::nn

namespace mg::parallel {

// logits: this rank's slice [..., V/n] of the logits (rank r: vocabulary r*V/n ..);
// targets: int64 [...] (the logits' leading shape), in [0, V) or ignore_index. Returns the
// mean over the non-ignored targets (a 0-dim tensor, the same on every rank), or, with
// divide_by > 0, their sum divided by divide_by (data parallelism: divide by the whole
// batch's count of targets and sum the gradients over the dp ranks, which is right for
// uneven batches too; or by that count / dp and let DistributedDataParallel average).
Tensor vocab_parallel_cross_entropy(const Tensor& logits, const Tensor& targets,
                                    const TensorParallelGroupPtr& group,
                                    int64_t ignore_index = -1, double divide_by = 0);

}  // namespace mg::parallel
