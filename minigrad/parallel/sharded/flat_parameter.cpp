#include <minigrad/parallel/sharded/flat_parameter.h>

#include <algorithm>

#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/checked_math.h>
#include <minigrad/core/fault_injection.h>
#include <minigrad/core/ops.h>
#include <minigrad/parallel/placement.h>

namespace mg::parallel {

ShardLayout make_shard_layout(const std::vector<int64_t>& numels, int world_size) {
  MG_CHECK(world_size >= 1, "make_shard_layout: world size must be at least 1, got {}",
           world_size);
  ShardLayout layout;
  layout.world_size = world_size;
  layout.numels = numels;
  for (size_t i = 0; i < numels.size(); ++i) {
    MG_CHECK(numels[i] >= 0, "make_shard_layout: parameter {} has {} elements", i, numels[i]);
    layout.offsets.push_back(layout.numel);
    MG_CHECK(!add_overflows(layout.numel, numels[i]),
             "make_shard_layout: {} parameters hold more than 2^63 elements", numels.size());
    layout.numel += numels[i];
  }
  layout.shard_numel = ceil_div(layout.numel, world_size);  // ceil(Ψ / N)
  return layout;
}

int64_t ShardLayout::real_numel(int rank) const {
  const int64_t begin = std::min(shard_begin(rank), numel);
  const int64_t end = std::min(shard_begin(rank) + shard_numel, numel);
  return end - begin;
}

std::vector<ShardLayout::Piece> ShardLayout::pieces(int rank) const {
  std::vector<Piece> out;
  const int64_t begin = shard_begin(rank), end = begin + shard_numel;
  for (size_t i = 0; i < numels.size(); ++i) {
    const int64_t lo = std::max(begin, offsets[i]);
    const int64_t hi = std::min(end, offsets[i] + numels[i]);
    if (lo < hi) out.push_back(Piece{i, lo - offsets[i], lo - begin, hi - lo});
  }
  return out;
}

FlatParameter::FlatParameter(std::vector<Tensor> params, std::vector<size_t> indices, int rank,
                             int world_size, ShardStorage storage, FlatDtypes dtypes)
    : params_(std::move(params)), indices_(std::move(indices)), rank_(rank) {
  MG_CHECK(!params_.empty(), "FlatParameter: expected at least one parameter");
  MG_CHECK(indices_.size() == params_.size(), "FlatParameter: {} indices for {} parameters",
           indices_.size(), params_.size());
  MG_CHECK(rank >= 0 && rank < world_size, "FlatParameter: rank {} is outside [0, {})", rank,
           world_size);
  const Device device = params_[0].device();
  const DType dtype = params_[0].dtype();
  std::vector<int64_t> numels;
  for (size_t i = 0; i < params_.size(); ++i) {
    const Tensor& p = params_[i];
    MG_CHECK(p.is_leaf() && is_floating_point(p.dtype()) && p.dtype() == dtype && p.device() == device,
             "FlatParameter: parameter {} (shape {}, {}, on {}) must be a {} leaf on {} as "
             "parameter 0 is",
             indices_[i], p.shape(), p.dtype(), p.device(), dtype, device);
    numels.push_back(p.numel());
  }
  const DType param_dtype = dtypes.param_dtype.value_or(dtype);
  MG_CHECK(is_floating_point(param_dtype), "FlatParameter: param_dtype {} is not a float dtype", param_dtype);
  MG_CHECK(param_dtype == dtype || storage == ShardStorage::Separate,
           "FlatParameter: param_dtype {} differs from the parameters' {}, which needs ShardStorage::Separate "
           "(a shard that is a view of the flat buffer has its dtype)", param_dtype, dtype);
  reduce_dtype_ = dtypes.reduce_dtype.value_or(param_dtype);
  MG_CHECK(is_floating_point(reduce_dtype_), "FlatParameter: reduce_dtype {} is not a float dtype", reduce_dtype_);
  layout_ = make_shard_layout(numels, world_size);
  MG_CHECK(layout_.numel > 0, "FlatParameter: the parameters hold no elements");

  NoGradGuard no_grad;
  // Laid out in the parameters' own dtype first: the shard takes its exact values.
  Tensor exact = zeros(Shape{layout_.padded_numel()}, dtype, device);  // padding: zeros
  for (size_t i = 0; i < params_.size(); ++i) ops::copy_(slot(exact, i), params_[i]);
  full_ = param_dtype == dtype ? exact : ops::to_dtype(exact, param_dtype);
  for (size_t i = 0; i < params_.size(); ++i) {
    // From here on the parameter is its slot: its old memory goes with the last handle.
    params_[i].set_data(slot(full_, i));
  }
  const Tensor mine = ops::narrow(exact, 0, layout_.shard_begin(rank), layout_.shard_numel);
  shard_ = storage == ShardStorage::ViewOfFull ? mine.detach() : ops::clone(mine);
  shard_.set_requires_grad(true);
  if (storage == ShardStorage::Separate) free_full();
}

void FlatParameter::set_indices(std::vector<size_t> indices) {
  MG_CHECK(indices.size() == params_.size(), "FlatParameter::set_indices: {} indices for {} parameters",
           indices.size(), params_.size());
  indices_ = std::move(indices);
}

// A Storage is a handle to one block shared with every view of it (the parameters,
// autograd's saved tensors): resizing it through this copy resizes it for all of them.
void FlatParameter::allocate_full() {
  Storage storage = full_.storage();
  storage.resize_(full_.nbytes());
}

void FlatParameter::free_full() {
  Storage storage = full_.storage();
  storage.resize_(0);
}

std::shared_ptr<Work> FlatParameter::all_gather(ProcessGroup& group) const {
  MG_CHECK(full_is_allocated(), "FlatParameter::all_gather: the flat buffer is freed; "
                                "allocate_full() first");
  const Tensor shard = shard_.detach();
  return group.all_gather(full_, shard.dtype() == full_.dtype() ? shard : ops::to_dtype(shard, full_.dtype()));
}

Tensor FlatParameter::slot(const Tensor& flat, size_t k) const {
  return ops::view(ops::narrow(flat, 0, layout_.offsets[k], layout_.numels[k]), params_[k].shape());
}

Tensor FlatParameter::new_flat() const {
  Tensor flat = empty(Shape{layout_.padded_numel()}, reduce_dtype_, full_.device());
  const int64_t padding = layout_.padded_numel() - layout_.numel;
  // parity fault: ones in the padding, which then count in the clipping norm.
  const double pad = testing::fault_is_on(testing::Fault::ShardPaddingInArithmetic) ? 1.0 : 0.0;
  if (padding > 0) backend(flat.device()).fill(ops::narrow(flat, 0, layout_.numel, padding), pad);
  return flat;
}

Tensor FlatParameter::shard_of_grads() const {
  Tensor out = zeros(Shape{layout_.shard_numel}, shard_.dtype(), full_.device());
  for (const ShardLayout::Piece& piece : layout_.pieces(rank_)) {
    const Tensor grad = params_[piece.param].grad();
    if (!grad.defined()) continue;
    const Tensor flat_grad = ops::view(ops::contiguous(ops::to_dtype(grad, out.dtype())), Shape{grad.numel()});
    ops::copy_(ops::narrow(out, 0, piece.shard_offset, piece.numel),
               ops::narrow(flat_grad, 0, piece.param_offset, piece.numel));
  }
  return out;
}

void FlatParameter::load_shard_from_full(const Tensor& flat) {
  MG_CHECK(flat.dim() == 1 && flat.numel() == layout_.padded_numel(),
           "FlatParameter::load_shard_from_full: expected a flat tensor of {} elements, got "
           "shape {}",
           layout_.padded_numel(), flat.shape());
  NoGradGuard no_grad;
  ops::copy_(shard_, ops::to_dtype(ops::narrow(flat, 0, layout_.shard_begin(rank_), layout_.shard_numel), shard_.dtype()));
}

void FlatParameter::record_spec(const std::vector<std::string>& names, const std::string& dim,
                                std::shared_ptr<ProcessGroup> group) const {
  MG_CHECK(names.size() == params_.size(), "FlatParameter::record_spec: {} names for {} parameters", names.size(),
           params_.size());
  std::vector<ParameterPiece> pieces;
  for (const ShardLayout::Piece& at : layout_.pieces(rank_)) {
    const std::vector<ParameterPiece> held = pieces_of(params_[at.param], names[at.param]);
    MG_CHECK(held.size() == 1 && !held[0].flat,
             "FlatParameter::record_spec: parameter {} is itself a flat shard ({} pieces); flat shards "
             "are not flattened again",
             indices_[at.param], held.size());
    ParameterPiece piece = held[0];
    std::vector<DimPlacement> kept;
    for (DimPlacement& p : piece.placements)
      if (p.dim != dim) kept.push_back(std::move(p));
    piece.placements = std::move(kept);
    piece.flat = FlatRange{dim, group, rank_, layout_.world_size, at.param_offset, at.numel, at.shard_offset};
    pieces.push_back(std::move(piece));
  }
  set_spec(shard_, std::move(pieces));
}

}  // namespace mg::parallel
