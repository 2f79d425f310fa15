// FlatParameter: a group of parameters laid end to end in one flat buffer, split into
// world_size equal shards, one per rank. Every ZeRO stage and FSDP build on it.
//
//   parameters   w0 [2, 3]        b0 [2]   w1 [1, 2]            Ψ = 10 elements
//   flat buffer  |0 1 2 3 4 5    |6 7     |8 9     |pad pad|     padded to 12 = 4 x 3
//   4 ranks      |rank 0 |rank 1 |rank 2  |rank 3  |             shard = ceil(10 / 4) = 3
//                 w0[0:3] w0[3:6] b0, w1[0] w1[1], 2 padding
//
// Shards are equal so that reduce_scatter and all_gather move equal blocks; the padding
// at the end (zeros, with zero gradients) makes up the difference. A shard boundary can
// fall inside a tensor (w0 above), and with few elements a rank's shard can be all
// padding (Ψ = 5 on 4 ranks: shards of 2, rank 3 holds only padding).
//
// The parameters themselves are made views of the flat buffer (Tensor::set_data), so the
// module keeps reading them as before, and one collective fills them all:
//   all_gather(full, shard): every rank's shard lands in its slot of every rank's full;
//   reduce_scatter(shard_grad, flat_grads): rank r gets the average over the ranks of
//     elements [r*S, (r+1)*S) of the flattened gradients: its shard of the gradient.
//
// Its shard records the pieces it holds (record_spec), so that the distributed clip and the
// full state dicts read a ZeRO or FSDP shard as they read any other split (placement.h).
//
// Two ways to hold the shard:
//   ShardStorage::ViewOfFull (ZeRO-1/2): every rank keeps the whole flat buffer; the
//     shard is a view of its own slot, so an optimizer stepping the shard updates the
//     parameters' slot in place, and the all-gather fills in the others' slots.
//   ShardStorage::Separate (FSDP): the shard has memory of its own; the flat buffer is
//     allocated only while a unit runs (allocate_full + all_gather) and freed after
//     (free_full), keeping its storage block so that the parameter views (and what
//     autograd saved of them) stay valid across the gap.
//
// Dtypes (mixed precision): the parameters may be any one float dtype (bfloat16 ones under
// ZeRO with float32 master shards: the optimizer over the shards is optim::MasterWeights),
// and everything is then in it. FSDP's MixedPrecisionPolicy (fully_shard.h) splits them:
// the shard keeps the parameters' dtype (float32: it is the master the optimizer steps),
// the flat buffer -- what the parameters are views of, what forward computes with -- is
// `param_dtype` (bfloat16: half the all-gather), filled from the shard rounded; the
// gradients are reduce-scattered in `reduce_dtype` (float32) and land in the shard's
// dtype.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include <minigrad/core/tensor.h>
#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

// Where each parameter sits in the flat buffer and which part of it each rank holds:
// plain arithmetic, checked for overflow.
struct ShardLayout {
  int world_size = 1;
  std::vector<int64_t> numels;   // each parameter's elements
  std::vector<int64_t> offsets;  // where each parameter starts in the flat buffer
  int64_t numel = 0;             // Ψ: the parameters' elements, without padding
  int64_t shard_numel = 0;       // ceil(Ψ / world_size): every rank's shard, padding included

  int64_t padded_numel() const { return shard_numel * world_size; }
  int64_t shard_begin(int rank) const { return shard_numel * rank; }
  // How many elements of rank's shard are parameters (the rest is padding).
  int64_t real_numel(int rank) const;

  // A contiguous piece of one parameter inside one rank's shard.
  struct Piece {
    size_t param;          // index into numels
    int64_t param_offset;  // first element, counted in the flattened parameter
    int64_t shard_offset;  // where it sits in the shard
    int64_t numel;
  };
  // The pieces of rank's shard, in flat order (none for a shard of padding alone).
  std::vector<Piece> pieces(int rank) const;
};

// mg::Error for a world size below 1 or a negative size; sums are overflow-checked.
ShardLayout make_shard_layout(const std::vector<int64_t>& numels, int world_size);

enum class ShardStorage { ViewOfFull, Separate };

// The dtypes of a FlatParameter (FSDP2's MixedPrecisionPolicy): none given, the parameters'.
struct FlatDtypes {
  std::optional<DType> param_dtype;   // the flat buffer's: what forward and backward compute with
  std::optional<DType> reduce_dtype;  // the flat gradients' and their reduce_scatter's
};

class FlatParameter {
 public:
  // Moves `params` (float leaves of one dtype on one device) into a new flat buffer, copying
  // their values (rounded into dtypes.param_dtype when one is given), and makes each a view
  // of its slot; the shard keeps their dtype and exact values (a param_dtype of its own
  // needs ShardStorage::Separate: a view cannot change dtype). `indices` are the parameters' positions
  // among the trainable parameters of the whole model (for state dicts: optimizer state
  // "<name>.<index>"). With ShardStorage::Separate the flat buffer is freed once the
  // shard has been copied out of it.
  FlatParameter(std::vector<Tensor> params, std::vector<size_t> indices, int rank,
                int world_size, ShardStorage storage, FlatDtypes dtypes = {});
  FlatParameter(const FlatParameter&) = delete;
  FlatParameter& operator=(const FlatParameter&) = delete;

  const ShardLayout& layout() const { return layout_; }
  const std::vector<Tensor>& params() const { return params_; }
  const std::vector<size_t>& indices() const { return indices_; }
  // The indices again, among another module's parameters: fully_shard makes a block's unit
  // before the root it will belong to is sharded, and the root numbers it among its own.
  void set_indices(std::vector<size_t> indices);
  int rank() const { return rank_; }

  // The whole flat buffer (layout().padded_numel() elements); the parameters are views
  // of it. With ShardStorage::Separate its memory exists only between allocate_full()
  // and free_full().
  const Tensor& full() const { return full_; }
  // This rank's shard ([shard_numel]): a leaf that requires grad, the tensor an
  // optimizer steps. Its .grad is this rank's shard of the averaged gradient.
  const Tensor& shard() const { return shard_; }

  // ---- ShardStorage::Separate: the flat buffer's memory ----
  bool full_is_allocated() const { return full_.storage().nbytes() > 0; }
  void allocate_full();  // fresh memory, contents undefined until gathered
  void free_full();

  // Starts filling full() with every rank's shard (this rank's included; rounded into the
  // flat buffer's dtype when it differs from the shard's).
  std::shared_ptr<Work> all_gather(ProcessGroup& group) const;
  // The flat gradients' dtype (reduce_dtype, else the flat buffer's) and the flat buffer's.
  DType reduce_dtype() const { return reduce_dtype_; }
  DType param_dtype() const { return full_.dtype(); }

  // Parameter k's slot in `flat`, any tensor laid out as full() is, shaped like the
  // parameter: where its gradient goes in the flat gradients, its state in a flat state.
  Tensor slot(const Tensor& flat, size_t k) const;
  // An uninitialised tensor laid out as full(), with its padding zeroed, in reduce_dtype():
  // to be filled slot by slot (the gradients before their reduce_scatter).
  Tensor new_flat() const;
  // This rank's shard of the parameters' gradients (as flatten_grads() sliced, without
  // building the whole of it): ZeRO-1, where every rank holds the averaged gradients.
  Tensor shard_of_grads() const;
  // Copies this rank's slice of `flat` (a full-sized flat tensor) into the shard.
  void load_shard_from_full(const Tensor& flat);

  // Records on shard() which pieces of which single-device parameters it holds (placement.h):
  // for each parameter with elements in this rank's shard, its name (`names[k]`, unless its
  // spec names it already), its single-device shape and placements (its spec's, but for
  // dimension `dim`'s own: a flat shard is not replicated over the ranks that split it), and
  // the flat range over `dim` (`group`: the ranks of the shards; null in one process).
  void record_spec(const std::vector<std::string>& names, const std::string& dim,
                   std::shared_ptr<ProcessGroup> group) const;

 private:
  std::vector<Tensor> params_;
  std::vector<size_t> indices_;
  int rank_;
  ShardLayout layout_;
  Tensor full_;
  Tensor shard_;
  DType reduce_dtype_ = DType::Float32;
};

}  // namespace mg::parallel
