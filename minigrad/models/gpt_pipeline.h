// The GPT cut into pipeline stages across the ranks of a pipeline-parallel (pp) group:
// GPTStage is one piece of the model, GPTPipeline one rank's part of the whole (its
// pieces, the PipelineStage that runs them, the tied embedding's gradient and the loss).
// docs/gpt-pipeline.md walks through it.
//
//   rank 0                         ranks 1 .. p-2          rank p-1
//   idx [mb, T] int64                                      targets [mb, T] int64
//   wte, wpe, drop                                         (lm_head = a copy of wte)
//   blocks h.0 .. h.a-1   -> [mb, T, C] ->   blocks ...  -> blocks ..., ln_f, lm_head
//                                                          logits [mb, T, V] -> loss
//
// The n_layer blocks are balanced over the stages (even_balance: the first
// n_layer mod p stages one more); with v model chunks per rank (the interleaved schedule)
// over the v p virtual stages, rank r holding virtual stages r, r + p, ... Every virtual
// stage needs a block: a split with n_layer < p v is refused.
//
// The head is tied to the token embedding (nanoGPT's wte.weight is lm_head.weight). Rank
// 0 needs wte for the embedding and rank p-1 for the head, so rank p-1 holds a copy,
// equal at the start. Each copy gets only its own share of the gradient (the embedding's
// rows on rank 0, the head's on rank p-1); the tied weight's gradient is their sum, so
// after backward both ranks all-reduce it over the embedding group {0, p-1} (Megatron's
// embedding group) and both copies take the same optimizer step and stay equal. With one
// rank the head uses wte itself.
//
// Every rank builds the whole GPT with the same seed and keeps its blocks (the others are
// freed with the GPT); parameters keep nanoGPT's names, the last rank's head copy
// "lm_head.weight" (as nanoGPT's state_dict names it).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/models/gpt.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/pipeline/pipeline_stage.h>

namespace mg::models {

// One model chunk of the pipeline: blocks [first_block, first_block + blocks) of `model`
// (the same modules, not copies), with the embedding (wte, wpe, drop) in front when
// `embedding` and ln_f and the head behind when `head`. Its forward takes token ids
// [B, T] int64 (embedding) or activations [B, T, C], and gives [B, T, C] or, with the
// head, logits [B, T, V].
class GPTStage : public nn::Cloneable<GPTStage> {
 public:
  // `head_weight`: the head's weight (a copy of wte, or wte itself when this chunk holds
  // the embedding too); needed when `head`.
  GPTStage(GPT& model, int64_t first_block, int64_t blocks, bool embedding, bool head,
           Tensor head_weight = {});
  Tensor forward(const Tensor& x) override;

  bool has_embedding() const { return embedding_; }
  bool has_head() const { return head_; }
  // The chunk's copy of the tied weight: wte (embedding) or lm_head.weight (head).
  Tensor& tied_weight();

 private:
  bool embedding_, head_;
  bool head_is_wte_ = false;  // one rank: the head reads this chunk's wte
  int64_t n_embd_;
};

// Blocks per virtual stage: n_layer over stages * model_chunks, as even_balance.
// mg::Error naming the sizes when there are fewer blocks than virtual stages.
std::vector<int64_t> gpt_pipeline_balance(const GPTConfig& config, int stages,
                                          int model_chunks = 1);

// Rank `rank`'s model chunks of `model` cut into `stages` ranks of `model_chunks` chunks:
// chunk c is virtual stage c stages + rank. The last virtual stage's head is a copy of wte
// unless it sits on the rank of the first (one rank, one chunk), then wte itself.
// mg::Error for several chunks on one rank.
std::vector<std::shared_ptr<GPTStage>> split_gpt(GPT& model, int rank, int stages,
                                                 int model_chunks = 1);

struct GPTPipelineOptions {
  int64_t micro_batches = 1;  // PipelineStageOptions::chunks; every rank the same
  parallel::Schedule schedule = parallel::Schedule::OneFOneB;
  int model_chunks = 1;  // per rank; more than one needs Schedule::Interleaved1F1B
  parallel::Checkpoint checkpoint = parallel::Checkpoint::Never;
  // train_step ends by summing the tied gradient. Gradient accumulation over several
  // train_steps turns this off and calls sum_tied_gradient() once before the optimizer
  // step (summing after every step would count the earlier steps' sums again).
  bool sum_tied_gradient = true;
};

class GPTPipeline {
 public:
  // Every rank of `pp_group` calls it with the same GPT (same config and seed) and
  // options; it makes the embedding group {0, p-1} from `pp_group` (a collective call).
  GPTPipeline(GPT& model, std::shared_ptr<parallel::ProcessGroup> pp_group,
              GPTPipelineOptions options = {});

  // One step of the whole batch: idx [B, T] and targets [B, T] (int64; read on rank 0 and
  // on the last rank, ignored elsewhere, where they may be undefined). Gradients
  // accumulate into this rank's parameters, the tied one summed (unless turned off).
  // Returns the batch's mean loss over its B T tokens on every rank (broadcast from the
  // last), a scalar: micro-batch j's mean weighted by its rows / B, which equals the mean
  // over the whole batch's tokens as every row has T of them. (Targets of -1 are ignored
  // by each micro-batch's mean, so with them the weighting is by rows, not tokens.)
  Tensor train_step(const Tensor& idx, const Tensor& targets);

  // The all-reduce of the tied weight's gradient over the embedding group (a no-op on the
  // ranks outside it and with one rank).
  void sum_tied_gradient();

  // This rank's parameters, nanoGPT's names, each once (for the optimizer: pass
  // parameters() to optim::weight_decay_groups as with the whole GPT).
  std::vector<nn::NamedTensor> named_parameters() const;
  std::vector<Tensor> parameters() const;
  void zero_grad(bool set_to_none = true);

  const std::vector<std::shared_ptr<GPTStage>>& chunks() const { return chunks_; }
  parallel::PipelineStage& stage() { return *stage_; }
  const std::shared_ptr<parallel::ProcessGroup>& pp_group() const { return pp_group_; }
  // {0, p-1} of the pp group on those two ranks; null elsewhere and with one rank.
  const std::shared_ptr<parallel::ProcessGroup>& embedding_group() const { return embedding_group_; }

 private:
  std::shared_ptr<parallel::ProcessGroup> pp_group_, embedding_group_;
  GPTPipelineOptions options_;
  std::vector<std::shared_ptr<GPTStage>> chunks_;
  std::unique_ptr<parallel::PipelineStage> stage_;
};

}  // namespace mg::models
