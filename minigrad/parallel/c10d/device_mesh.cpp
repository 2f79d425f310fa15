#include <minigrad/parallel/c10d/device_mesh.h>

#include <vector>

namespace mg::parallel {

DeviceMesh::DeviceMesh(std::shared_ptr<ProcessGroup> world, int dp, int tp)
    : world_(std::move(world)), dp_(dp), tp_(tp) {
  MG_CHECK(world_ != nullptr, "DeviceMesh: the world process group is null");
  MG_CHECK(dp >= 1 && tp >= 1, "DeviceMesh: dp and tp must be at least 1, got dp={} tp={}", dp, tp);
  MG_CHECK(static_cast<int64_t>(dp) * tp == world_->size(),
           "DeviceMesh: dp={} x tp={} = {} ranks, but the job has {}; the data-parallel size "
           "must be world size / tensor-parallel size",
           dp, tp, static_cast<int64_t>(dp) * tp, world_->size());
  // new_group is collective over the world: every rank makes every group, in this
  // order, and keeps the two it belongs to.
  for (int d = 0; d < dp; ++d) {
    std::vector<int> row;
    for (int t = 0; t < tp; ++t) row.push_back(d * tp + t);
    std::shared_ptr<ProcessGroup> group = world_->new_group(row);
    if (d == dp_rank()) tp_group_ = std::move(group);
  }
  for (int t = 0; t < tp; ++t) {
    std::vector<int> column;
    for (int d = 0; d < dp; ++d) column.push_back(d * tp + t);
    std::shared_ptr<ProcessGroup> group = world_->new_group(column);
    if (t == tp_rank()) dp_group_ = std::move(group);
  }
  MG_CHECK(tp_group_ != nullptr && dp_group_ != nullptr,
           "DeviceMesh: rank {} got no {} group from new_group", world_->rank(),
           tp_group_ == nullptr ? "tensor-parallel" : "data-parallel");
}

std::string DeviceMesh::str() const {
  return fmt::format("DeviceMesh(dp={}, tp={}), rank {} = (dp {}, tp {})", dp_, tp_,
                     world_->rank(), dp_rank(), tp_rank());
}

}  // namespace mg::parallel
