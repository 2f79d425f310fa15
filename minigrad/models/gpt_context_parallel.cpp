// The GPT's hooks for context parallelism: see gpt_context_parallel.h.
#include <minigrad/models/gpt_context_parallel.h>


#include <minigrad/autograd/functions.h>

namespace mg::models {

void set_attention_function(GPT& gpt, const CausalSelfAttention::AttentionFunction& attention) {
  for (const nn::ModulePtr& block : gpt.child("transformer")->child("h")->children()) {
    auto attn = std::dynamic_pointer_cast<CausalSelfAttention>(block->child("attn"));
    MG_CHECK(attn != nullptr, "set_attention_function: a block of the GPT has no "
             "CausalSelfAttention named attn");
    attn->set_attention_function(attention);
  }
}

Tensor forward_at_positions(GPT& gpt, const Tensor& idx, const Tensor& positions) {
  MG_CHECK(idx.dim() == 2 && idx.dtype() == DType::Int64 && positions.dim() == 1 &&
               positions.dtype() == DType::Int64 && positions.size(0) == idx.size(1),
           "forward_at_positions: expected token indices int64 [B, Tl] and positions int64 "
           "[Tl], got {} ({}) and {} ({})",
           idx.shape(), idx.dtype(), positions.shape(), positions.dtype());
  const nn::ModulePtr transformer = gpt.child("transformer");
  // GPTTransformer::forward with wpe at `positions` instead of arange(T): the embedding
  // checks each position against block_size.
  const Tensor tok_emb = transformer->child("wte")->forward(idx);      // [B, Tl, C]
  const Tensor pos_emb = transformer->child("wpe")->forward(positions);  // [Tl, C]
  Tensor x = transformer->child("drop")->forward(tok_emb + pos_emb);
  x = transformer->child("h")->forward(x);
  x = transformer->child("ln_f")->forward(x);
  return linear(x, gpt.wte_weight());  // the head tied to the token embedding
}

}  // namespace mg::models
