// Which positions of the sequence each context-parallel rank holds: the load-balanced
// ("zigzag") layout of ring attention with a causal mask.
//
// The global sequence of T positions is cut into 2 * cp chunks of c = T / (2 cp), and
// rank i holds chunks i and 2 cp - 1 - i, side by side: its local sequence is
// [chunk i | chunk 2cp-1-i], 2c positions. Under a causal mask, query chunk a needs key
// chunk b fully when a > b, half (the diagonal, causal) when a == b, and not at all when
// a < b; so a rank holding only early chunks would idle while the rank holding the last
// ones works. Pairing an early chunk with its mirror image gives every rank the same
// amount of attention to compute (docs/context-parallel.md counts the blocks).
//
// cp = 2, T = 8: chunks of 2; rank 0 holds positions 0 1 6 7, rank 1 holds 2 3 4 5.
#pragma once

#include <cstdint>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel::context_parallel {

// The two chunks rank `rank` of `cp` holds, in local order: {rank, 2 cp - 1 - rank}.
std::vector<int64_t> chunks_of_rank(int rank, int cp);

// T / (2 cp), the length of one chunk; an mg::Error naming both sizes when T is not a
// multiple of 2 * cp (`what` names the caller).
int64_t chunk_length(int64_t T, int cp, const char* what);

// This rank's part of x along `dim` (the sequence: 1 for [B, T, ...], 2 for [B, H, T, D]):
// its two chunks, concatenated. Differentiable (narrow and cat); a new tensor.
Tensor shard_sequence(const Tensor& x, int rank, int cp, int64_t dim = 1);

// The inverse, over the group: every rank's shard (all the same shape) gathered and put
// back in global order along `dim`. Every rank gets the whole tensor. Not differentiable
// (for checks and for the trainer's logging).
Tensor gather_sequence(const Tensor& local, ProcessGroup& group, int64_t dim = 1);

// The global positions of this rank's local sequence, int64 [2 c]: what the position
// embedding is taken at (T is the global length).
Tensor sequence_positions(int64_t T, int rank, int cp, Device device = Device::cpu());

}  // namespace mg::parallel::context_parallel
