// DeviceMesh: the ranks of a job laid out as a grid with named dimensions, and the process
// group along each dimension, as torch.distributed.device_mesh.init_device_mesh with
// mesh_dim_names. The dimensions are some of dp, pp, cp, tp (data, pipeline, context and
// tensor parallel), always in that order, tp fastest:
//
//     rank = ((dp_rank * pp + pp_rank) * cp + cp_rank) * tp + tp_rank      (Megatron's order)
//
// A dp x tp mesh of 4 ranks:
//
//                 tp ->                    tensor-parallel groups: the rows    {0 1} {2 3}
//     dp   [ 0  1 ]   rank = dp_rank * tp + tp_rank
//      |   [ 2  3 ]                        data-parallel groups: the columns  {0 2} {1 3}
//
// A rank's tensor-parallel group holds the other shards of its layers: their all-reduces
// (two per transformer block, on the critical path of every forward and backward) stay
// inside it. Its data-parallel group holds the ranks with the same shards and other rows of
// the batch: DistributedDataParallel averages the shards' gradients there, once per step,
// overlapped with backward. Tensor-parallel ranks are neighbours (consecutive ranks)
// because a launcher numbers a node's processes consecutively: the chatty groups stay
// inside a node, on its fastest links, and only the data-parallel all-reduce crosses nodes
// (Megatron orders its groups the same way; pp and cp sit between, by how often they talk).
//
// The group of a dimension holds the ranks whose other coordinates equal this rank's:
// group("tp") the ranks differing only in tp_rank, and so on.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include <minigrad/parallel/c10d/process_group.h>

namespace mg::parallel {

struct MeshDim {
  std::string name;  // "dp", "pp", "cp" or "tp"
  int size = 1;
};

class DeviceMesh {
 public:
  // Every rank of `world` calls this with the same dims: names from dp, pp, cp, tp, each at
  // most once, in that order, sizes >= 1 whose product is world->size(); otherwise an
  // mg::Error. It makes every group of every dimension with ProcessGroup::new_group, every
  // rank in the same order (the fastest dimension first), and keeps the ones it belongs
  // to. E.g. DeviceMesh(world, {{"dp", 2}, {"cp", 1}, {"tp", 2}}).
  DeviceMesh(std::shared_ptr<ProcessGroup> world, std::vector<MeshDim> dims);
  // The 2-D mesh {{"dp", dp}, {"tp", tp}}.
  DeviceMesh(std::shared_ptr<ProcessGroup> world, int dp, int tp);

  // By name. A known name (dp, pp, cp, tp) that is not a dimension of this mesh has size
  // 1 and rank 0, so code written for four dimensions runs on fewer; group() of it is an
  // mg::Error (there is no such group: add the dimension with size 1 to get one). Any
  // other name is an mg::Error listing the mesh's dimensions.
  int size(const std::string& dim) const;
  int rank(const std::string& dim) const;
  const std::shared_ptr<ProcessGroup>& group(const std::string& dim) const;
  bool has_dim(const std::string& dim) const;
  const std::vector<MeshDim>& dims() const { return dims_; }

  // The 2-D names: size("dp"), size("tp"), ...
  int dp_size() const { return size("dp"); }
  int tp_size() const { return size("tp"); }
  int dp_rank() const { return rank("dp"); }
  int tp_rank() const { return rank("tp"); }

  const std::shared_ptr<ProcessGroup>& world() const { return world_; }
  // This rank's column: the ranks holding the same shards (dp_size() of them).
  const std::shared_ptr<ProcessGroup>& dp_group() const { return group("dp"); }
  // This rank's row: the ranks sharing its layers (tp_size() of them).
  const std::shared_ptr<ProcessGroup>& tp_group() const { return group("tp"); }

  // "DeviceMesh(dp=2, tp=2), rank 3 = (dp 1, tp 1)"
  std::string str() const;

 private:
  // The index of `dim` in dims_, -1 for a known name that is absent; mg::Error for others.
  int index(const std::string& dim, const char* what) const;

  std::shared_ptr<ProcessGroup> world_;
  std::vector<MeshDim> dims_;
  std::vector<int> coords_;  // this rank's coordinate along each dimension
  std::vector<std::shared_ptr<ProcessGroup>> groups_;  // this rank's group along each
};

}  // namespace mg::parallel
