#include <minigrad/parallel/placement.h>

#include <cstring>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::parallel {

std::string Placement::str() const {
  if (is_replicate()) return "Replicate()";
  return stride == 1 ? fmt::format("Shard({})", dim) : fmt::format("Shard({}, stride {})", dim, stride);
}

std::string DimPlacement::str() const {
  return fmt::format("{}: {}{} (rank {} of {})", dim, placement.str(), partial_gradient ? ", gradient Partial" : "",
                     rank, size);
}

Shape ParameterPiece::placed_shape() const {
  Shape s = shape;
  for (const DimPlacement& p : placements) s = sharded_shape(s, p.placement, p.size);
  return s;
}

bool ParameterPiece::counted_here() const {
  for (const DimPlacement& p : placements)
    if (p.placement.is_replicate() && p.rank != 0) return false;
  return true;
}

std::string ParameterPiece::str() const {
  std::string out = fmt::format("{} {}", name, shape);
  for (const DimPlacement& p : placements) out += ", " + p.str();
  if (flat)
    out += fmt::format(", {}: elements [{}, {}) flat (rank {} of {})", flat->dim, flat->offset,
                       flat->offset + flat->numel, flat->rank, flat->size);
  return out;
}

const ParameterSpec* spec_of(const Tensor& t) {
  return dynamic_cast<const ParameterSpec*>(t.distributed_spec().get());
}

Shape sharded_shape(const Shape& shape, const Placement& placement, int size) {
  if (placement.is_replicate()) return shape;
  const int64_t d = placement.dim;
  MG_CHECK(d >= 0 && d < shape.dim(), "placement: {} of a tensor of shape {}", placement.str(), shape);
  const int64_t parts = placement.stride * size;
  MG_CHECK(placement.stride >= 1 && shape[d] % parts == 0,
           "placement: {} over {} ranks does not divide dimension {} of shape {} ({} is not a multiple of {})",
           placement.str(), size, d, shape, shape[d], parts);
  std::vector<int64_t> sizes = shape.sizes();
  sizes[static_cast<size_t>(d)] = shape[d] / size;
  return Shape(sizes);
}

void record_placement(const Tensor& t, const std::string& name, const Shape& shape, DimPlacement placement) {
  auto spec = std::make_shared<ParameterSpec>();
  if (const ParameterSpec* old = spec_of(t)) {
    MG_CHECK(old->pieces.size() == 1 && !old->pieces[0].flat,
             "record_placement: {} is a flat shard; its pieces are placed when it is made", name);
    *spec = *old;
  } else {
    spec->pieces.push_back({name, shape, {}, std::nullopt});
  }
  ParameterPiece& piece = spec->pieces[0];
  for (const DimPlacement& had : piece.placements)
    if (had.dim == placement.dim) {
      // The same dimension again (a layer and the style that made it both record): one
      // placement, which must agree.
      MG_CHECK(had.placement == placement.placement && had.rank == placement.rank && had.size == placement.size &&
                   had.partial_gradient == placement.partial_gradient,
               "record_placement: {} is placed on {} already as {}; now asked {}", piece.name, had.dim,
               had.str(), placement.str());
      return;
    }
  const Shape placed = sharded_shape(piece.placed_shape(), placement.placement, placement.size);
  MG_CHECK(placed == t.shape(), "record_placement: {} placed as {} would be {} on this rank, but the tensor is {}",
           piece.name, placement.str(), placed, t.shape());
  piece.placements.push_back(std::move(placement));
  t.set_distributed_spec(std::move(spec));
}

void set_spec(const Tensor& t, std::vector<ParameterPiece> pieces) {
  auto spec = std::make_shared<ParameterSpec>();
  spec->pieces = std::move(pieces);
  t.set_distributed_spec(std::move(spec));
}

Tensor shard_tensor(const Tensor& full, const Placement& placement, int rank, int size) {
  if (placement.is_replicate()) return full;
  sharded_shape(full.shape(), placement, size);  // checks that it divides
  const int64_t d = placement.dim, block = full.size(d) / placement.stride, part = block / size;
  if (placement.stride == 1) return ops::narrow(full, d, rank * part, part);
  NoGradGuard no_grad;
  std::vector<Tensor> parts;
  for (int64_t b = 0; b < placement.stride; ++b) parts.push_back(ops::narrow(full, d, b * block + rank * part, part));
  return cat(parts, d);
}

Tensor local_part(const ParameterPiece& piece, const Tensor& full) {
  MG_CHECK(full.shape() == piece.shape, "local_part: {} is {} on one device, got a tensor of {}", piece.name,
           piece.shape, full.shape());
  Tensor t = full;
  for (const DimPlacement& p : piece.placements) t = shard_tensor(t, p.placement, p.rank, p.size);
  if (piece.flat) {
    MG_CHECK(piece.flat->offset >= 0 && piece.flat->numel >= 0 && piece.flat->offset + piece.flat->numel <= t.numel(),
             "local_part: {}: a flat range [{}, +{}) of {} elements", piece.name, piece.flat->offset,
             piece.flat->numel, t.numel());
    t = ops::narrow(ops::view(ops::contiguous(t), Shape{t.numel()}), 0, piece.flat->offset, piece.flat->numel);
  }
  return ops::clone(t);
}

void place_into(Tensor& full, const ParameterPiece& piece, const Tensor& local) {
  MG_CHECK(full.shape() == piece.shape, "place_into: {} is {} on one device, got a tensor of {}", piece.name,
           piece.shape, full.shape());
  NoGradGuard no_grad;
  // The plain case -- shards of stride 1, no flat range -- is a view of `full`.
  bool view_only = !piece.flat;
  for (const DimPlacement& p : piece.placements) view_only = view_only && p.placement.stride == 1;
  if (view_only) {
    Tensor view = full;
    for (const DimPlacement& p : piece.placements) view = shard_tensor(view, p.placement, p.rank, p.size);
    MG_CHECK(view.shape() == local.shape(), "place_into: {}: this rank's part is {}, got {}", piece.name,
             view.shape(), local.shape());
    ops::copy_(view, ops::copy_to(local, full.device()));
    return;
  }
  // Otherwise by element: the numbers of full's elements, taken as local_part takes its
  // values, say where each local element goes.
  const Tensor where = local_part(piece, arange(static_cast<double>(full.numel()), DType::Int64).reshape(piece.shape));
  MG_CHECK(where.numel() == local.numel(), "place_into: {}: this rank's part has {} elements, got {}", piece.name,
           where.numel(), local.numel());
  const std::vector<int64_t> index = where.to_vector<int64_t>();
  Tensor host = ops::clone(ops::copy_to(full, Device::cpu()));
  const Tensor values = ops::contiguous(ops::copy_to(local.to(full.dtype()), Device::cpu()));
  const size_t es = element_size(full.dtype());
  auto* out = static_cast<char*>(host.data_ptr());
  const auto* in = static_cast<const char*>(values.data_ptr());
  for (size_t i = 0; i < index.size(); ++i)
    std::memcpy(out + static_cast<size_t>(index[i]) * es, in + i * es, es);
  ops::copy_(full, ops::copy_to(host, full.device()));
}

}  // namespace mg::parallel
