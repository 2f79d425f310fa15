#include <minigrad/parallel/devices/communicator.h>

#include <algorithm>

#include <fmt/ranges.h>

#include <minigrad/parallel/devices/device_list.h>
#include <minigrad/parallel/devices/host_communicator.h>

namespace mg::parallel {

Communicator::Communicator(std::vector<Device> devices) : devices_(std::move(devices)) {
  MG_CHECK(!devices_.empty(), "Communicator: expected at least one device");
}

void Communicator::check_broadcast(const std::vector<Tensor>& tensors, size_t root) const {
  MG_CHECK(root < size(), "{} broadcast: root {} is not a rank of {}", name(), root,
           device_list_str(devices_));
  for (size_t k = 0; k < tensors.size(); ++k)
    MG_CHECK(tensors[k].device() == devices_[root],
             "{} broadcast: tensor {} is on {}, but the root rank {} is {}", name(), k,
             tensors[k].device(), root, devices_[root]);
}

void Communicator::check_reduce_add(const std::vector<std::vector<Tensor>>& per_rank,
                                    size_t root) const {
  MG_CHECK(root < size(), "{} reduce_add: root {} is not a rank of {}", name(), root,
           device_list_str(devices_));
  MG_CHECK(per_rank.size() == size(),
           "{} reduce_add: got tensors for {} ranks, but the communicator has {} ({})", name(),
           per_rank.size(), size(), device_list_str(devices_));
  const std::vector<Tensor>& reference = per_rank[root];
  for (size_t r = 0; r < size(); ++r) {
    MG_CHECK(per_rank[r].size() == reference.size(),
             "{} reduce_add: rank {} has {} tensors, rank {} has {}", name(), r,
             per_rank[r].size(), root, reference.size());
    for (size_t k = 0; k < reference.size(); ++k) {
      const Tensor& t = per_rank[r][k];
      MG_CHECK(t.device() == devices_[r],
               "{} reduce_add: tensor {} of rank {} is on {}, expected {}", name(), k, r,
               t.device(), devices_[r]);
      MG_CHECK(t.shape() == reference[k].shape() && t.dtype() == reference[k].dtype(),
               "{} reduce_add: tensor {} of rank {} is {} {}, but on rank {} it is {} {}", name(),
               k, r, t.dtype(), t.shape(), root, reference[k].dtype(), reference[k].shape());
    }
  }
}

void Communicator::check_one_per_rank(const char* collective,
                                      const std::vector<Tensor>& per_rank) const {
  MG_CHECK(per_rank.size() == size(),
           "{} {}: got tensors for {} ranks, but the communicator has {} ({})", name(), collective,
           per_rank.size(), size(), device_list_str(devices_));
  for (size_t r = 0; r < size(); ++r) {
    const Tensor& t = per_rank[r];
    MG_CHECK(t.defined(), "{} {}: the tensor of rank {} is undefined", name(), collective, r);
    MG_CHECK(t.device() == devices_[r], "{} {}: the tensor of rank {} is on {}, expected {}",
             name(), collective, r, t.device(), devices_[r]);
    MG_CHECK(t.shape() == per_rank[0].shape() && t.dtype() == per_rank[0].dtype(),
             "{} {}: rank {} has a {} tensor of shape {}, but rank 0 has {} {}", name(),
             collective, r, t.dtype(), t.shape(), per_rank[0].dtype(), per_rank[0].shape());
  }
}

bool nccl_available_for(const std::vector<Device>& devices) {
#ifdef MINIGRAD_WITH_NCCL
  if (devices.size() < 2) return false;
  std::vector<Device> sorted = devices;
  std::sort(sorted.begin(), sorted.end());
  for (size_t i = 0; i < sorted.size(); ++i) {
    if (!sorted[i].is_cuda()) return false;
    if (i > 0 && sorted[i] == sorted[i - 1]) return false;  // NCCL: one rank per GPU
  }
  return true;
#else
  (void)devices;
  return false;
#endif
}

std::shared_ptr<Communicator> communicator_for(const std::vector<Device>& devices) {
#ifdef MINIGRAD_WITH_NCCL
  if (nccl_available_for(devices)) return nccl_communicator(devices);
#endif
  return std::make_shared<HostCommunicator>(devices);
}

}  // namespace mg::parallel
