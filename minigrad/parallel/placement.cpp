#include <minigrad/parallel/placement.h>

#include <cstring>

#include <fmt/format.h>

#include <minigrad/autograd/functions.h>
#include <minigrad/autograd/grad_mode.h>
#include <minigrad/core/ops.h>

namespace mg::parallel {

namespace {

// " of '0.weight'" for messages; nothing for a piece not yet named.
std::string of_name(const std::string& name) { return name.empty() ? std::string() : fmt::format(" of '{}'", name); }

void check_rank(const DimPlacement& p, const std::string& name) {
  MG_CHECK(p.size >= 1 && p.rank >= 0 && p.rank < p.size,
           "placement{} on {}: rank {} of {} (a rank in [0, size) of a group of at least one)", of_name(name),
           p.dim, p.rank, p.size);
}

}  // namespace

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
  for (const DimPlacement& p : placements) s = sharded_shape(s, p.placement, p.size, name);
  return s;
}

bool ParameterPiece::counted_here() const {
  for (const DimPlacement& p : placements)
    if (p.placement.is_replicate() && p.rank != 0) return false;
  return true;
}

std::string ParameterPiece::str() const {
  std::string out = fmt::format("{} {}", name.empty() ? "(unnamed)" : name, shape);
  for (const DimPlacement& p : placements) out += ", " + p.str();
  if (flat)
    out += fmt::format(", {}: elements [{}, {}) flat (rank {} of {})", flat->dim, flat->offset,
                       flat->offset + flat->numel, flat->rank, flat->size);
  return out;
}

const ParameterSpec* spec_of(const Tensor& t) {
  return dynamic_cast<const ParameterSpec*>(t.distributed_spec().get());
}

Shape sharded_shape(const Shape& shape, const Placement& placement, int size, const std::string& what) {
  if (placement.is_replicate()) return shape;
  const int64_t d = placement.dim;
  MG_CHECK(size >= 1, "placement{}: {} over {} ranks", of_name(what), placement.str(), size);
  MG_CHECK(d >= 0 && d < shape.dim(), "placement{}: {} of a tensor of shape {} (no dimension {})", of_name(what),
           placement.str(), shape, d);
  const int64_t parts = placement.stride * size;
  MG_CHECK(placement.stride >= 1 && shape[d] % parts == 0,
           "placement{}: {} over {} ranks does not divide dimension {} of shape {} ({} is not a multiple of {})",
           of_name(what), placement.str(), size, d, shape, shape[d], parts);
  std::vector<int64_t> sizes = shape.sizes();
  sizes[static_cast<size_t>(d)] = shape[d] / size;
  return Shape(sizes);
}

namespace {

// record_placement and replace_placement: what they share but for a dimension placed already.
void place(const Tensor& t, const std::string& name, const Shape& shape, DimPlacement placement, bool replace,
           const char* op) {
  MG_CHECK(t.defined(), "{}{}: the tensor is undefined", op, of_name(name));
  auto spec = std::make_shared<ParameterSpec>();
  if (const ParameterSpec* old = spec_of(t)) {
    MG_CHECK(old->pieces.size() == 1 && !old->pieces[0].flat,
             "{}{}: the tensor is a flat shard ({}); its pieces are placed when it is made", op, of_name(name),
             old->pieces.empty() ? "no pieces" : old->pieces[0].str());
    *spec = *old;
    if (spec->pieces[0].name.empty()) spec->pieces[0].name = name;  // filled, never renamed
  } else {
    spec->pieces.push_back({name, shape, {}, std::nullopt});
  }
  ParameterPiece& piece = spec->pieces[0];
  check_rank(placement, piece.name);
  bool found = false;
  for (DimPlacement& had : piece.placements) {
    if (had.dim != placement.dim) continue;
    found = true;
    // The same dimension again: one placement, which must agree unless it is replaced (in
    // its place in the order).
    MG_CHECK(replace || (had.placement == placement.placement && had.rank == placement.rank &&
                         had.size == placement.size && had.partial_gradient == placement.partial_gradient),
             "{}{}: placed on {} already as {}; now asked {}", op, of_name(piece.name), had.dim, had.str(),
             placement.str());
    had = placement;
  }
  if (!found) piece.placements.push_back(placement);
  const Shape placed = piece.placed_shape();
  MG_CHECK(placed == t.shape(), "{}{}: {} placed as {} would be {} on this rank, but the tensor is {}", op,
           of_name(piece.name), piece.shape, placement.str(), placed, t.shape());
  t.set_distributed_spec(std::move(spec));
}

}  // namespace

void record_placement(const Tensor& t, const std::string& name, const Shape& shape, DimPlacement placement) {
  place(t, name, shape, std::move(placement), false, "record_placement");
}

void replace_placement(const Tensor& t, DimPlacement placement) {
  place(t, "", t.shape(), std::move(placement), true, "replace_placement");
}

void set_spec(const Tensor& t, std::vector<ParameterPiece> pieces) {
  MG_CHECK(t.defined(), "set_spec: the tensor is undefined");
  auto spec = std::make_shared<ParameterSpec>();
  spec->pieces = std::move(pieces);
  t.set_distributed_spec(std::move(spec));
}

void name_placements(const std::vector<std::pair<std::string, Tensor>>& named) {
  for (const auto& [name, t] : named) {
    if (!t.defined()) continue;
    const ParameterSpec* spec = spec_of(t);
    if (spec == nullptr) {
      set_spec(t, {ParameterPiece{name, t.shape(), {}, std::nullopt}});
      continue;
    }
    if (spec->pieces.size() != 1 || spec->pieces[0].flat || !spec->pieces[0].name.empty()) continue;
    auto named_spec = std::make_shared<ParameterSpec>(*spec);
    named_spec->pieces[0].name = name;
    t.set_distributed_spec(std::move(named_spec));
  }
}

std::vector<ParameterPiece> pieces_of(const Tensor& t, const std::string& name) {
  const ParameterSpec* spec = spec_of(t);
  if (spec == nullptr) return {ParameterPiece{name, t.shape(), {}, std::nullopt}};
  std::vector<ParameterPiece> pieces = spec->pieces;
  for (ParameterPiece& p : pieces)
    if (p.name.empty()) p.name = name;
  return pieces;
}

Tensor piece_values(const ParameterPiece& piece, const Tensor& local) {
  MG_CHECK(local.defined(), "piece_values{}: the tensor is undefined", of_name(piece.name));
  if (!piece.flat) {
    MG_CHECK(local.shape() == piece.placed_shape(), "piece_values: {} is {} on this rank, got a tensor of {}",
             piece.str(), piece.placed_shape(), local.shape());
    return local;
  }
  const FlatRange& range = *piece.flat;
  MG_CHECK(range.local_offset >= 0 && range.numel >= 0 && range.local_offset + range.numel <= local.numel(),
           "piece_values: {} sits at [{}, {}) of this rank's flat tensor, which has {} elements", piece.str(),
           range.local_offset, range.local_offset + range.numel, local.numel());
  const Tensor flat = local.dim() == 1 ? local : ops::view(local, Shape{local.numel()});
  return ops::narrow(flat, 0, range.local_offset, range.numel);
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
  MG_CHECK(full.defined() && full.shape() == piece.shape, "local_part: {} is {} on one device, got {}", piece.str(),
           piece.shape, full.defined() ? fmt::format("a tensor of {}", full.shape()) : "an undefined tensor");
  NoGradGuard no_grad;
  Tensor t = full;
  for (const DimPlacement& p : piece.placements) {
    check_rank(p, piece.name);
    sharded_shape(t.shape(), p.placement, p.size, piece.name);  // names the piece when it does not divide
    t = shard_tensor(t, p.placement, p.rank, p.size);
  }
  if (piece.flat) {
    MG_CHECK(piece.flat->offset >= 0 && piece.flat->numel >= 0 && piece.flat->offset + piece.flat->numel <= t.numel(),
             "local_part: {}: a flat range [{}, {}) of {} elements", piece.str(), piece.flat->offset,
             piece.flat->offset + piece.flat->numel, t.numel());
    t = ops::narrow(ops::view(ops::contiguous(t), Shape{t.numel()}), 0, piece.flat->offset, piece.flat->numel);
  }
  return ops::clone(t);
}

void place_into(Tensor& full, const ParameterPiece& piece, const Tensor& local) {
  MG_CHECK(full.defined() && full.shape() == piece.shape, "place_into: {} is {} on one device, got {}", piece.str(),
           piece.shape, full.defined() ? fmt::format("a tensor of {}", full.shape()) : "an undefined tensor");
  MG_CHECK(local.defined() && local.dtype() == full.dtype(), "place_into: {}: a {} part for a {} tensor", piece.str(),
           local.defined() ? fmt::format("{}", local.dtype()) : "undefined", full.dtype());
  NoGradGuard no_grad;
  // Shards of stride 1 are views of `full`; so is a flat range of one that is contiguous.
  bool views = true;
  for (const DimPlacement& p : piece.placements) {
    check_rank(p, piece.name);
    views = views && p.placement.stride == 1;
  }
  if (views) {
    Tensor view = full;
    for (const DimPlacement& p : piece.placements) {
      sharded_shape(view.shape(), p.placement, p.size, piece.name);
      view = shard_tensor(view, p.placement, p.rank, p.size);
    }
    if (piece.flat && view.is_contiguous()) {
      MG_CHECK(piece.flat->offset >= 0 && piece.flat->numel >= 0 &&
                   piece.flat->offset + piece.flat->numel <= view.numel(),
               "place_into: {}: a flat range [{}, {}) of {} elements", piece.str(), piece.flat->offset,
               piece.flat->offset + piece.flat->numel, view.numel());
      view = ops::narrow(ops::view(view, Shape{view.numel()}), 0, piece.flat->offset, piece.flat->numel);
    }
    if (!piece.flat || view.dim() == 1) {
      MG_CHECK(view.numel() == local.numel(), "place_into: {}: this rank's part has {} elements ({}), got {} ({})",
               piece.str(), view.numel(), view.shape(), local.numel(), local.shape());
      ops::copy_(view, ops::view(ops::contiguous(ops::copy_to(local, full.device())), view.shape()));
      return;
    }
  }
  // Otherwise by element: the numbers of full's elements, taken as local_part takes its
  // values, say where each local element goes.
  const Tensor where = local_part(piece, arange(static_cast<double>(full.numel()), DType::Int64).reshape(piece.shape));
  MG_CHECK(where.numel() == local.numel(), "place_into: {}: this rank's part has {} elements, got {}", piece.str(),
           where.numel(), local.numel());
  const std::vector<int64_t> index = where.to_vector<int64_t>();
  Tensor host = ops::clone(ops::copy_to(full, Device::cpu()));
  const Tensor values = ops::contiguous(ops::copy_to(local, Device::cpu()));
  const size_t es = element_size(full.dtype());
  auto* out = static_cast<char*>(host.data_ptr());
  const auto* in = static_cast<const char*>(values.data_ptr());
  for (size_t i = 0; i < index.size(); ++i)
    std::memcpy(out + static_cast<size_t>(index[i]) * es, in + i * es, es);
  ops::copy_(full, ops::copy_to(host, full.device()));
}

}  // namespace mg::parallel
