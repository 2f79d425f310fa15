// Ring attention: causal self-attention over a sequence split across the ranks of a
// context-parallel group, none of which ever holds the whole sequence's keys and values.
//
// Each rank holds its queries, keys and values for its two chunks of the sequence
// (sequence_layout.h). Attention needs every query against every key, so the key/value
// blocks travel round the ring: at step s rank r attends with its queries to the block of
// rank r - s (mod cp), while it already sends that block on to rank r + 1 and receives
// the next one from rank r - 1 (cp - 1 transfers). Each step gives a partial attention
// (an output and a log-sum-exp per query, Backend::attention); the partials merge by the
// online softmax, exactly as FlashAttention merges its key blocks inside one device.
//
// Backward passes the blocks round again, with the gradients of k and v riding along:
// each rank adds its queries' share into the block's dk, dv before sending them on, and
// after the full circle (one more hop) they reach home. The probabilities are recomputed
// from the saved log-sum-exp (Backend::attention_backward given the merged output and
// log-sum-exp gives exactly one block's share of the gradients).
#pragma once

#include <functional>
#include <memory>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel::context_parallel {

// q, k, v [B, H, 2c, D]: this rank's two chunks (sequence_layout.h) of the queries, keys
// and values; returns this rank's rows of softmax(q k^T / sqrt(D) [causal]) v over the
// whole sequence, [B, H, 2c, D]. Differentiable in q, k and v. Every rank of the group
// calls it together, with the same shapes. float32 or float64, on group->device().
Tensor ring_attention(const Tensor& q, const Tensor& k, const Tensor& v,
                      const std::shared_ptr<ProcessGroup>& group, bool is_causal);

// ring_attention(q, k, v, group, causal) as the GPT's attention hook takes it
// (models::set_attention_function): q, k, v and the attention dropout, which ring
// attention does not have (an mg::Error unless it is 0: train with dropout 0 or eval()).
std::function<Tensor(const Tensor&, const Tensor&, const Tensor&, double)> ring_attention_function(
    std::shared_ptr<ProcessGroup> group, bool is_causal = true);

// The work of rank `rank` at each of the cp ring steps (the same in forward and in
// backward): how many (query chunk, key chunk) pairs it computes in full and how many on
// the diagonal (causal, half the work); the empty pairs are skipped. With the balanced
// layout and a causal mask every rank does 2 full-pair equivalents per step
// (docs/context-parallel.md); without a mask, 4 full pairs.
struct RingStepWork {
  int full = 0, causal = 0;
};
std::vector<RingStepWork> ring_attention_work(int rank, int cp, bool is_causal);

// The message tags ring attention uses on the group (forward blocks, backward blocks,
// backward gradients), kept clear of other users' small tags.
inline constexpr int kRingTagForward = 7001;
inline constexpr int kRingTagBackward = 7002;
inline constexpr int kRingTagGradients = 7003;

}  // namespace mg::parallel::context_parallel
