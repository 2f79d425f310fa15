// How the GPT (gpt.h) is split over a tensor-parallel group: Megatron-LM's recipe for a
// transformer, as torchtitan's parallelize_llama says it for Llama. docs/gpt-tensor-parallel.md
// walks through it: which tensor each rank holds, every collective of a step and its bytes.
//
//   wte              VocabParallelEmbedding: rows V/n; also the head, tied: logits_local =
//                    copy_to_parallel(x) @ wte_shard^T, [B, T, V/n], never gathered
//   attn.c_attn      ColumnParallelLinear by heads: rank r holds the q, k and v rows of its
//                    n_head/n heads ([3C/n, C]); attention runs on those heads alone
//   attn.c_proj      RowParallelLinear: the columns of rank r's heads ([C, C/n]), all-reduced
//   mlp.c_fc         ColumnParallelLinear ([4C/n, C]), GELU on the slice
//   mlp.c_proj       RowParallelLinear ([C, 4C/n]), all-reduced
//   wpe, ln_*, biases of the row layers: whole on every rank (replicated)
//   loss             vocab_parallel_cross_entropy on the local logits
//
// Sequence parallelism (options.sequence_parallel, Megatron's): between the blocks'
// column and row layers every rank holds positions T/n of the activations instead of all
// of them; LayerNorm, dropout and the residual adds run on that slice. An all-gather along
// T enters each column layer and a reduce-scatter along T leaves each row layer in place
// of the all-reduce; the replicated parameters then see only their positions, so their
// gradients are all-reduced over the group after backward (finish_gradients()).
//
// Dropout: where activations are replicated every rank must draw the same mask (they are
// one activation), where they are sharded each rank draws its own (Megatron's
// model-parallel RNG tracker). Replicated regions draw from the default generator, which
// ranks seeded alike advance alike; sharded regions (attention's probabilities, which are
// per head; with sequence parallelism also the embedding's and the residual branches'
// dropout) draw from sharded_generator(), seeded options.seed + 2718 + rank. So the masks
// cannot equal the single-device GPT's: compare against it with dropout 0.
//
// Context parallelism (a cp group: the mesh's cp dimension) composes with all of it: each
// rank holds its cp rank's two chunks of every sequence (context_parallel/sequence_layout.h)
// and runs the tensor-parallel model on them. Attention on this rank's heads goes through
// ring attention over the cp group (the k/v blocks of these heads travel round the ring),
// the position embedding is taken at the chunks' global positions, the loss is the
// vocabulary-parallel loss of this rank's tokens summed over cp, and finish_gradients()
// also sums every gradient over cp. With sequence parallelism the cp-local sequence is
// what SP cuts over tp. Dropout is refused under cp (ring attention has none).
// docs/gpt-tensor-parallel.md, "The composed mesh", lists every collective.
//
// A trainer's step, for one rank of a dp x cp x tp DeviceMesh (cp and dp optional):
//   auto model = models::parallelize_gpt(gpt, mesh, {});      // gpt: built with the seed
//   Tensor x = model->local_sequence(x_rows), y = model->local_sequence(y_rows);
//   Tensor logits = model->forward(x);                        // [b, T/cp, V/tp]
//   Tensor loss = model->loss(logits, y, n_targets);          // n_targets: the dp batch's
//   loss.backward();
//   model->finish_gradients();                                // tp (SP) and cp sums
//   ... all-reduce (sum) every gradient over mesh.group("dp"), optimizer.step()
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/core/generator.h>
#include <minigrad/models/gpt.h>
#include <minigrad/parallel/c10d/device_mesh.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/tensor_parallel/group.h>

namespace mg::models {

struct TensorParallelGPTOptions {
  bool sequence_parallel = false;
  // The sharded regions' dropout generator of rank r is seeded seed + 2718 + r.
  uint64_t seed = 1337;
};

class TensorParallelGPT : public nn::Cloneable<TensorParallelGPT> {
 public:
  // Rank group->rank()'s shards of `gpt` (copied onto group->device(); `gpt` is left as it
  // is). mg::Error when n_head, the vocabulary or 4 * n_embd does not divide by the size.
  // With a context-parallel group `cp` (null or size 1: none) every sequence is split
  // over it as well (forward in training with dropout > 0 is then an mg::Error).
  TensorParallelGPT(const GPT& gpt, parallel::TensorParallelGroupPtr group,
                    TensorParallelGPTOptions options = {},
                    std::shared_ptr<parallel::ProcessGroup> cp = nullptr);

  // idx [B, T] int64 (the whole batch's tokens on every rank of the group) -> this rank's
  // slice of the logits [B, T, V/n], vocabulary rank*V/n ... With sequence parallelism T
  // must divide by n. Under cp, idx is this cp rank's part [B, T/cp] (local_sequence) of
  // sequences of T = cp * idx.size(1) <= block_size positions, T a multiple of 2 cp, and
  // the logits are those positions' [B, T/cp, V/n]; with SP T/cp must divide by n.
  Tensor forward(const Tensor& idx) override;
  // ln_f's output: [B, T, C], the same on every rank; [B, T/n, C] with sequence
  // parallelism (this rank's positions). Under cp: of the cp-local positions.
  Tensor hidden(const Tensor& idx);
  // vocab_parallel_cross_entropy(logits, targets, group, -1, divide_by): the mean over the
  // targets that are not -1, as GPT::loss, or their sum / divide_by when divide_by > 0
  // (with data parallelism: the whole batch's count of targets, or that count / dp_size
  // under DistributedDataParallel, which averages). Under cp, targets are the cp-local
  // ones (local_sequence) and the value is over the whole sequences (the mean divides by
  // the count over cp); the gradient reaches this rank's logits only.
  Tensor loss(const Tensor& logits, const Tensor& targets, double divide_by = 0) const;
  // After backward, before any data-parallel reduction: with sequence parallelism sums
  // the replicated parameters' gradients over the group (one coalesced all-reduce); under
  // cp then sums every gradient over the cp group (one more). Nothing otherwise.
  void finish_gradients();
  // This cp rank's part of x [B, T, ...] along T (its two chunks,
  // context_parallel::shard_sequence); x itself without cp.
  Tensor local_sequence(const Tensor& x) const;

  // The part of the single-device GPT's tensor `full` (named as in GPT::named_parameters)
  // that this rank holds under the same name: rows, columns, or q/k/v rows of its heads.
  Tensor shard_of(const std::string& name, const Tensor& full) const;
  // The same for rank group.rank() of `group` (a pipeline's head copy "lm_head.weight"
  // is cut as wte).
  static Tensor shard_of(const std::string& name, const Tensor& full,
                         const parallel::TensorParallelGroup& group);
  // Sequence parallelism's gradient sum: the replicated parameters' gradients (is_replicated
  // by name) summed over `group`, in place, in one coalesced all-reduce.
  static void sum_replicated_gradients(const std::vector<nn::NamedTensor>& parameters,
                                       parallel::TensorParallelGroup& group);
  // True for parameters every rank holds whole (wpe, LayerNorms, the row layers' biases).
  static bool is_replicated(const std::string& name);

  Generator& sharded_generator() { return *sharded_generator_; }
  const GPTConfig& config() const { return config_; }
  const parallel::TensorParallelGroupPtr& group() const { return group_; }
  // The context-parallel group, null without cp.
  const std::shared_ptr<parallel::ProcessGroup>& context_parallel_group() const { return cp_; }
  const TensorParallelGPTOptions& options() const { return options_; }

 private:
  void reduce_sequence_parallel_gradients();

  GPTConfig config_;
  parallel::TensorParallelGroupPtr group_;
  std::shared_ptr<parallel::ProcessGroup> cp_;
  TensorParallelGPTOptions options_;
  std::shared_ptr<Generator> sharded_generator_;
};

// What a pipeline stage of the sharded GPT holds (gpt_mesh_pipeline.h): blocks
// [first_block, first_block + blocks) (blocks < 0: all from first_block on), the
// embedding (wte, wpe, dropout) in front when `embedding`, ln_f behind when `ln_f`.
struct TensorParallelPiece {
  int64_t first_block = 0;
  int64_t blocks = -1;
  bool embedding = true;
  bool ln_f = true;
};

// That piece of nanoGPT's `transformer`, sharded for this rank of `group` (with context
// parallelism over `cp` when non-null and of size > 1), each parameter already its shard
// (names as the GPT's without "transformer."). Its forward: token ids [B, T] int64 (with
// the embedding) or the previous piece's activations [B, T', C] -> the last block's (or
// ln_f's) output, [B, T', C]; T' the cp-local positions, divided by the group's size with
// sequence parallelism. TensorParallelGPT holds the whole piece; mg::Error as its
// constructor for sizes that do not divide.
nn::ModulePtr tensor_parallel_transformer(const GPT& gpt,
                                          const parallel::TensorParallelGroupPtr& group,
                                          const TensorParallelGPTOptions& options,
                                          std::shared_ptr<Generator> sharded_generator,
                                          std::shared_ptr<parallel::ProcessGroup> cp,
                                          TensorParallelPiece piece);

// The trainer's entry: the shards for this rank's place in mesh.group("tp") (the mesh
// must have a tp dimension; size 1 gives the whole GPT on every rank), with context
// parallelism over mesh.group("cp") when the mesh has a cp dimension of size > 1.
std::shared_ptr<TensorParallelGPT> parallelize_gpt(const GPT& gpt, const parallel::DeviceMesh& mesh,
                                                   TensorParallelGPTOptions options = {});

}  // namespace mg::models
