// TensorParallelGPT (gpt_tensor_parallel.h): the GPT's blocks rebuilt from the generic
// tensor-parallel layers, and the map from each single-device parameter to its shard.
#include <minigrad/models/gpt_tensor_parallel.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/context_parallel/context_parallel_loss.h>
#include <minigrad/parallel/context_parallel/ring_attention.h>
#include <minigrad/parallel/context_parallel/sequence_layout.h>
#include <minigrad/parallel/context_parallel/wire.h>
#include <minigrad/parallel/tensor_parallel/functions.h>
#include <minigrad/parallel/tensor_parallel/layers.h>
#include <minigrad/parallel/tensor_parallel/sequence_parallel.h>
#include <minigrad/parallel/tensor_parallel/vocab_parallel.h>

namespace mg::models {
namespace {

bool ends_with(const std::string& s, const std::string& suffix) {
  return s.size() >= suffix.size() && s.compare(s.size() - suffix.size(), suffix.size(), suffix) == 0;
}

// What every sharded module needs to know.
struct Context {
  parallel::TensorParallelGroupPtr group;
  GPTConfig config;
  bool sequence_parallel = false;
  std::shared_ptr<Generator> sharded_generator;
  std::shared_ptr<parallel::ProcessGroup> cp;  // context parallelism's group, or null
  // Dropout outside attention: on sequence shards with sequence parallelism (each rank its
  // own positions, its own mask), else on a replicated activation (one mask: the default
  // generator, which every rank advances alike).
  Generator* residual_generator() const {
    return sequence_parallel ? sharded_generator.get() : nullptr;
  }
};

const nn::Linear& linear_of(const nn::Module& parent, const std::string& name) {
  return static_cast<const nn::Linear&>(*parent.child(name));
}

std::shared_ptr<nn::ColumnParallelLinear> column(const nn::Module& parent, const std::string& name,
                                                 const Context& ctx) {
  auto layer = std::make_shared<nn::ColumnParallelLinear>(linear_of(parent, name), ctx.group);
  layer->set_sequence_parallel(ctx.sequence_parallel);
  return layer;
}

std::shared_ptr<nn::RowParallelLinear> row(const nn::Module& parent, const std::string& name,
                                           const Context& ctx) {
  auto layer = std::make_shared<nn::RowParallelLinear>(linear_of(parent, name), ctx.group,
                                                       /*input_is_parallel=*/true);
  layer->set_sequence_parallel(ctx.sequence_parallel);
  return layer;
}

// Causal self-attention on this rank's n_head/n heads.
class ParallelAttention : public nn::Cloneable<ParallelAttention> {
 public:
  ParallelAttention(const nn::Module& attn, Context ctx)
      : nn::Cloneable<ParallelAttention>("ParallelAttention"), ctx_(std::move(ctx)) {
    // c_attn's contiguous shard is replaced by q, k and v rows of this rank's heads once
    // the whole model is built (TensorParallelGPT's constructor, shard_of).
    register_module("c_attn", column(attn, "c_attn", ctx_));
    register_module("c_proj", row(attn, "c_proj", ctx_));
  }

  Tensor forward(const Tensor& x) override {
    const int64_t heads = ctx_.config.n_head / ctx_.group->size();
    const int64_t hs = ctx_.config.n_embd / ctx_.config.n_head, width = heads * hs;
    const Tensor qkv = child("c_attn")->forward(x);  // [B, T, 3 * width]: q, k, v of my heads
    const int64_t B = qkv.size(0), T = qkv.size(1);
    const std::vector<Tensor> parts = split(qkv, width, 2);
    const auto split_heads = [&](const Tensor& t) {
      return transpose(reshape(t, {B, T, heads, hs}), 1, 2);
    };
    // Per head, so a sharded region: each rank draws its own attention-dropout mask. Under
    // cp the other positions' keys and values (of these heads) come round the cp ring.
    const Tensor q = split_heads(parts[0]), k = split_heads(parts[1]), v = split_heads(parts[2]);
    const Tensor y = ctx_.cp ? parallel::context_parallel::ring_attention(q, k, v, ctx_.cp, true)
                             : scaled_dot_product_attention(q, k, v, /*is_causal=*/true,
                                                            is_training() ? ctx_.config.dropout : 0.0,
                                                            ctx_.sharded_generator.get());
    const Tensor merged = reshape(contiguous(transpose(y, 1, 2)), {B, T, width});
    return dropout(child("c_proj")->forward(merged), ctx_.config.dropout, is_training(),
                   ctx_.residual_generator());
  }

 private:
  Context ctx_;
};

class ParallelMLP : public nn::Cloneable<ParallelMLP> {
 public:
  ParallelMLP(const nn::Module& mlp, Context ctx)
      : nn::Cloneable<ParallelMLP>("ParallelMLP"), ctx_(std::move(ctx)) {
    register_module("c_fc", column(mlp, "c_fc", ctx_));
    register_module("c_proj", row(mlp, "c_proj", ctx_));
  }

  Tensor forward(const Tensor& x) override {
    const Tensor h = gelu(child("c_fc")->forward(x));  // [B, T, 4C/n]: GELU acts on the slice
    return dropout(child("c_proj")->forward(h), ctx_.config.dropout, is_training(),
                   ctx_.residual_generator());
  }

 private:
  Context ctx_;
};

class ParallelBlock : public nn::Cloneable<ParallelBlock> {
 public:
  ParallelBlock(const nn::Module& block, const Context& ctx) : nn::Cloneable<ParallelBlock>("ParallelBlock") {
    register_module("ln_1", block.child("ln_1")->clone(ctx.group->device()));
    register_module("attn", std::make_shared<ParallelAttention>(*block.child("attn"), ctx));
    register_module("ln_2", block.child("ln_2")->clone(ctx.group->device()));
    register_module("mlp", std::make_shared<ParallelMLP>(*block.child("mlp"), ctx));
  }

  Tensor forward(const Tensor& x) override {
    const Tensor x1 = x + child("attn")->forward(child("ln_1")->forward(x));
    return x1 + child("mlp")->forward(child("ln_2")->forward(x1));
  }
};

// nanoGPT's `transformer`, sharded: [B, T] -> ln_f's output; or a pipeline stage's piece
// of it (TensorParallelPiece): some blocks, the embedding in front, ln_f behind.
class ParallelTransformer : public nn::Cloneable<ParallelTransformer> {
 public:
  ParallelTransformer(const nn::Module& transformer, Context ctx, TensorParallelPiece piece)
      : nn::Cloneable<ParallelTransformer>("ModuleDict"), ctx_(std::move(ctx)), piece_(piece) {
    if (piece_.embedding) {
      auto wte = std::make_shared<nn::VocabParallelEmbedding>(
          static_cast<const nn::Embedding&>(*transformer.child("wte")), ctx_.group);
      wte->set_sequence_parallel(ctx_.sequence_parallel);
      register_module("wte", wte);
      register_module("wpe", transformer.child("wpe")->clone(ctx_.group->device()));
    }
    // The blocks keep their numbers (h.<i>), so every name is the GPT's.
    auto h = std::make_shared<nn::Sequential>();
    const auto& blocks = transformer.child("h")->named_children();
    const int64_t count = piece_.blocks < 0 ? static_cast<int64_t>(blocks.size()) - piece_.first_block
                                            : piece_.blocks;
    MG_CHECK(piece_.first_block >= 0 && count >= 0 &&
                 piece_.first_block + count <= static_cast<int64_t>(blocks.size()),
             "TensorParallelGPT: blocks [{}, {}) of a GPT of {} blocks", piece_.first_block,
             piece_.first_block + count, blocks.size());
    for (int64_t i = piece_.first_block; i < piece_.first_block + count; ++i) {
      const auto& [name, block] = blocks[static_cast<size_t>(i)];
      h->register_module(name, std::make_shared<ParallelBlock>(*block, ctx_));
    }
    register_module("h", h);
    if (piece_.ln_f) register_module("ln_f", transformer.child("ln_f")->clone(ctx_.group->device()));
  }

  Tensor forward(const Tensor& input) override {
    if (!piece_.embedding) {
      // A later pipeline stage: the previous stage's activations [B, T', C] (T' the
      // cp-local positions, or this rank's T'/n of them with sequence parallelism).
      MG_CHECK(input.defined() && input.dim() == 3 && input.size(2) == ctx_.config.n_embd,
               "TensorParallelGPT stage: expected activations [B, T, {}] from the previous "
               "stage, got {}", ctx_.config.n_embd,
               input.defined() ? input.shape().str() : "undefined");
      const Tensor x = child("h")->forward(input);
      return piece_.ln_f ? child("ln_f")->forward(x) : x;
    }
    const Tensor& idx = input;
    MG_CHECK(idx.defined() && idx.dim() == 2 && idx.dtype() == DType::Int64,
             "TensorParallelGPT: expected token indices int64 [B, T], got {}",
             idx.defined() ? idx.shape().str() : "undefined");
    // T: this rank's positions (the cp-local sequence under cp); the whole sequence's
    // length is cp times that.
    const int64_t T = idx.size(1), n = ctx_.group->size(), cp = ctx_.cp ? ctx_.cp->size() : 1;
    MG_CHECK(T * cp <= ctx_.config.block_size,
             "TensorParallelGPT: cannot forward a sequence of length {}, block_size is only {}",
             T * cp, ctx_.config.block_size);
    if (cp > 1) parallel::context_parallel::chunk_length(T * cp, static_cast<int>(cp),
                                                         "TensorParallelGPT under context parallelism");
    MG_CHECK(!ctx_.sequence_parallel || T % n == 0,
             "TensorParallelGPT: with sequence parallelism the sequence length T = {} must divide "
             "over the {} tensor-parallel ranks (each holds T/{} positions){}", T, n, n,
             cp > 1 ? fmt::format(" (T is this rank's part of a sequence split over cp = {})", cp)
                    : std::string());
    MG_CHECK(cp == 1 || !is_training() || ctx_.config.dropout == 0.0,
             "TensorParallelGPT: no dropout under context parallelism (cp = {}), got dropout {}: "
             "ring attention has no attention dropout (set dropout to 0, or call eval())", cp,
             ctx_.config.dropout);
    const Tensor tok = child("wte")->forward(idx);  // [B, T, C], or [B, T/n, C]
    // Under cp the positions of this rank's two chunks, else 0 .. T-1.
    const Tensor positions =
        cp > 1 ? parallel::context_parallel::sequence_positions(T * cp, ctx_.cp->rank(),
                                                                static_cast<int>(cp), idx.device())
               : arange(static_cast<double>(T), DType::Int64, idx.device());
    Tensor pos = child("wpe")->forward(positions);
    if (ctx_.sequence_parallel) pos = narrow(pos, 0, ctx_.group->rank() * (T / n), T / n);
    Tensor x = dropout(tok + pos, ctx_.config.dropout, is_training(), ctx_.residual_generator());
    x = child("h")->forward(x);
    return piece_.ln_f ? child("ln_f")->forward(x) : x;
  }

 private:
  Context ctx_;
  TensorParallelPiece piece_;
};

int64_t checked_divide(int64_t size, int parts, const char* what, const GPTConfig& config) {
  MG_CHECK(size % parts == 0,
           "parallelize_gpt: {} = {} is not divisible by the tensor-parallel size {} ({}); "
           "minigrad refuses uneven shards rather than padding them",
           what, size, parts, config.str());
  return size / parts;
}

}  // namespace

nn::ModulePtr tensor_parallel_transformer(const GPT& gpt,
                                          const parallel::TensorParallelGroupPtr& group,
                                          const TensorParallelGPTOptions& options,
                                          std::shared_ptr<Generator> sharded_generator,
                                          std::shared_ptr<parallel::ProcessGroup> cp,
                                          TensorParallelPiece piece) {
  MG_CHECK(group != nullptr, "parallelize_gpt: the tensor-parallel group is null");
  const GPTConfig& config = gpt.config();
  const int n = group->size();
  checked_divide(config.n_head, n, "n_head (attention is split by heads)", config);
  checked_divide(config.vocab_size, n,
                 "vocab_size (the embedding and the logits are split by vocabulary; choose a "
                 "multiple, as nanoGPT pads 50257 to 50304)", config);
  checked_divide(4 * config.n_embd, n, "4 * n_embd (the MLP's hidden width)", config);
  if (cp != nullptr && cp->size() == 1) cp = nullptr;
  MG_CHECK(cp == nullptr || cp->device() == group->device(),
           "parallelize_gpt: the context-parallel group works on {}, the tensor-parallel group "
           "on {}", cp ? cp->device() : group->device(), group->device());
  Context ctx{group, config, options.sequence_parallel, std::move(sharded_generator), std::move(cp)};
  auto transformer = std::make_shared<ParallelTransformer>(*gpt.child("transformer"), ctx, piece);
  // Every parameter becomes exactly this rank's part of the GPT's (c_attn's rows are not
  // the contiguous slice the column layer took).
  NoGradGuard no_grad;
  for (auto& [local, p] : transformer->named_parameters()) {
    const std::string name = "transformer." + local;
    const Tensor shard = TensorParallelGPT::shard_of(name, gpt.parameter(name), *group);
    MG_CHECK(shard.shape() == p.shape(), "parallelize_gpt: {} is {} here but its shard is {}", name,
             p.shape(), shard.shape());
    ops::copy_(p, shard);
  }
  transformer->train(gpt.is_training());
  return transformer;
}

TensorParallelGPT::TensorParallelGPT(const GPT& gpt, parallel::TensorParallelGroupPtr group,
                                     TensorParallelGPTOptions options,
                                     std::shared_ptr<parallel::ProcessGroup> cp)
    : nn::Cloneable<TensorParallelGPT>("TensorParallelGPT"),
      config_(gpt.config()),
      group_(std::move(group)),
      cp_(cp != nullptr && cp->size() > 1 ? std::move(cp) : nullptr),
      options_(options) {
  MG_CHECK(group_ != nullptr, "parallelize_gpt: the tensor-parallel group is null");
  sharded_generator_ = std::make_shared<Generator>(options_.seed + 2718 + static_cast<uint64_t>(group_->rank()));
  register_module("transformer", tensor_parallel_transformer(gpt, group_, options_,
                                                             sharded_generator_, cp_, {}));
  train(gpt.is_training());
}

Tensor TensorParallelGPT::shard_of(const std::string& name, const Tensor& full) const {
  return shard_of(name, full, *group_);
}

Tensor TensorParallelGPT::shard_of(const std::string& name, const Tensor& full,
                                   const parallel::TensorParallelGroup& group) {
  NoGradGuard no_grad;
  const int n = group.size(), r = group.rank();
  const auto rows = [&](const Tensor& t, int64_t count) {
    return ops::narrow(t, 0, r * (count / n), count / n);
  };
  Tensor out;
  if (name == "transformer.wte.weight" || name == "lm_head.weight") {
    out = rows(full, full.size(0));
  } else if (ends_with(name, "attn.c_attn.weight") || ends_with(name, "attn.c_attn.bias")) {
    // [q; k; v] stacked, each C rows: the rows of this rank's heads in each.
    const int64_t C = full.size(0) / 3;
    out = cat({rows(ops::narrow(full, 0, 0, C), C), rows(ops::narrow(full, 0, C, C), C),
                    rows(ops::narrow(full, 0, 2 * C, C), C)},
                   0);
  } else if (ends_with(name, "mlp.c_fc.weight") || ends_with(name, "mlp.c_fc.bias")) {
    out = rows(full, full.size(0));
  } else if (ends_with(name, "c_proj.weight")) {
    const int64_t in = full.size(1);
    out = ops::narrow(full, 1, r * (in / n), in / n);
  } else {
    MG_CHECK(is_replicated(name), "TensorParallelGPT::shard_of: no parameter named '{}'", name);
    out = full;
  }
  out = ops::clone(out);
  return out.device() == group.device() ? out : ops::copy_to(out, group.device());
}

bool TensorParallelGPT::is_replicated(const std::string& name) {
  return name == "transformer.wpe.weight" || name.find(".ln_") != std::string::npos ||
         ends_with(name, "c_proj.bias");
}

Tensor TensorParallelGPT::hidden(const Tensor& idx) { return child("transformer")->forward(idx); }

Tensor TensorParallelGPT::forward(const Tensor& idx) {
  const Tensor x = hidden(idx);
  // The head is the sharded embedding: each rank's logits over its vocabulary. Its input
  // is replicated (f: the backward sums the ranks' parts of dx), or gathered along T.
  const Tensor whole = options_.sequence_parallel ? parallel::gather_from_sequence_parallel(x, group_)
                                                  : parallel::copy_to_parallel(x, group_);
  return linear(whole, parameter("transformer.wte.weight"));  // [B, T, V/n]
}

Tensor TensorParallelGPT::loss(const Tensor& logits, const Tensor& targets, double divide_by) const {
  if (!cp_) return parallel::vocab_parallel_cross_entropy(logits, targets, group_, -1, divide_by);
  // Under cp: this rank's tokens' summed loss / the divisor, summed over cp in value. The
  // mean's divisor is the count of targets over the whole sequences (an int64 all-reduce).
  if (divide_by <= 0) {
    int64_t counted = 0;
    for (int64_t t : ops::copy_to(targets, Device::cpu()).to_vector<int64_t>()) counted += t != -1;
    const Tensor count = parallel::context_parallel::sum_over_group(
        from_vector(std::vector<int64_t>{counted}, Shape{1}, cp_->device()), *cp_);
    divide_by = static_cast<double>(ops::copy_to(count, Device::cpu()).to_vector<int64_t>()[0]);
  }
  return parallel::context_parallel::context_parallel_sum(
      parallel::vocab_parallel_cross_entropy(logits, targets, group_, -1, divide_by), *cp_);
}

Tensor TensorParallelGPT::local_sequence(const Tensor& x) const {
  return cp_ ? parallel::context_parallel::shard_sequence(x, cp_->rank(), cp_->size()) : x;
}

void TensorParallelGPT::finish_gradients() {
  reduce_sequence_parallel_gradients();
  // Under cp every gradient holds this rank's tokens' share: summed over cp (after the tp
  // sum, with which it commutes), as context parallelism alone does.
  if (cp_) parallel::context_parallel::all_reduce_gradients(parameters(), *cp_);
}

void TensorParallelGPT::reduce_sequence_parallel_gradients() {
  if (options_.sequence_parallel) sum_replicated_gradients(named_parameters(), *group_);
}

void TensorParallelGPT::sum_replicated_gradients(const std::vector<nn::NamedTensor>& parameters,
                                                 parallel::TensorParallelGroup& group) {
  if (group.size() == 1) return;
  // parity fault: each rank keeps the gradient of its own positions only.
  if (testing::fault_is_on(testing::Fault::SequenceParallelGradsNotReduced)) return;
  NoGradGuard no_grad;
  std::vector<Tensor> grads, flat;
  for (const auto& [name, p] : parameters) {
    if (!is_replicated(name) || !p.grad().defined()) continue;
    grads.push_back(p.grad());
    flat.push_back(ops::view(ops::contiguous(p.grad()), Shape{p.numel()}));
  }
  if (grads.empty()) return;
  const Tensor summed = group.all_reduce(cat(flat, 0));  // one coalesced all-reduce
  int64_t at = 0;
  for (Tensor& g : grads) {
    ops::copy_(g, ops::view(ops::narrow(summed, 0, at, g.numel()), g.shape()));
    at += g.numel();
  }
}

std::shared_ptr<TensorParallelGPT> parallelize_gpt(const GPT& gpt, const parallel::DeviceMesh& mesh,
                                                   TensorParallelGPTOptions options) {
  MG_CHECK(mesh.has_dim("tp"), "parallelize_gpt: the mesh {} has no tp dimension", mesh.str());
  std::shared_ptr<parallel::ProcessGroup> cp;
  if (mesh.has_dim("cp") && mesh.size("cp") > 1) cp = mesh.group("cp");
  return std::make_shared<TensorParallelGPT>(gpt, parallel::tensor_parallel_group(mesh.group("tp")),
                                             options, cp);
}

}  // namespace mg::models
