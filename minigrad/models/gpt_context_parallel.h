// The GPT's two hooks for context parallelism, which splits each sequence over the ranks
// of a cp group (parallel/context_parallel/, docs/context-parallel.md): every rank runs the
// whole model on its part of the positions.
//
//   set_attention_function: every block's attention through the given function instead
//     of scaled_dot_product_attention (ring attention, which sees the other ranks' keys);
//   forward_at_positions: the forward of GPT on a part of the sequence, the position
//     embedding taken at the given global positions (a rank's positions are not 0..T-1).
//
// The models layer knows no process group: the trainer ties the two together, e.g.
//   models::set_attention_function(*gpt, [group](q, k, v, p) {
//     return context_parallel::ring_attention(q, k, v, group, true); });
// (context_parallel::ring_attention_function(group) does it; parallel/context_parallel/).
#pragma once

#include <minigrad/models/gpt.h>

namespace mg::models {

// Sets `attention` on the CausalSelfAttention of every block (an empty function restores
// scaled_dot_product_attention).
void set_attention_function(GPT& gpt, const CausalSelfAttention::AttentionFunction& attention);

// GPT::forward for idx [B, Tl] (int64) whose positions in the whole sequence are
// `positions` (int64 [Tl], each below block_size): logits [B, Tl, vocab_size]. With
// positions = arange(T) it is GPT::forward.
Tensor forward_at_positions(GPT& gpt, const Tensor& idx, const Tensor& positions);

}  // namespace mg::models
