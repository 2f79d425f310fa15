#include <minigrad/models/gpt_pipeline.h>

#include <set>
#include <utility>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/pipeline/balance.h>

namespace mg::models {

namespace {

// A named container of modules, as nanoGPT's ModuleDict: it only gives its children
// their names ("transformer.wte", "transformer.h.3").
class ModuleDict : public nn::Cloneable<ModuleDict> {
 public:
  ModuleDict() : nn::Cloneable<ModuleDict>("ModuleDict") {}
  Tensor forward(const Tensor&) override {
    MG_FAIL("ModuleDict: a container of the GPT's stage, not a layer; it has no forward");
  }
};

// The last stage's head, nanoGPT's lm_head (a Linear without bias) holding the given
// weight: nn::Linear would first draw a weight of its own from the generator, and the
// ranks' generators would then differ.
class Head : public nn::Cloneable<Head> {
 public:
  explicit Head(Tensor weight) : nn::Cloneable<Head>("Linear") {
    register_parameter("weight", std::move(weight));
  }
  Tensor forward(const Tensor& x) override { return linear(x, parameter("weight")); }
};

}  // namespace

// ---------------------------------------------------------------- GPTStage

GPTStage::GPTStage(GPT& model, int64_t first_block, int64_t blocks, bool embedding, bool head,
                   Tensor head_weight)
    : nn::Cloneable<GPTStage>("GPTStage"),
      embedding_(embedding),
      head_(head),
      n_embd_(model.config().n_embd) {
  const int64_t n_layer = model.config().n_layer;
  MG_CHECK(blocks >= 1 && first_block >= 0 && first_block + blocks <= n_layer,
           "GPTStage: blocks [{}, {}) of a GPT of {} blocks", first_block, first_block + blocks,
           n_layer);
  const nn::ModulePtr whole = model.child("transformer");
  auto transformer = std::make_shared<ModuleDict>();
  if (embedding_) {
    transformer->register_module("wte", whole->child("wte"));
    transformer->register_module("wpe", whole->child("wpe"));
    transformer->register_module("drop", whole->child("drop"));
  }
  // The blocks keep their numbers: transformer.h.<i> as in the whole model.
  auto h = std::make_shared<nn::Sequential>();
  const auto& all_blocks = whole->child("h")->named_children();
  for (int64_t i = first_block; i < first_block + blocks; ++i)
    h->register_module(all_blocks[static_cast<size_t>(i)].first,
                       all_blocks[static_cast<size_t>(i)].second);
  transformer->register_module("h", h);
  if (head_) transformer->register_module("ln_f", whole->child("ln_f"));
  register_module("transformer", transformer);
  if (head_) {
    MG_CHECK(head_weight.defined(), "GPTStage: a stage with the head needs its weight");
    // Its own wte (one rank): the head reads it in forward, no second parameter.
    head_is_wte_ = embedding_ && head_weight.is_same(child("transformer")->parameter("wte.weight"));
    if (!head_is_wte_) {
      register_module("lm_head", std::make_shared<Head>(std::move(head_weight)));
    }
  }
}

Tensor& GPTStage::tied_weight() {
  if (embedding_) return parameter("transformer.wte.weight");
  MG_CHECK(head_, "GPTStage: a middle stage holds no copy of the tied embedding");
  return parameter("lm_head.weight");
}

Tensor GPTStage::forward(const Tensor& input) {
  const nn::ModulePtr transformer = child("transformer");
  Tensor x = input;
  if (embedding_) {
    // GPTTransformer::forward's first lines: tokens and positions, added, dropped.
    const auto& wpe = static_cast<const nn::Embedding&>(*transformer->child("wpe"));
    MG_CHECK(input.dim() == 2 && input.dtype() == DType::Int64,
             "GPTStage: the first stage expects token indices int64 [B, T], got {} ({})",
             input.shape(), input.dtype());
    const int64_t T = input.size(1);
    MG_CHECK(T <= wpe.num_embeddings(),
             "GPTStage: cannot forward a sequence of length {}, block_size is only {}", T,
             wpe.num_embeddings());
    const Tensor pos = arange(static_cast<double>(T), DType::Int64, input.device());
    x = transformer->child("drop")->forward(transformer->child("wte")->forward(input) +
                                            transformer->child("wpe")->forward(pos));
  } else {
    MG_CHECK(input.dim() == 3 && input.size(2) == n_embd_,
             "GPTStage: expected activations [B, T, {}] from the previous stage, got {} ({})",
             n_embd_, input.shape(), input.dtype());
  }
  x = transformer->child("h")->forward(x);
  if (!head_) return x;
  x = transformer->child("ln_f")->forward(x);
  // The head: logits = x W^T with W the tied weight (this chunk's wte or its copy).
  if (head_is_wte_) return linear(x, parameter("transformer.wte.weight"));
  return child("lm_head")->forward(x);
}

// ---------------------------------------------------------------- the split

std::vector<int64_t> gpt_pipeline_balance(const GPTConfig& config, int stages, int model_chunks) {
  MG_CHECK(stages >= 1 && model_chunks >= 1,
           "GPT pipeline: {} stages of {} model chunks each; both must be at least 1", stages,
           model_chunks);
  const int64_t virtual_stages = int64_t{stages} * model_chunks;
  MG_CHECK(config.n_layer >= virtual_stages,
           "GPT pipeline: {} blocks (n_layer) cannot fill {} stages x {} model chunks = {} "
           "virtual stages; every virtual stage needs at least one block",
           config.n_layer, stages, model_chunks, virtual_stages);
  return parallel::even_balance(config.n_layer, virtual_stages);
}

std::vector<std::shared_ptr<GPTStage>> split_gpt(GPT& model, int rank, int stages,
                                                 int model_chunks) {
  const std::vector<int64_t> balance = gpt_pipeline_balance(model.config(), stages, model_chunks);
  MG_CHECK(rank >= 0 && rank < stages, "split_gpt: rank {} of {} stages", rank, stages);
  // One rank would hold wte in its first chunk and the head, reading the same tensor, in
  // its last: two modules sharing a parameter, which moving them to a device would untie.
  MG_CHECK(stages > 1 || model_chunks == 1,
           "GPT pipeline: {} model chunks on one rank; interleaving needs at least two ranks",
           model_chunks);
  const int virtual_stages = stages * model_chunks;
  std::vector<std::shared_ptr<GPTStage>> chunks;
  for (int c = 0; c < model_chunks; ++c) {
    const int k = c * stages + rank;
    int64_t first_block = 0;
    for (int i = 0; i < k; ++i) first_block += balance[static_cast<size_t>(i)];
    const bool embedding = k == 0, head = k + 1 == virtual_stages;
    Tensor head_weight;
    if (head) {
      Tensor& wte = model.wte_weight();
      if (rank == 0) {
        head_weight = wte;  // one rank: the head and the embedding are one tensor
      } else {
        NoGradGuard no_grad;
        head_weight = ops::clone(wte.detach());  // the copy: equal now, kept equal by the sum
        head_weight.set_requires_grad(true);
      }
    }
    chunks.push_back(std::make_shared<GPTStage>(model, first_block,
                                                balance[static_cast<size_t>(k)], embedding, head,
                                                head_weight));
  }
  return chunks;
}

// ---------------------------------------------------------------- GPTPipeline

GPTPipeline::GPTPipeline(GPT& model, std::shared_ptr<parallel::ProcessGroup> pp_group,
                         GPTPipelineOptions options)
    : pp_group_(std::move(pp_group)), options_(options) {
  MG_CHECK(pp_group_ != nullptr, "GPTPipeline: the pipeline's process group is null");
  const int p = pp_group_->size(), rank = pp_group_->rank();
  chunks_ = split_gpt(model, rank, p, options_.model_chunks);
  // Megatron's embedding group: the two ranks holding a copy of the tied weight. Every
  // rank of the pp group takes part in making it.
  if (p > 1) embedding_group_ = pp_group_->new_group({0, p - 1});
  parallel::PipelineStageOptions stage_options;
  stage_options.chunks = options_.micro_batches;
  stage_options.schedule = options_.schedule;
  stage_options.checkpoint = options_.checkpoint;
  stage_ = std::make_unique<parallel::PipelineStage>(
      std::vector<nn::ModulePtr>(chunks_.begin(), chunks_.end()), pp_group_, stage_options);
}

Tensor GPTPipeline::train_step(const Tensor& idx, const Tensor& targets) {
  const int p = pp_group_->size(), rank = pp_group_->rank();
  const bool first = rank == 0, last = rank + 1 == p;
  const Tensor loss = stage_->train_step(first ? idx : Tensor(), last ? targets : Tensor(),
                                         [](const Tensor& logits, const Tensor& target) {
                                           return GPT::loss(logits, target);
                                         });
  if (options_.sum_tied_gradient) sum_tied_gradient();
  // The loss on every rank: the last stage has it; the others take it by broadcast, so a
  // trainer prints, logs and checks it the same on any rank.
  NoGradGuard no_grad;
  // In the model's dtype (a float64 GPT's loss is float64), which every rank's blocks share.
  const DType dtype = chunks_.front()->parameters().front().dtype();
  Tensor buffer = last ? ops::contiguous(loss.detach().reshape(Shape{1}))
                       : zeros({1}, dtype, pp_group_->device());
  if (p > 1) pp_group_->broadcast(buffer, p - 1)->wait();
  return buffer.reshape(Shape{});
}

void GPTPipeline::sum_tied_gradient() {
  if (!embedding_group_) return;  // a middle rank, or one rank (the head uses wte itself)
  // Rank 0's first chunk holds wte, rank p-1's last chunk the head's copy.
  GPTStage& holder = pp_group_->rank() == 0 ? *chunks_.front() : *chunks_.back();
  Tensor& weight = holder.tied_weight();
  if (!weight.grad().defined()) weight.set_grad(zeros_like(weight));
  // parity fault: the tied gradient left unsummed, each copy stepping with its own share.
  if (testing::fault_is_on(testing::Fault::PipelineTiedGradNotSummed)) return;
  embedding_group_->allreduce(weight.grad())->wait();
}

std::vector<nn::NamedTensor> GPTPipeline::named_parameters() const {
  std::vector<nn::NamedTensor> out;
  std::set<const void*> seen;
  for (const auto& chunk : chunks_)
    for (auto& [name, p] : chunk->named_parameters())
      if (seen.insert(p.impl()).second) out.emplace_back(name, p);
  return out;
}

std::vector<Tensor> GPTPipeline::parameters() const {
  std::vector<Tensor> out;
  for (auto& [name, p] : named_parameters()) out.push_back(p);
  return out;
}

void GPTPipeline::zero_grad(bool set_to_none) {
  for (const auto& chunk : chunks_) chunk->zero_grad(set_to_none);
}

}  // namespace mg::models
