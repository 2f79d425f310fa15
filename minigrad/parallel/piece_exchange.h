// How the full state dicts (full_state_dict.h, full_optimizer_state.h) move the ranks'
// pieces of the single-device tensors and put them back together.
//
// Each rank sends the pieces it counts (ParameterPiece::counted_here: rank 0 of every
// Replicate dimension, every shard and flat range on its holder), each with its values and
// what the receiver needs to place them: the single-device name and shape, the placements
// with their ranks, the flat range. The pieces of a rank travel as one message of bytes
// whose size only that rank knows, so the world all-gathers the sizes first, then the
// messages padded to the largest, as int64 words (the groups carry float32 and int64; the
// bytes are never looked into on the way). Every rank receives every piece: the full dict
// ends on every rank, which costs each rank the memory of the whole model (a sharded
// checkpoint, writing each rank's pieces, is the other way; not here).
//
// assemble_pieces builds each whole tensor from its pieces (place_into) and checks that
// its elements came exactly once: a tensor some of whose elements no rank sent (a shard
// recorded as Replicate: only rank 0's part counted) or whose piece two ranks sent alike
// (a replica recorded as nothing, a tied copy not recorded) is an mg::Error naming the
// tensor, what arrived and from which ranks.
#pragma once

#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

struct PieceValues {
  std::string state;     // "" for a parameter's values; an optimizer state's name ("exp_avg")
  ParameterPiece piece;  // its name is the single-device tensor's (groups do not travel)
  bool whole = false;    // `values` is one value for the whole tensor (Adam's "step"), not placed
  Tensor values;         // the piece's elements in local_part's layout (or the whole value)
  int rank = 0;          // who sent it (set on receipt)
};

// A collective over `world` (two all-gathers): every rank's `mine`, rank by rank, on the
// CPU. `world` null: `mine` alone (every rank is in this process).
std::vector<PieceValues> all_gather_pieces(const std::vector<PieceValues>& mine,
                                           const std::shared_ptr<ProcessGroup>& world);

// (name, state) -> the whole tensor on the CPU, from every piece of it; `op` names the
// caller in messages. Pieces of one tensor must agree on its shape and dtype; whole values
// must be equal (the step of every shard of a parameter).
std::map<std::pair<std::string, std::string>, Tensor> assemble_pieces(const std::vector<PieceValues>& pieces,
                                                                      const char* op);

}  // namespace mg::parallel
