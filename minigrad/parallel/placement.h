// Placements: what one rank's tensor is of the single-device parameter, mesh dimension by
// mesh dimension -- DTensor's placements (torch.distributed.tensor), recorded on tensors
// that stay plain local tensors here (Tensor::distributed_spec).
//
//   Replicate()          every rank of the dimension holds the whole (of what the earlier
//                        dimensions left): DDP's dp, the LayerNorms under tp, a tied copy
//   Shard(dim)           rank r of n holds part r of n equal parts along `dim`
//   Shard(dim, stride s) `dim` is s blocks side by side (c_attn's q, k and v: s = 3), and
//                        rank r holds part r of each block, the s parts stacked (Megatron's
//                        partition_stride): the q, k and v rows of its heads
//   a flat range         elements [offset, offset + numel) of the tensor flattened, at
//                        `local_offset` of this rank's flat tensor: FSDP's and ZeRO's shards,
//                        which hold pieces of several parameters (one ParameterPiece each)
//
// A gradient arrives after backward as its parameter is placed, or Partial: each rank holds
// a share of the sum (sequence parallelism's replicated weights, every parameter under
// context parallelism, a pipeline's tied copies) until reduce_partial_gradients sums it.
//
// Every form records its dimension when it splits (record_placement): the tensor-parallel
// layers (tp), DDP and ZeRO (dp), FSDP's and ZeRO's flat shards (FlatParameter::record_spec),
// context parallelism (cp), a pipeline's tied copies. Everything that must know the split
// reads placements, never names or module types: the one distributed clip (clip_grad.h),
// the sums of partial gradients (partial_gradients.h), the full state dict gathered into the
// single-device names and scattered into any other split (full_state_dict.h,
// full_optimizer_state.h).
//
// Rules every form and every reader keeps:
//   - A tensor without a spec is a whole single-device parameter that no form has split: it
//     counts on every rank that holds it (a pipeline stage's own layers). A replica nobody
//     recorded would count once per rank, so every form that replicates records Replicate
//     (the tensor-parallel layers' replicated biases, parallelize_mlp's layers left whole,
//     DDP, ZeRO).
//   - Names. A layer that splits a parameter does not know where it sits in the model, so it
//     records an empty name; whoever holds the module tree fills it (name_placements over
//     named_parameters(): parallelize_mlp does; a plan's styles name what they place). A name
//     once set is kept: a later record_placement or name_placements never renames a piece.
//     DDP and FSDP name what nobody named with the wrapped module's names (name_placements
//     first when those are not the single device's: a pipeline stage's); ZeRO, given plain
//     tensors, names nothing (its constructor over named parameters names them first). The
//     readers take named tensors, and a piece whose name is still empty takes the name its
//     tensor is given with.
//   - Recording a dimension that the spec already has must agree with it (a layer and the
//     style that made it both record; DDP over an already replicated module); changing one
//     is replace_placement's, explicitly.
//   - A flat shard's pieces keep the placements their parameters had when they were
//     flattened (FSDP x TP: tp Shard), except the flat range's own dimension: a flat shard is
//     not replicated over the ranks that split it.
#pragma once

#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <utility>
#include <vector>

#include <minigrad/core/shape.h>
#include <minigrad/core/tensor.h>

namespace mg::parallel {

class ProcessGroup;

struct Placement {
  enum class Kind { Replicate, Shard };
  Kind kind = Kind::Replicate;
  int64_t dim = 0;     // Shard: the tensor dimension cut
  int64_t stride = 1;  // Shard: blocks along `dim`, each cut in parts (see above)

  static Placement replicate() { return {}; }
  static Placement shard(int64_t dim, int64_t stride = 1) { return {Kind::Shard, dim, stride}; }
  bool is_shard() const { return kind == Kind::Shard; }
  bool is_replicate() const { return kind == Kind::Replicate; }
  bool operator==(const Placement& o) const {
    return kind == o.kind && (kind == Kind::Replicate || (dim == o.dim && stride == o.stride));
  }
  // "Replicate()", "Shard(0)", "Shard(0, stride 3)"
  std::string str() const;
};

// One mesh dimension's placement of a parameter.
struct DimPlacement {
  std::string dim;                      // "dp", "tp", "cp", "pp" (a tied copy's group: "tied")
  std::shared_ptr<ProcessGroup> group;  // this rank's group along it; null in one process
  int rank = 0, size = 1;               // this rank's place in it
  Placement placement;
  bool partial_gradient = false;        // backward leaves a share of the sum on each rank
  std::string str() const;              // "tp: Shard(0) (rank 1 of 2)"
};

// A flat shard's range of a parameter (the parameter as its placements leave it, flattened).
struct FlatRange {
  std::string dim;  // the dimension whose ranks hold the flat shards ("dp")
  std::shared_ptr<ProcessGroup> group;
  int rank = 0, size = 1;
  int64_t offset = 0, numel = 0;  // of the placed parameter, flattened
  int64_t local_offset = 0;       // where the range sits in this rank's flat tensor
};

// What part of one single-device parameter a rank's tensor holds.
struct ParameterPiece {
  std::string name;  // the single-device parameter's name
  Shape shape;       // and its shape
  std::vector<DimPlacement> placements;  // applied in order, each to what the last left
  std::optional<FlatRange> flat;

  // The shape the placements leave (the whole tensor a flat range is taken from).
  Shape placed_shape() const;
  // Whether this rank's copy is the one to count (in a norm) or to send (in a gather):
  // rank 0 of every dimension that replicates it; every holder of a shard.
  bool counted_here() const;
  // "transformer.h.0.attn.c_attn.weight [36, 12]: tp: Shard(0, stride 3) (rank 1 of 2)"
  std::string str() const;
};

struct ParameterSpec : DistributedSpec {
  std::vector<ParameterPiece> pieces;  // one, except in a flat shard
};

// The spec recorded on `t`, or null.
const ParameterSpec* spec_of(const Tensor& t);

// Appends `placement` to the placements of `t`, the single-device parameter `name` (empty
// when the caller does not know it) of shape `shape`. A tensor with a spec already keeps its
// shape and its name (an empty name is filled from `name`). A dimension placed already is
// left as it is when the placement agrees (a layer and the style that made it both record);
// one that disagrees is an mg::Error (replace_placement changes one on purpose). The spec is
// replaced, not changed: a copy of the tensor handle made earlier sees the new one. mg::Error
// also when the placement does not fit (a Shard of a dimension that does not divide, a
// result that is not the tensor's shape), naming the parameter, the placement and the shapes.
void record_placement(const Tensor& t, const std::string& name, const Shape& shape,
                      DimPlacement placement);
// Changes the placement of a dimension `t` has already (a row layer's bias becoming Partial
// when sequence parallelism is switched on), or appends it; checked as record_placement.
void replace_placement(const Tensor& t, DimPlacement placement);
// Replaces the whole spec of `t` (FSDP and ZeRO: a flat shard's pieces).
void set_spec(const Tensor& t, std::vector<ParameterPiece> pieces);
// Records the single-device names: every tensor of `named` (a module's named_parameters(),
// listed under the single-device model's names) whose spec has no name yet gets the name it
// is listed under; one without a spec gets a spec of that name and no placements (still
// whole, now named: FSDP and ZeRO then name its flat pieces so).
void name_placements(const std::vector<std::pair<std::string, Tensor>>& named);

// What the readers iterate: the pieces `t` holds, its spec's, or for a tensor without one a
// single whole piece {name, t.shape()}; an empty piece name becomes `name`.
std::vector<ParameterPiece> pieces_of(const Tensor& t, const std::string& name = "");
// The elements of `local` (the tensor holding `piece`, or a tensor laid out as it is: its
// gradient, an optimizer's state of it) that are the piece: `local` itself, or for a flat
// range a 1-D view of its elements [local_offset, local_offset + numel). Writing into the
// view writes `local`. mg::Error when the range falls outside.
Tensor piece_values(const ParameterPiece& piece, const Tensor& local);

// ---- the arithmetic of a placement ----
// Part `rank` of `size` of `full` under `placement` (a view when it can be one; a copy for
// a strided shard). Replicate: `full` itself.
Tensor shard_tensor(const Tensor& full, const Placement& placement, int rank, int size);
// The shape part `rank` of `size` has: `shape` with the sharded dimension divided.
// mg::Error when it does not divide (or names no dimension), naming `what` (a parameter).
Shape sharded_shape(const Shape& shape, const Placement& placement, int size,
                    const std::string& what = "");
// This rank's part of the single-device tensor `full` (of piece.shape): every placement
// applied in order, then the flat range. A new contiguous tensor, on full's device.
Tensor local_part(const ParameterPiece& piece, const Tensor& full);
// The inverse, for a gather: writes `local` (what local_part gives on the rank that holds
// `piece`, whose placements name that rank; any shape with that many elements) into its
// place in `full`, in place.
void place_into(Tensor& full, const ParameterPiece& piece, const Tensor& local);

}  // namespace mg::parallel
