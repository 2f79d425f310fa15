// DeviceMesh (device_mesh.h): the coordinates of a rank and the sub-groups along each
// named dimension of the grid.
#include <minigrad/parallel/c10d/device_mesh.h>

#include <array>

namespace mg::parallel {
namespace {

// The names a mesh may use, in the order they must appear (slowest first).
constexpr std::array<const char*, 4> kNames{"dp", "pp", "cp", "tp"};

int canonical_position(const std::string& name) {
  for (size_t i = 0; i < kNames.size(); ++i)
    if (name == kNames[i]) return static_cast<int>(i);
  return -1;
}

std::string describe_dims(const std::vector<MeshDim>& dims) {
  std::string out;
  for (const MeshDim& d : dims) out += fmt::format("{}{}={}", out.empty() ? "" : ", ", d.name, d.size);
  return out;
}

// The 2-D constructor's own checks (their messages predate the named mesh).
std::vector<MeshDim> checked_2d(const std::shared_ptr<ProcessGroup>& world, int dp, int tp) {
  MG_CHECK(world != nullptr, "DeviceMesh: the world process group is null");
  MG_CHECK(dp >= 1 && tp >= 1, "DeviceMesh: dp and tp must be at least 1, got dp={} tp={}", dp, tp);
  MG_CHECK(static_cast<int64_t>(dp) * tp == world->size(),
           "DeviceMesh: dp={} x tp={} = {} ranks, but the job has {}; the data-parallel size "
           "must be world size / tensor-parallel size",
           dp, tp, static_cast<int64_t>(dp) * tp, world->size());
  return {{"dp", dp}, {"tp", tp}};
}

}  // namespace

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, int dp, int tp)
    : DeviceMesh(world, checked_2d(world, dp, tp)) {}

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, std::vector<MeshDim> dims)
    : world_(std::move(world)), dims_(std::move(dims)) {
  MG_CHECK(world_ != nullptr, "DeviceMesh: the world process group is null");
  MG_CHECK(!dims_.empty(), "DeviceMesh: no dimensions given (name some of dp, pp, cp, tp)");
  int last = -1;
  int64_t product = 1;
  for (const MeshDim& d : dims_) {
    const int pos = canonical_position(d.name);
    MG_CHECK(pos >= 0, "DeviceMesh({}): unknown dimension '{}'; the names are dp, pp, cp, tp",
             describe_dims(dims_), d.name);
    MG_CHECK(pos > last,
             "DeviceMesh({}): dimension '{}' is repeated or out of order; the dimensions go dp, "
             "pp, cp, tp (tp fastest, as Megatron numbers its ranks)",
             describe_dims(dims_), d.name);
    MG_CHECK(d.size >= 1, "DeviceMesh({}): dimension '{}' must have size at least 1, got {}",
             describe_dims(dims_), d.name, d.size);
    last = pos;
    product *= d.size;
  }
  std::string sizes;
  for (const MeshDim& d : dims_) sizes += fmt::format("{}{}={}", sizes.empty() ? "" : " x ", d.name, d.size);
  MG_CHECK(product == world_->size(),
           "DeviceMesh: {} = {} ranks, but the job has {}; the product of the mesh's sizes must "
           "be the world size",
           sizes, product, world_->size());

  const auto n = static_cast<int>(dims_.size());
  std::vector<int> stride(static_cast<size_t>(n), 1);
  for (int i = n - 2; i >= 0; --i) stride[i] = stride[i + 1] * dims_[i + 1].size;
  const int me = world_->rank();
  coords_.resize(static_cast<size_t>(n));
  for (int i = 0; i < n; ++i) coords_[i] = (me / stride[i]) % dims_[i].size;

  // new_group is collective over the world: every rank makes every group, fastest
  // dimension first, each dimension's lines in increasing order of their first rank.
  groups_.resize(static_cast<size_t>(n));
  for (int i = n - 1; i >= 0; --i) {
    for (int first = 0; first < world_->size(); ++first) {
      if ((first / stride[i]) % dims_[i].size != 0) continue;  // not the start of a line
      std::vector<int> line;
      for (int k = 0; k < dims_[i].size; ++k) line.push_back(first + k * stride[i]);
      std::shared_ptr<ProcessGroup> group = world_->new_group(line);
      if (group != nullptr) groups_[i] = std::move(group);
    }
    MG_CHECK(groups_[i] != nullptr, "DeviceMesh: rank {} got no '{}' group from new_group", me,
             dims_[i].name);
  }
}

int DeviceMesh::index(const std::string& dim, const char* what) const {
  for (size_t i = 0; i < dims_.size(); ++i)
    if (dims_[i].name == dim) return static_cast<int>(i);
  MG_CHECK(canonical_position(dim) >= 0,
           "DeviceMesh::{}('{}'): unknown dimension; this mesh has {} (names: dp, pp, cp, tp)",
           what, dim, describe_dims(dims_));
  return -1;
}

int DeviceMesh::size(const std::string& dim) const {
  const int i = index(dim, "size");
  return i < 0 ? 1 : dims_[i].size;
}

int DeviceMesh::rank(const std::string& dim) const {
  const int i = index(dim, "rank");
  return i < 0 ? 0 : coords_[i];
}

bool DeviceMesh::has_dim(const std::string& dim) const { return index(dim, "has_dim") >= 0; }

const std::shared_ptr<ProcessGroup>& DeviceMesh::group(const std::string& dim) const {
  const int i = index(dim, "group");
  MG_CHECK(i >= 0,
           "DeviceMesh::group('{}'): this mesh ({}) has no '{}' dimension; add it with size 1 "
           "to get a group of one rank",
           dim, describe_dims(dims_), dim);
  return groups_[i];
}

std::string DeviceMesh::str() const {
  std::string coords;
  for (size_t i = 0; i < dims_.size(); ++i)
    coords += fmt::format("{}{} {}", i == 0 ? "" : ", ", dims_[i].name, coords_[i]);
  return fmt::format("DeviceMesh({}), rank {} = ({})", describe_dims(dims_), world_->rank(), coords);
}

}  // namespace mg::parallel
