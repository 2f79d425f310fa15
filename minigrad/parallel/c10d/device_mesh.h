// DeviceMesh: the ranks of a job laid out as a dp x tp grid, and the process group
// along each axis, as torch.distributed.device_mesh.init_device_mesh(("dp", "tp")):
//
//                 tp ->                    tensor-parallel groups: the rows    {0 1} {2 3}
//     dp   [ 0  1 ]   rank = dp_rank * tp + tp_rank
//      |   [ 2  3 ]                        data-parallel groups: the columns  {0 2} {1 3}
//
// A rank's tensor-parallel group holds the other shards of its layers: their all-reduces
// (two per MLP block, on the critical path of every forward and backward) stay inside it.
// Its data-parallel group holds the ranks with the same shards and other rows of the batch:
// DistributedDataParallel averages the shards' gradients there, once per step, overlapped
// with backward. Tensor-parallel ranks are neighbours (consecutive ranks) because a
// launcher numbers a node's processes consecutively: the chatty groups stay inside a node,
// on its fastest links, and only the data-parallel all-reduce crosses nodes (Megatron
// orders its groups the same way).
#pragma once

#include <memory>
#include <string>

#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

class DeviceMesh {
 public:
  // Every rank of `world` calls this, with the same dp and tp (dp * tp == world->size());
  // it makes the groups with ProcessGroup::new_group, every rank in the same order.
  DeviceMesh(std::shared_ptr<ProcessGroup> world, int dp, int tp);

  int dp_size() const { return dp_; }
  int tp_size() const { return tp_; }
  int dp_rank() const { return world_->rank() / tp_; }
  int tp_rank() const { return world_->rank() % tp_; }

  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  // This rank's column: the ranks holding the same shards (dp_size() of them).
  const std::shared_ptr<ProcessGroup>& dp_group() const { return dp_group_; }
  // This rank's row: the ranks sharing its layers (tp_size() of them).
  const std::shared_ptr<ProcessGroup>& tp_group() const { return tp_group_; }

  // "DeviceMesh(dp=2, tp=2), rank 3 = (dp 1, tp 1)"
  std::string str() const;

 private:
  std::shared_ptr<ProcessGroup> world_;
  int dp_, tp_;
  std::shared_ptr<ProcessGroup> dp_group_, tp_group_;
};

}  // namespace mg::parallel
